package sources_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

func ptr[T any](v T) *T { return &v }

// Changing only the burst keeps the rate, cooldown, multiplier and the
// adaptation settings; a new platform needs a rate; bad input writes
// nothing.
func TestConfigurePlatformPartial(t *testing.T) {
	t.Parallel()
	f := setup(t)
	full := sources.Platform{Name: "feeds", RatePerSec: 7, Burst: 2, Cooldown: 20 * time.Minute, MaxMultiplier: 8,
		DecayAfter: 50, BackoffFactor: 2, RecoveryFactor: 1.5, NoProbe: true, NoUseHeaders: true, Adapt: sources.AdaptMultiplier}
	if _, err := sources.SetPlatform(f.ctx, f.pool, full); err != nil {
		t.Fatal(err)
	}
	p, created, err := sources.ConfigurePlatform(f.ctx, f.pool, "feeds", sources.PlatformUpdate{Burst: ptr(3)})
	if err != nil || created {
		t.Fatalf("ConfigurePlatform: %v, created %v", err, created)
	}
	want := full.WithDefaults() // KeyBurst: 1
	want.Burst = 3
	got, err := sources.GetPlatform(f.ctx, f.pool, "feeds")
	if err != nil {
		t.Fatal(err)
	}
	if got != want || p != want {
		t.Fatalf("after --burst 3: %+v (returned %+v), want %+v", got, p, want)
	}
	// The pace row follows (the trigger).
	states, err := pacer.States(f.ctx, f.pool)
	if err != nil || len(states) != 1 || states[0].Burst != 3 || states[0].Rate != 7 {
		t.Fatalf("pace row: %+v, %v; want burst 3, rate 7", states, err)
	}

	// Bad input names the field and writes nothing.
	if _, _, err := sources.ConfigurePlatform(f.ctx, f.pool, "feeds", sources.PlatformUpdate{RatePerSec: ptr(2.0), Burst: ptr(0)}); !errors.Is(err, sources.ErrInvalid) || !strings.Contains(err.Error(), "burst") {
		t.Fatalf("burst 0: %v, want ErrInvalid naming burst", err)
	}
	if got, _ := sources.GetPlatform(f.ctx, f.pool, "feeds"); got != want {
		t.Fatalf("a refused update wrote: %+v", got)
	}

	// A new platform: the rate is required, the rest defaults.
	if _, _, err := sources.ConfigurePlatform(f.ctx, f.pool, "new", sources.PlatformUpdate{Burst: ptr(2)}); !errors.Is(err, sources.ErrInvalid) || !strings.Contains(err.Error(), "rate_per_sec") {
		t.Fatalf("new platform without rate: %v, want ErrInvalid naming rate_per_sec", err)
	}
	if _, err := sources.GetPlatform(f.ctx, f.pool, "new"); !errors.Is(err, sources.ErrNotFound) {
		t.Fatalf("a refused new platform was created: %v", err)
	}
	p, created, err = sources.ConfigurePlatform(f.ctx, f.pool, "new", sources.PlatformUpdate{RatePerSec: ptr(5.0), Burst: ptr(2)})
	if err != nil || !created || p != (sources.Platform{Name: "new", RatePerSec: 5, Burst: 2}).WithDefaults() {
		t.Fatalf("new platform: %+v, created %v, %v", p, created, err)
	}
	if _, _, err := sources.ConfigurePlatform(f.ctx, f.pool, "Bad Name", sources.PlatformUpdate{RatePerSec: ptr(1.0)}); !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("bad name: %v, want ErrInvalid", err)
	}
}

// A platform with sources is deleted only with them; deleting removes its
// sources, history, cooldown and pace row.
func TestDeletePlatform(t *testing.T) {
	t.Parallel()
	f := setup(t, "a", "b")
	id := f.source(t, "a", "https://a.example/1", nil)
	other := f.source(t, "b", "https://b.example/1", nil)
	for _, s := range []int64{id, other} {
		if err := sources.RecordCheck(f.ctx, f.pool, s, sources.Check{Outcome: "ok"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := sources.SetCooldown(f.ctx, f.pool, "a", time.Minute, "stop", 0.5); err != nil {
		t.Fatal(err)
	}
	_, err := sources.DeletePlatform(f.ctx, f.pool, "a", false)
	if !errors.Is(err, sources.ErrHasSources) || !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("delete with sources: %v, want ErrHasSources", err)
	}
	if _, err := sources.GetSource(f.ctx, f.pool, id); err != nil {
		t.Fatalf("a refused delete removed the source: %v", err)
	}
	d, err := sources.DeletePlatform(f.ctx, f.pool, "a", true)
	if err != nil {
		t.Fatal(err)
	}
	if d != (sources.PlatformDeletion{Platform: "a", Sources: 1, History: 1, Cooldown: true}) {
		t.Fatalf("deletion = %+v", d)
	}
	var left int
	if err := f.pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM fleetpace_source WHERE platform = 'a')
		+ (SELECT count(*) FROM fleetpace_check WHERE platform = 'a') + (SELECT count(*) FROM fleetpace_cooldown WHERE platform = 'a')
		+ (SELECT count(*) FROM fleetpace_pace WHERE platform = 'a') + (SELECT count(*) FROM fleetpace_platform WHERE name = 'a')`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d rows of platform a left", left)
	}
	if n := storetest.HistoryRows(t, f.pool, other); n != 1 {
		t.Fatalf("platform b's history: %d rows, want 1", n)
	}
	if _, err := sources.DeletePlatform(f.ctx, f.pool, "a", true); !errors.Is(err, sources.ErrNotFound) {
		t.Fatalf("delete unknown: %v, want ErrNotFound", err)
	}
	// Without sources, no flag is needed.
	f.platform(t, "c", 1)
	if d, err := sources.DeletePlatform(f.ctx, f.pool, "c", false); err != nil || d.Sources != 0 {
		t.Fatalf("delete empty platform: %+v, %v", d, err)
	}
}

// Clearing a cooldown ends it and the pacer's hold at once and forgets the
// escalation: the next cooldown starts from count 1.
func TestClearCooldown(t *testing.T) {
	t.Parallel()
	f := setup(t, "a")
	for range 2 {
		if _, _, err := sources.SetCooldown(f.ctx, f.pool, "a", 0, "stop", 0.5); err != nil {
			t.Fatal(err)
		}
		mustExec(t, f, `UPDATE fleetpace_cooldown SET until = now() - interval '1 second'`) // ended: the next one escalates
	}
	if _, count, err := sources.SetCooldown(f.ctx, f.pool, "a", 600*time.Second, "stop", 0.5); err != nil || count != 3 {
		t.Fatalf("third cooldown: count %d, %v; want 3", count, err)
	}
	c, err := sources.ClearCooldown(f.ctx, f.pool, "a")
	if err != nil || c == nil || c.Count != 3 || c.Remaining < 10*time.Minute {
		t.Fatalf("ClearCooldown = %+v, %v; want the escalated cooldown", c, err)
	}
	cds, err := sources.ActiveCooldowns(f.ctx, f.pool)
	if err != nil || len(cds) != 0 {
		t.Fatalf("active cooldowns after clear: %+v, %v", cds, err)
	}
	states, err := pacer.States(f.ctx, f.pool)
	if err != nil || states[0].Hold != 0 || states[0].PacedBy != pacer.PacedByCeiling {
		t.Fatalf("pace after clear: %+v, %v; want no hold", states, err)
	}
	if _, count, err := sources.SetCooldown(f.ctx, f.pool, "a", 0, "stop", 0.5); err != nil || count != 1 {
		t.Fatalf("cooldown after clear: count %d, %v; want 1 (escalation forgotten)", count, err)
	}
	if c, err := sources.ClearCooldown(f.ctx, f.pool, "a"); err != nil || c == nil {
		t.Fatalf("second clear: %+v, %v", c, err)
	}
	if c, err := sources.ClearCooldown(f.ctx, f.pool, "a"); err != nil || c != nil {
		t.Fatalf("clear without cooldown: %+v, %v; want nil, nil", c, err)
	}
	if _, err := sources.ClearCooldown(f.ctx, f.pool, "nope"); !errors.Is(err, sources.ErrNotFound) {
		t.Fatalf("clear unknown platform: %v, want ErrNotFound", err)
	}
}

// Sources are found by id or URL; a URL on two platforms is ambiguous.
func TestLookup(t *testing.T) {
	t.Parallel()
	f := setup(t, "a", "b")
	id := f.source(t, "a", "https://x.example/1", nil)
	f.source(t, "a", "https://x.example/shared", nil)
	f.source(t, "b", "https://x.example/shared", nil)
	for _, ref := range []string{"https://x.example/1", strings.TrimSpace(" " + itoa(id))} {
		if s, err := sources.Lookup(f.ctx, f.pool, ref); err != nil || s.ID != id {
			t.Fatalf("Lookup(%q) = %d, %v; want %d", ref, s.ID, err, id)
		}
	}
	for ref, want := range map[string]error{
		"https://x.example/shared": sources.ErrAmbiguous, "https://x.example/none": sources.ErrNotFound,
		"999999": sources.ErrNotFound, "0": sources.ErrInvalid, "not a url": sources.ErrInvalid,
	} {
		if _, err := sources.Lookup(f.ctx, f.pool, ref); !errors.Is(err, want) {
			t.Errorf("Lookup(%q): %v, want %v", ref, err, want)
		}
	}
}

func itoa(id int64) string { b, _ := json.Marshal(id); return string(b) }

// UpdateSource changes only what is given; a new interval moves the next
// check of a healthy source.
func TestUpdateSource(t *testing.T) {
	t.Parallel()
	f := setup(t, "a")
	id := f.source(t, "a", "https://x.example/1", dur(0))
	mustExec(t, f, `UPDATE fleetpace_source SET last_checked_at = now() - interval '10 minutes' WHERE id = $1`, id)
	s, err := sources.UpdateSource(f.ctx, f.pool, id, sources.SourceUpdate{Interval: ptr(30 * time.Minute)})
	if err != nil || s.Interval != 30*time.Minute || !s.Enabled {
		t.Fatalf("UpdateSource interval: %+v, %v", s, err)
	}
	if d := time.Until(s.DueAt); d < 19*time.Minute || d > 21*time.Minute {
		t.Fatalf("next check in %s, want 20m (last check 10 min ago + 30m)", d)
	}
	s, err = sources.UpdateSource(f.ctx, f.pool, id, sources.SourceUpdate{Enabled: ptr(false)})
	if err != nil || s.Enabled || s.Interval != 30*time.Minute {
		t.Fatalf("UpdateSource enabled=false: %+v, %v", s, err)
	}
	if _, err := sources.UpdateSource(f.ctx, f.pool, id, sources.SourceUpdate{Interval: ptr(time.Duration(0))}); !errors.Is(err, sources.ErrInvalid) || !strings.Contains(err.Error(), "interval") {
		t.Fatalf("interval 0: %v, want ErrInvalid naming interval", err)
	}
	if _, err := sources.UpdateSource(f.ctx, f.pool, id, sources.SourceUpdate{}); !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("nothing to change: %v, want ErrInvalid", err)
	}
	if _, err := sources.UpdateSource(f.ctx, f.pool, 999999, sources.SourceUpdate{Enabled: ptr(true)}); !errors.Is(err, sources.ErrNotFound) {
		t.Fatalf("unknown id: %v, want ErrNotFound", err)
	}
}

// SetEnabled by ids (all or nothing), by platform, by failures.
func TestSetEnabled(t *testing.T) {
	t.Parallel()
	f := setup(t, "a", "b")
	a1, a2 := f.source(t, "a", "https://a.example/1", nil), f.source(t, "a", "https://a.example/2", nil)
	b1 := f.source(t, "b", "https://b.example/1", nil)
	mustExec(t, f, `UPDATE fleetpace_source SET consecutive_failures = 5 WHERE id = ANY($1)`, []int64{a2, b1})
	enabled := func() map[int64]bool {
		out := map[int64]bool{}
		list, err := sources.ListSources(f.ctx, f.pool, sources.ListFilter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			out[s.ID] = s.Enabled
		}
		return out
	}
	if _, err := sources.SetEnabled(f.ctx, f.pool, sources.Selection{IDs: []int64{a1, 999999}}, false); !errors.Is(err, sources.ErrInvalid) || !strings.Contains(err.Error(), "999999") {
		t.Fatalf("unknown id: %v, want ErrInvalid naming 999999", err)
	}
	if e := enabled(); !e[a1] {
		t.Fatal("a refused disable changed a source")
	}
	if got, err := sources.SetEnabled(f.ctx, f.pool, sources.Selection{MinFailures: 4}, false); err != nil || len(got) != 2 || got[0] != a2 || got[1] != b1 {
		t.Fatalf("disable failing > 3: %v, %v; want a2 and b1", got, err)
	}
	if e := enabled(); !e[a1] || e[a2] || e[b1] {
		t.Fatalf("enabled = %v", e)
	}
	if got, err := sources.SetEnabled(f.ctx, f.pool, sources.Selection{Platform: "a"}, true); err != nil || len(got) != 2 {
		t.Fatalf("enable platform a: %v, %v", got, err)
	}
	if e := enabled(); !e[a1] || !e[a2] || e[b1] {
		t.Fatalf("enabled = %v", e)
	}
	if _, err := sources.SetEnabled(f.ctx, f.pool, sources.Selection{Platform: "nope"}, true); !errors.Is(err, sources.ErrUnknownPlatform) {
		t.Fatalf("unknown platform: %v", err)
	}
	if _, err := sources.SetEnabled(f.ctx, f.pool, sources.Selection{}, true); !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("empty selection: %v, want ErrInvalid", err)
	}
}

// The list filters; and "due now" is one thing: what `sources list --due`
// lists is what the status counts and what the scan queues — not the
// sources of a platform cooling down or paused.
func TestDueIsOneThing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, p := range []string{"cool", "paused", "open"} {
		f.platform(t, p, 10)
		f.source(t, p, "https://"+p+".example/1", nil)
		f.source(t, p, "https://"+p+".example/2", nil)
	}
	if _, _, err := sources.SetCooldown(f.ctx, f.pool, "cool", time.Minute, "stop", 0.5); err != nil {
		t.Fatal(err)
	}
	if err := pacer.Pause(f.ctx, f.pool, "paused", time.Time{}, "maintenance"); err != nil {
		t.Fatal(err)
	}
	list, err := sources.ListSources(f.ctx, f.pool, sources.ListFilter{DueOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]int64{}
	for _, s := range list {
		listed[s.Platform]++
	}
	counts, err := sources.Counts(f.ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counts {
		if c.Due != listed[c.Platform] {
			t.Errorf("platform %s: status counts %d due, sources list --due lists %d", c.Platform, c.Due, listed[c.Platform])
		}
	}
	if listed["open"] != 2 || listed["cool"] != 0 || listed["paused"] != 0 {
		t.Fatalf("listed due = %v, want only open's 2", listed)
	}

	// Failing and outcome filters.
	ids, _ := sources.ListSources(f.ctx, f.pool, sources.ListFilter{Platform: "open"})
	if err := sources.RecordCheck(f.ctx, f.pool, ids[0].ID, sources.Check{Outcome: "failed", Error: "HTTP 500"}); err != nil {
		t.Fatal(err)
	}
	if got, err := sources.ListSources(f.ctx, f.pool, sources.ListFilter{MinFailures: 1}); err != nil || len(got) != 1 || got[0].ID != ids[0].ID {
		t.Fatalf("failing: %+v, %v", got, err)
	}
	if got, err := sources.ListSources(f.ctx, f.pool, sources.ListFilter{Outcome: "failed"}); err != nil || len(got) != 1 {
		t.Fatalf("outcome failed: %+v, %v", got, err)
	}
	counts, _ = sources.Counts(f.ctx, f.pool)
	for _, c := range counts {
		if want := map[string]int64{"open": 1}[c.Platform]; c.Failing != want {
			t.Errorf("platform %s: failing %d, want %d", c.Platform, c.Failing, want)
		}
	}
	if _, err := sources.ListSources(f.ctx, f.pool, sources.ListFilter{Outcome: "boom"}); !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("bad outcome: %v, want ErrInvalid", err)
	}
	if _, err := sources.ListSources(f.ctx, f.pool, sources.ListFilter{Platform: "nope"}); !errors.Is(err, sources.ErrUnknownPlatform) {
		t.Fatalf("unknown platform: %v, want ErrUnknownPlatform", err)
	}
}

// Every duration in the JSON of the store's types is in seconds under a
// key ending in _s, and reads back.
func TestJSONUnits(t *testing.T) {
	t.Parallel()
	values := []any{
		sources.Source{ID: 1, Interval: 90 * time.Second},
		sources.Platform{Name: "p", Cooldown: 15 * time.Minute},
		sources.Cooldown{Platform: "p", Remaining: 30 * time.Second},
		sources.PlatformCounts{Platform: "p", StaleMax: 2 * time.Second, StaleP95: time.Second},
	}
	keys := []string{`"interval_s":90`, `"cooldown_s":900`, `"remaining_s":30`, `"stale_max_s":2`}
	for i, v := range values {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), keys[i]) {
			t.Errorf("%T JSON %s: want %s", v, b, keys[i])
		}
		for _, bad := range []string{`"interval":`, `"cooldown":`, `"remaining":`, `"stale_max":`} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%T JSON %s has a key without its unit, %s", v, b, bad)
			}
		}
	}
	var s sources.Source
	if err := json.Unmarshal([]byte(`{"id":3,"interval_s":90,"url":"https://x"}`), &s); err != nil || s.Interval != 90*time.Second || s.ID != 3 || s.URL != "https://x" {
		t.Fatalf("Source from JSON: %+v, %v", s, err)
	}
	var p sources.Platform
	if err := json.Unmarshal([]byte(`{"name":"p","cooldown_s":60}`), &p); err != nil || p.Cooldown != time.Minute || p.Name != "p" {
		t.Fatalf("Platform from JSON: %+v, %v", p, err)
	}
}
