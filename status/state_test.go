package status_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
)

// Each state is named for what it is, in words, most constraining first;
// 429s in the last minute show between holds too, so a destination that
// answers 429 steadily never shows "running".
func TestConditions(t *testing.T) {
	t.Parallel()
	p := sources.Platform{Name: "feeds", RatePerSec: 7, Cooldown: 15 * time.Minute, MaxMultiplier: 16}
	minute := func(checks map[fetch.Outcome]int64) status.Recent {
		return status.Recent{Window: time.Minute, Checks: checks}
	}
	ceiling := pacer.State{Rate: 7, EffectiveRate: 7, Multiplier: 1, MaxMultiplier: 16, PacedBy: pacer.PacedByCeiling, Adapt: sources.AdaptEstimate}
	with := func(f func(*pacer.State)) pacer.State { s := ceiling; f(&s); return s }
	for _, tt := range []struct {
		name     string
		pace     pacer.State
		cd       *sources.Cooldown
		recent   status.Recent
		inFlight int
		want     []string // String() of each condition
		level    string
	}{
		{"running", ceiling, nil, minute(map[fetch.Outcome]int64{"ok": 400}), 0, []string{"running"}, status.LevelOK},
		{"429s between holds", ceiling, nil, minute(map[fetch.Outcome]int64{"ok": 40, "rate_pressure": 6}),
			0, []string{"429s: 6 in the last minute"}, status.LevelSlowed},
		{"holding for Retry-After", with(func(s *pacer.State) {
			s.Hold, s.HoldReason, s.PacedBy = 7*time.Second, "Retry-After", pacer.PacedByHold
		}), nil,
			minute(map[fetch.Outcome]int64{"rate_pressure": 1}), 0, []string{"holding for Retry-After, 7s left", "429s: 1 in the last minute"}, status.LevelStopped},
		{"throttled", with(func(s *pacer.State) {
			s.Adapt, s.Multiplier, s.PacedBy, s.EffectiveRate = sources.AdaptMultiplier, 5.1, pacer.PacedByBackoff, 7/5.1
		}), nil,
			minute(nil), 0, []string{"throttled ×5.1"}, status.LevelSlowed},
		{"backing off", with(func(s *pacer.State) { s.Estimate, s.Multiplier, s.PacedBy = 6.1, 7/5.9, pacer.PacedByBackoff }), nil,
			minute(nil), 0, []string{"backing off: estimate 6.1/s"}, status.LevelSlowed},
		{"learned window", with(func(s *pacer.State) {
			s.Estimate, s.Multiplier, s.PacedBy, s.Window, s.WindowQuota, s.EffectiveRate = 6.1, 7/5.9, pacer.PacedByWindow, 10*time.Second, 20, 2
		}), nil, minute(nil), 0, []string{"paced by a window: 20 per 10s"}, status.LevelSlowed},
		{"hanging", ceiling, nil, minute(nil), 4, []string{"waiting: 4 request(s) in flight, none answered in the last minute"}, status.LevelSlowed},
		{"answering slowly", ceiling, nil, minute(map[fetch.Outcome]int64{"ok": 3}), 4, []string{"running"}, status.LevelOK},
		{"paused", with(func(s *pacer.State) { s.Paused, s.PauseReason, s.PacedBy = 4*time.Minute, "deploy", pacer.PacedByPause }), nil,
			minute(nil), 0, []string{"paused by operator, 4m left"}, status.LevelStopped},
		{"cooling down", with(func(s *pacer.State) {
			s.Hold, s.HoldReason, s.PacedBy = 13*time.Minute, "cooldown: x", pacer.PacedByHold
		}),
			&sources.Cooldown{Platform: "feeds", Remaining: 13*time.Minute + 30*time.Second, Count: 1, Cause: sources.CauseSlowestPace, RetryAfter: 10 * time.Second, Reason: "HTTP 429"},
			minute(map[fetch.Outcome]int64{"rate_limited": 1}), 0, []string{"cooling down: max multiplier reached, 13m30s left", "429s: 1 in the last minute"}, status.LevelStopped},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cs := status.Conditions(p, tt.pace, tt.cd, tt.recent, tt.inFlight)
			var got []string
			for _, c := range cs {
				got = append(got, c.String())
			}
			if strings.Join(got, " | ") != strings.Join(tt.want, " | ") || status.Level(cs) != tt.level {
				t.Errorf("conditions = %q (level %s), want %q (level %s)", got, status.Level(cs), tt.want, tt.level)
			}
			if tt.cd != nil && !strings.Contains(cs[0].Detail, "a 10s Retry-After came while the platform was paced as slowly as it may be (ceiling ÷ max multiplier) → the platform's 15m cooldown") {
				t.Errorf("the cooldown's detail does not say which rule applied: %q", cs[0].Detail)
			}
		})
	}
}

// The report says how much of its pace each platform used over the last
// minute, its 429s per minute and its fetches in flight fleet-wide (the
// workers' heartbeats summed), and what it is doing in words.
func TestReadUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t, sources.Platform{Name: "p", RatePerSec: 8})
	id := storetest.Source(t, pool, sources.NewSource{Platform: "p", URL: "https://p.example/1"})
	for _, c := range []sources.Check{{Outcome: "ok", Status: 200}, {Outcome: "rate_pressure", Status: 429, Error: "HTTP 429, Retry-After 10s"},
		{Outcome: "rate_pressure", Status: 429, Error: "HTTP 429, Retry-After 10s"}} {
		if err := sources.RecordCheck(ctx, pool, id, c); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range []int{2, 3} {
		if _, err := pool.Exec(ctx, `INSERT INTO fleetpace_worker (id, in_flight) VALUES ($1, jsonb_build_object('p', $2::int))`, "w"+string(rune('1'+i)), n); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := status.Read(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	u := rep.Platforms[0].Use
	if u.UsedPerSec != 3.0/60 || u.RefusedPerMin != 2 || u.InFlight != 5 || u.CeilingPerSec != 8 || u.EffectivePerSec != 8 {
		t.Errorf("use = %+v; want 3 fetches a minute, 2 429s a minute, 5 in flight, of 8/s", u)
	}
	if got := u.Text(); got != "0.05 of 8/s" {
		t.Errorf("use = %q, want 0.05 of 8/s", got)
	}
	if st := rep.Platforms[0].State; len(st) != 1 || st[0].Kind != status.KindRefused {
		t.Errorf("state = %+v; want the 429s", st)
	}
}
