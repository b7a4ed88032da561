package pacer

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/jackc/pgx/v5/pgxpool"
)

// reportCleanN sends n clean reports (each at once with CleanBatch < 0)
// and returns the last result.
func reportCleanN(t *testing.T, p *Pacer, platform string, n int) ReportResult {
	t.Helper()
	var rep ReportResult
	for range n {
		var err error
		if rep, err = p.Report(context.Background(), platform, Reservation{}, Feedback{Kind: Clean}); err != nil {
			t.Fatal(err)
		}
	}
	return rep
}

// pressure reports rate pressure for a request reserved now.
func pressure(t *testing.T, p *Pacer, platform string, out Feedback) ReportResult {
	t.Helper()
	r, err := p.Reserve(context.Background(), platform, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	out.Kind = Pressure
	rep, err := p.Report(context.Background(), platform, r, out)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

// Probing recovery, step by step: pressure multiplies by the backoff factor
// and remembers where it began; recovery divides by the recovery factor but
// stops 15 % short of that level, then probes in eighth-steps; a multiplier
// well below the remembered level forgets it. The seed's schedule (×2, ÷2,
// no probing) is the other tests' default.
func TestProbingRecovery(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "probe", rate: 1000, decayAfter: 2, backoff: 1.5, recovery: 1.1, probe: true})
	p := newPacer(t, url, func(c *Config) { c.CleanBatch = -1 })

	if rep := pressure(t, p, "probe", Feedback{}); !rep.Increased || !near(rep.Multiplier, 1.5) {
		t.Fatalf("first pressure: %+v, want ×1.5", rep)
	}
	if rep := pressure(t, p, "probe", Feedback{}); !rep.Increased || !near(rep.Multiplier, 2.25) {
		t.Fatalf("second episode: %+v, want ×2.25", rep)
	}
	if row := readAdapt(t, pool, "probe"); !near(row.pressureMult, 1.5) {
		t.Fatalf("remembered %v, want 1.5 (where the second episode began)", row.pressureMult)
	}
	safe := 1.5 * (1 + probeMargin)
	want := []float64{2.25 / 1.1, 2.25 / 1.1 / 1.1, safe} // approach, clamped at the safe level
	step := math.Pow(1.1, 1.0/probeSteps)
	for i := 0; i < 3; i++ {
		want = append(want, safe/math.Pow(step, float64(i+1))) // then probing
	}
	for i, w := range want {
		rep := reportCleanN(t, p, "probe", 2)
		if !rep.Relaxed || !near(rep.Multiplier, w) {
			t.Fatalf("streak %d: %+v, want multiplier %.6f", i+1, rep, w)
		}
	}
	// Far below the remembered level: forgotten, whole steps again.
	if _, err := pool.Exec(context.Background(), `UPDATE fleetpace_pace SET multiplier = 1.5, pressure_mult = 2 WHERE platform = 'probe'`); err != nil {
		t.Fatal(err)
	}
	if rep := reportCleanN(t, p, "probe", 2); !near(rep.Multiplier, 1.5/math.Pow(1.1, 1.0/probeSteps)) {
		t.Fatalf("probing below the memory: %+v", rep)
	}
	if row := readAdapt(t, pool, "probe"); row.pressureMult != 0 {
		t.Fatalf("memory %v kept at a multiplier far below it, want forgotten", row.pressureMult)
	}
	if rep := reportCleanN(t, p, "probe", 2); !near(rep.Multiplier, 1.5/math.Pow(1.1, 1.0/probeSteps)/1.1) {
		t.Fatalf("after forgetting: %+v, want a whole recovery step", rep)
	}
}

type adaptRow struct {
	pressureMult, announcedInterval, announcedUntil, hold, paused float64
	holdReason                                                    string
	seq                                                           int64
}

func readAdapt(t *testing.T, pool *pgxpool.Pool, platform string) adaptRow {
	t.Helper()
	var r adaptRow
	err := pool.QueryRow(context.Background(), `SELECT pressure_mult, announced_interval, announced_until, hold_until, paused_until, hold_reason, event_seq FROM fleetpace_pace WHERE platform = $1`, platform).
		Scan(&r.pressureMult, &r.announcedInterval, &r.announcedUntil, &r.hold, &r.paused, &r.holdReason, &r.seq)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// What a quota implies, for every form a destination sends, and for hostile
// values: never negative, never NaN, never beyond MaxHold.
func TestQuotaSpacing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                string
		q                   ratelimit.Info
		window              time.Duration
		interval, ttl, hold time.Duration
	}{
		{"nothing", ratelimit.Info{}, 0, 0, 0, 0},
		{"strict limiter, next token in 125 ms", ratelimit.Info{Limit: 1, Remaining: 0, HasRemaining: true, Reset: 125 * time.Millisecond, HasReset: true},
			125 * time.Millisecond, 125 * time.Millisecond, time.Second, 125 * time.Millisecond},
		{"fixed window, start", ratelimit.Info{Limit: 600, Remaining: 599, HasRemaining: true, Reset: time.Minute, HasReset: true, Window: time.Minute},
			0, 100 * time.Millisecond, 2 * time.Minute, 0},
		{"fixed window, late with little left: never slower than the window's rate", ratelimit.Info{Limit: 600, Remaining: 10, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
			time.Minute, 100 * time.Millisecond, 90 * time.Second, 0},
		{"fixed window, much left: still the window's rate (a pace that stands still)", ratelimit.Info{Limit: 600, Remaining: 500, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
			time.Minute, 100 * time.Millisecond, 90 * time.Second, 0},
		{"no limit: what is left until the reset", ratelimit.Info{Remaining: 500, HasRemaining: true, Reset: 30 * time.Second, HasReset: true},
			time.Minute, 60 * time.Millisecond, 90 * time.Second, 0},
		{"token bucket half full: its refill rate", ratelimit.Info{Limit: 10, Remaining: 5, HasRemaining: true, Reset: 500 * time.Millisecond, HasReset: true},
			time.Second, 100 * time.Millisecond, 1500 * time.Millisecond, 0},
		{"token bucket nearly empty: its refill rate", ratelimit.Info{Limit: 10, Remaining: 1, HasRemaining: true, Reset: 900 * time.Millisecond, HasReset: true},
			time.Second, 100 * time.Millisecond, 1900 * time.Millisecond, 0},
		{"token bucket nearly full: its refill rate", ratelimit.Info{Limit: 10, Remaining: 9, HasRemaining: true, Reset: 100 * time.Millisecond, HasReset: true},
			time.Second, 100 * time.Millisecond, 1100 * time.Millisecond, 0},
		{"policy only", ratelimit.Info{Limit: 30, Window: time.Minute}, 0, 2 * time.Second, time.Minute, 0},
		{"remaining without reset", ratelimit.Info{Remaining: 0, HasRemaining: true}, 0, 0, 0, 0},
		{"negative remaining", ratelimit.Info{Remaining: -5, HasRemaining: true, Reset: time.Second, HasReset: true}, 0, 0, 0, time.Second},
		{"NaN remaining", ratelimit.Info{Remaining: math.NaN(), HasRemaining: true, Reset: time.Second, HasReset: true}, 0, 0, 0, 0},
		{"huge reset", ratelimit.Info{Remaining: 0, HasRemaining: true, Reset: math.MaxInt64, HasReset: true}, 0, 0, 0, MaxHold},
		{"infinite remaining", ratelimit.Info{Remaining: math.Inf(1), HasRemaining: true, Reset: time.Second, HasReset: true}, 0, 0, 0, 0},
		{"zero reset", ratelimit.Info{Remaining: 3, HasRemaining: true, Reset: 0, HasReset: true}, 0, 0, 0, 0},
		{"negative window", ratelimit.Info{Limit: 10, Window: -time.Second}, 0, 0, 0, 0},
	}
	for _, c := range cases {
		i, ttl, h := spacing(c.q, c.window, 0)
		if c.interval > 0 && c.interval < MaxHold { // the fleet paces at 97 % of the announced rate
			c.interval = secondsToDuration(c.interval.Seconds() / announcedShare)
		}
		if i != c.interval || ttl != c.ttl || h != c.hold {
			t.Errorf("%s: spacing %v ttl %v hold %v, want %v %v %v", c.name, i, ttl, h, c.interval, c.ttl, c.hold)
		}
	}
	// By the slack: room for one keeps the 3 % margin, for 10 a tenth of
	// it, for 600 a six-hundredth; unknown or nonsense slack 3 %.
	for _, c := range []struct {
		slack, share float64
	}{{1, 0.97}, {10, 0.997}, {600, 1 - 0.03/600}, {0.5, 0.97}, {0, 0.97}, {math.Inf(1), 0.97}, {math.NaN(), 0.97}} {
		if got := shareOf(c.slack); math.Abs(got-c.share) > 1e-12 {
			t.Errorf("shareOf(%v) = %v, want %v", c.slack, got, c.share)
		}
	}
	bucket := ratelimit.Info{Limit: 10, Remaining: 5, HasRemaining: true, Reset: 500 * time.Millisecond, HasReset: true}
	if i, _, _ := spacing(bucket, time.Second, 10); i != secondsToDuration(0.1/0.997) {
		t.Errorf("a bucket of 10 per second that showed room for 10: spacing %v, want %v", i, secondsToDuration(0.1/0.997))
	}
	if i, _, _ := spacing(bucket, time.Second, 50); i != secondsToDuration(0.1/0.997) {
		t.Errorf("slack over the limit: spacing %v, want %v (the limit's share)", i, secondsToDuration(0.1/0.997))
	}
	// A strict limiter announcing q=8;w=1 (IETF) answers Remaining 0 every
	// time: room for one, the 3 % margin, whatever its limit says.
	strict := ratelimit.Info{Limit: 8, Window: time.Second, Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true}
	if i, _, _ := spacing(strict, 0, 1); i != secondsToDuration(0.125/announcedShare) {
		t.Errorf("a strict limiter of 8/s that showed room for one: spacing %v, want %v", i, secondsToDuration(0.125/announcedShare))
	}
	if i, _, _ := spacing(ratelimit.Info{Remaining: 500, HasRemaining: true, Reset: 30 * time.Second, HasReset: true}, time.Minute, 501); i != secondsToDuration(0.06/announcedShare) {
		t.Errorf("no limit: spacing %v, want %v (3 %% under)", i, secondsToDuration(0.06/announcedShare))
	}
}

// A destination announcing 5/s under a 20/s ceiling paces the fleet at
// 5/s from the report on; the state says where the rate comes from; with
// the platform's headers off, the same announcement changes nothing.
func TestAnnouncedQuotaPacesTheFleet(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "ann", rate: 20}, platformSpec{name: "deaf", rate: 20, noHeaders: true})
	clk := clocktest.New()
	p := fakePacer(t, url, clk, nil) // slots spaced by the pace alone, however long a reservation takes
	ctx := WithTime(context.Background(), clk.Now())
	five := ratelimit.Info{Limit: 5, Remaining: 4, HasRemaining: true, Reset: time.Second, HasReset: true}
	for _, name := range []string{"ann", "deaf"} {
		r, err := p.Reserve(ctx, name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := p.Report(ctx, name, r, Feedback{Kind: Clean, Quota: five})
		if err != nil || rep.Deferred {
			t.Fatalf("%s: an announcement that slows the platform down is sent at once: %+v %v", name, rep, err)
		}
		var slots []time.Time
		for range 4 {
			r, err := p.Reserve(ctx, name, time.Minute)
			if err != nil || !r.Granted {
				t.Fatalf("%s: %+v %v", name, r, err)
			}
			slots = append(slots, r.Slot)
		}
		want := secondsToDuration(0.2 / shareOf(5)) // 5/s announced, paced at 99.4 %
		if name == "deaf" {
			want = 50 * time.Millisecond
		}
		for k := 1; k < len(slots); k++ {
			if gap := slots[k].Sub(slots[k-1]); gap < want-time.Millisecond || gap > want+time.Millisecond {
				t.Fatalf("%s: slots %v apart, want %v", name, gap, want)
			}
		}
	}
	states, err := States(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		switch s.Platform {
		case "ann":
			if s.PacedBy != PacedByAnnounced || !near(s.AnnouncedRate, 5*shareOf(5)) || !near(s.EffectiveRate, 5*shareOf(5)) || s.AnnouncedFor < time.Second {
				t.Fatalf("announced platform's state: %+v", s)
			}
		case "deaf":
			if s.PacedBy != PacedByCeiling || s.AnnouncedRate != 0 || !near(s.EffectiveRate, 20) {
				t.Fatalf("headers-off platform's state: %+v", s)
			}
		}
	}
}

// The fleet paces an announced quota of 8 per second by the room the
// destination showed: a strict limiter that answers Remaining 0 every time
// at 0.97 of it, a window that answered Remaining 7 at 1 − 0.03/8 of it,
// each the share the statement keeps in the pace row. (By the limit alone
// the strict one was paced at 0.996 of it, and nginx's rule refused 4.4 %
// of such a fleet in bench adapt.)
func TestAnnouncedShareBySlack(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "strict", rate: 20}, platformSpec{name: "window", rate: 20})
	p := newPacer(t, url, nil)
	ctx := context.Background()
	policy := func(remaining float64) ratelimit.Info {
		return ratelimit.Info{Limit: 8, Window: time.Second, Remaining: remaining, HasRemaining: true,
			Reset: time.Second, HasReset: true, Form: ratelimit.IETF}
	}
	for _, c := range []struct {
		platform  string
		remaining []float64
		share     float64
	}{
		{"strict", []float64{0, 0, 0}, announcedShare},
		{"window", []float64{7, 6, 5}, shareOf(8)},
	} {
		for _, rem := range c.remaining {
			r, err := p.Reserve(ctx, c.platform, time.Minute)
			if err != nil || !r.Granted {
				t.Fatalf("%s: %+v %v", c.platform, r, err)
			}
			if _, err := p.Report(ctx, c.platform, r, Feedback{Kind: Clean, Quota: policy(rem)}); err != nil {
				t.Fatal(err)
			}
			p.Flush(ctx)
		}
		if got, want := readAdapt(t, pool, c.platform).announcedInterval, 0.125/c.share; math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: announced spacing %.6f s, want %.6f s (8/s × %.4f)", c.platform, got, want, c.share)
		}
	}
}

// An exhausted quota holds the fleet until it resets, with its reason.
func TestQuotaExhaustedHoldsTheFleet(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "quota", rate: 20})
	p := fakePacer(t, url, clocktest.New(), nil)
	ctx := context.Background()
	r, _ := p.Reserve(ctx, "quota", time.Minute)
	rep, err := p.Report(ctx, "quota", r, Feedback{Kind: Clean,
		Quota: ratelimit.Info{Limit: 100, Remaining: 0, HasRemaining: true, Reset: 2 * time.Second, HasReset: true}})
	if err != nil || !rep.Respaced || rep.Hold < 2*time.Second-time.Millisecond || rep.Hold > 2*time.Second {
		t.Fatalf("exhausted quota: %+v %v, want a 2 s hold", rep, err)
	}
	r, err = p.Reserve(ctx, "quota", 0)
	if err != nil || r.Granted || r.Wait < 2*time.Second-time.Millisecond || r.Paused {
		t.Fatalf("during the hold: %+v %v, want denied for about 2 s", r, err)
	}
	if row := readAdapt(t, pool, "quota"); row.holdReason != "quota exhausted" {
		t.Fatalf("hold reason %q", row.holdReason)
	}
}

// An exhausted quota holds the process that heard it at once, before its
// report reaches the database: with the platform's row locked elsewhere
// (the report waits for it), the process is held already, and a new
// reservation is denied without a round trip. (Seen under load: a worker
// sent its sixth request into a window of five 59 ms after an answer said
// Remaining 0, while its report was on its way.)
func TestQuotaExhaustedHoldsTheProcessAtOnce(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "api", rate: 20})
	p := newPacer(t, url, nil)
	ctx := context.Background()
	r, err := p.Reserve(ctx, "api", time.Minute)
	if err != nil || !r.Granted {
		t.Fatalf("%+v %v", r, err)
	}
	release := lockPlatformRow(t, pool, "api")
	reported := make(chan error, 1)
	go func() {
		_, err := p.Report(ctx, "api", r, Feedback{Kind: Clean,
			Quota: ratelimit.Info{Limit: 5, Remaining: 0, HasRemaining: true, Reset: 2 * time.Second, HasReset: true}})
		reported <- err
	}()
	waitFor(t, "the process held while its report waits for the row", func() bool { return p.heldLocally("api") > time.Second })
	if r, err := p.Reserve(ctx, "api", 0); err != nil || r.Granted {
		t.Fatalf("during the local hold: %+v %v, want denied", r, err)
	}
	select {
	case err := <-reported:
		t.Fatalf("the report returned (%v) with the row locked", err)
	default:
	}
	release()
	if err := <-reported; err != nil {
		t.Fatal(err)
	}
}

// A Retry-After as long as the callers' wait (the bench's workers wait 1 s
// and a strict bucket answers Retry-After: 1) moves every granted slot to
// the hold's end or past the horizon, and each is given back: the next
// reservation takes the hold's end. The cursor used to end a spacing past
// the horizon, and the fleet sent nothing for that spacing after each such
// hold (one request a probe at 8/s). The control (holdCursor off) finds the
// next slot a spacing after the hold (the new spacing: 250 ms, the first
// refusal halving the ceiling's pace).
func TestAHoldToTheHorizonRestartsAtItsEnd(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "api", rate: 8, burst: 1}, platformSpec{name: "control", rate: 8, burst: 1})
	clk := clocktest.New()
	p := fakePacer(t, url, clk, nil)
	control := fakePacer(t, url, clk, nil)
	control.tuning.holdCursor = false
	control.tune = control.tuning.array()
	ctx := context.Background()
	for _, c := range []struct {
		p        *Pacer
		platform string
		gap      time.Duration // the next slot after the hold's end
	}{{p, "api", 0}, {control, "control", time.Second / 4}} {
		var waiting []Reservation
		for range 8 { // a second's worth granted ahead, as far as the callers wait
			r, err := c.p.Reserve(ctx, c.platform, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if r.Granted {
				waiting = append(waiting, r)
			}
		}
		if len(waiting) < 7 {
			t.Fatalf("%s: %d slots granted within a second at 8/s", c.platform, len(waiting))
		}
		rep, err := c.p.Report(ctx, c.platform, waiting[0], Feedback{Kind: Pressure, RetryAfter: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		end := clk.Now().Add(rep.Hold)
		r, err := c.p.Reserve(ctx, c.platform, 2*time.Second)
		if err != nil || !r.Granted {
			t.Fatalf("%s: after the hold: %+v %v", c.platform, r, err)
		}
		if got := r.Slot.Sub(end); got < c.gap-time.Millisecond || got > c.gap+time.Millisecond {
			t.Errorf("%s: next slot %s after the hold's end, want %s", c.platform, got, c.gap)
		}
	}
}

// A worker that sent nothing to the platform for longer than its own last
// announcement lasts (River hands a platform's jobs to whichever process
// fetches them) reads a paced quota's exhaustion by the spacing its request
// was sent at: a strict limiter announcing q=8;w=1 answers Remaining 0 and
// t=1 to every request, and held for that rounded second the process left a
// hole in the fleet's schedule (fleetpace bench adapt's strict-40-ietf,
// 0.94 of its rate). The control: a request sent at the ceiling's spacing,
// before the fleet paced the quota, still holds the process a second.
func TestIdleProcessReadsThePaceItsRequestWasSentAt(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "api", rate: 20, burst: 1})
	clk := clocktest.New()
	idle, busy, early := fakePacer(t, url, clk, nil), fakePacer(t, url, clk, nil), fakePacer(t, url, clk, nil)
	ctx := context.Background()
	quota := func(remaining float64) ratelimit.Info {
		return ratelimit.Info{Limit: 8, Window: time.Second, Remaining: remaining, HasRemaining: true,
			Reset: time.Second, HasReset: true, Form: ratelimit.IETF}
	}
	reserve := func(p *Pacer) Reservation {
		t.Helper()
		r, err := p.Reserve(ctx, "api", time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
		return r
	}
	report := func(p *Pacer, r Reservation, q ratelimit.Info) ReportResult {
		t.Helper()
		rep, err := p.Report(ctx, "api", r, Feedback{Kind: Clean, Quota: q})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	first := reserve(early) // at the ceiling: before anyone knew the quota
	report(idle, reserve(idle), quota(3))
	// The other worker paces the fleet for five seconds; this one sends
	// nothing meanwhile, and its own announcement lapses.
	for range 20 {
		clk.Advance(250 * time.Millisecond)
		report(busy, reserve(busy), quota(3))
	}
	r := reserve(idle)
	if r.Interval < time.Second/8 {
		t.Fatalf("the fleet's spacing %s, want the quota's (at least 125ms)", r.Interval)
	}
	if rep, local := report(idle, r, quota(0)), idle.heldLocally("api"); rep.Hold != 0 || local != 0 {
		t.Fatalf("paced quota exhausted, read by an idle worker: %+v, held locally %s, want no hold", rep, local)
	}
	if local := func() time.Duration { report(early, first, quota(0)); return early.heldLocally("api") }(); local < 900*time.Millisecond {
		t.Fatalf("a request sent at the ceiling's spacing exhausted the quota: held locally %s, want 1s", local)
	}
}

// A quota the fleet already paces (spaced at least window / limit, burst
// 1) holds a second less when an answer exhausts it with a reset in whole
// seconds (rounded up: the true reset is no earlier), so a 1-s window's
// t=1 does not hold the fleet for most of the next window; a fractional
// reset is exact and holds as it is. With a burst that could put more
// than the quota in one window, or before the fleet paced the quota, a
// whole-second reset holds in full (the controls). The process that read
// the answer holds itself alike.
func TestPacedQuotaExhaustionHoldsToTheTrueReset(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "paced", rate: 20, burst: 1}, platformSpec{name: "bursty", rate: 20, burst: 3},
		platformSpec{name: "fresh", rate: 20, burst: 1}, platformSpec{name: "exact", rate: 20, burst: 1})
	p := fakePacer(t, url, clocktest.New(), nil)
	ctx := context.Background()
	reset := time.Second
	quota := func(remaining float64) ratelimit.Info {
		return ratelimit.Info{Limit: 7, Window: time.Second, Remaining: remaining, HasRemaining: true,
			Reset: reset, HasReset: true, Form: ratelimit.IETF}
	}
	report := func(platform string, q ratelimit.Info) ReportResult {
		t.Helper()
		r, _ := p.Reserve(ctx, platform, time.Minute)
		rep, err := p.Report(ctx, platform, r, Feedback{Kind: Clean, Quota: q})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	for _, name := range []string{"paced", "bursty", "exact"} {
		report(name, quota(5))
	}
	// The process that read the answer holds itself by the same rule, at
	// once (held for the rounded reset while the fleet went on, it lost
	// most of the next window: 0.76 of an announced window in bench adapt).
	if rep, local := report("paced", quota(0)), p.heldLocally("paced"); rep.Hold != 0 || local != 0 {
		t.Fatalf("paced quota exhausted: %+v, held locally %s, want no hold", rep, local)
	}
	if rep, local := report("bursty", quota(0)), p.heldLocally("bursty"); rep.Hold < 900*time.Millisecond || local < 900*time.Millisecond {
		t.Fatalf("burst 3 under a quota of 7 per 1 s exhausted: %+v, held locally %s, want a 1 s hold", rep, local)
	}
	if rep, local := report("fresh", quota(0)), p.heldLocally("fresh"); rep.Hold < 900*time.Millisecond || local < 900*time.Millisecond {
		t.Fatalf("quota exhausted before the fleet paced it: %+v, held locally %s, want a 1 s hold", rep, local)
	}
	reset = 700 * time.Millisecond
	if rep, local := report("exact", quota(0)), p.heldLocally("exact"); rep.Hold < 699*time.Millisecond || rep.Hold > 701*time.Millisecond ||
		local < 699*time.Millisecond || local > 701*time.Millisecond {
		t.Fatalf("paced quota exhausted with a fractional reset of 0.7 s: %+v, held locally %s, want a 0.7 s hold", rep, local)
	}
}

// A refusal whose answer says the announced quota ran out is the quota's
// (a request in flight when it ran out, the start's requests sent before
// the first announcement): the hold until its reset answers it, and after
// it the fleet goes on at the announced pace — the estimate stays unset.
// The control, the same refusal without the quota's headers, reads the
// limit: the estimate is cut and the pace falls under the announced one.
// (Cut, a fleet under an announced 1-s window of 7 ran at 0.54 of it for
// half a minute after one refusal at its start, in a simulation.)
func TestQuotaRefusalKeepsTheAnnouncedPace(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "quota", rate: 20, adapt: "estimate"},
		platformSpec{name: "bare", rate: 20, adapt: "estimate"})
	clk := clocktest.New()
	p := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	quota := func(remaining float64) ratelimit.Info {
		return ratelimit.Info{Limit: 7, Window: time.Second, Remaining: remaining, HasRemaining: true,
			Reset: 400 * time.Millisecond, HasReset: true, Form: ratelimit.IETF}
	}
	announce := func(name string) {
		t.Helper()
		r, err := p.Reserve(ctx, name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Report(ctx, name, r, Feedback{Kind: Clean, Quota: quota(5)}); err != nil {
			t.Fatal(err)
		}
	}
	gap := func(name string) time.Duration {
		t.Helper()
		a, err := p.Reserve(ctx, name, time.Minute)
		if err != nil || !a.Granted {
			t.Fatalf("%s: %+v %v", name, a, err)
		}
		b, err := p.Reserve(ctx, name, time.Minute)
		if err != nil || !b.Granted {
			t.Fatalf("%s: %+v %v", name, b, err)
		}
		return b.Slot.Sub(a.Slot)
	}
	announced := secondsToDuration(1 / (7 * shareOf(6))) // Remaining 5 answered: room for 6
	for _, name := range []string{"quota", "bare"} {
		announce(name)
	}
	if rep := pressure(t, p, "quota", Feedback{Quota: quota(0)}); !rep.Quota || rep.Increased || rep.Estimate != 0 || rep.Hold <= 0 {
		t.Fatalf("refused with the quota exhausted: %+v, want held, the estimate unset", rep)
	}
	if rep := pressure(t, p, "bare", Feedback{RetryAfter: time.Second}); rep.Quota || !rep.Increased || rep.Estimate <= 0 {
		t.Fatalf("the control, refused without the quota's headers: %+v, want a cut", rep)
	}
	clk.Advance(2 * time.Second) // both holds are over
	for _, name := range []string{"quota", "bare"} {
		announce(name)
	}
	if g := gap("quota"); g < announced-time.Millisecond || g > announced+time.Millisecond {
		t.Fatalf("after the quota's refusal, slots %v apart, want the announced %v", g, announced)
	}
	if g := gap("bare"); g < announced*3/2 {
		t.Fatalf("the control: after a refusal without headers, slots %v apart, want the estimate's cut under the announced %v", g, announced)
	}
}

// A destination's hostile values cannot hold the fleet beyond MaxHold, nor
// overflow anything.
func TestHostileHoldsAreCapped(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "hostile", rate: 20})
	p := newPacer(t, url, nil)
	rep := pressure(t, p, "hostile", Feedback{RetryAfter: math.MaxInt64,
		Quota: ratelimit.Info{Remaining: 0, HasRemaining: true, Reset: math.MaxInt64, HasReset: true}})
	if rep.Hold > MaxHold || rep.Hold < MaxHold-time.Minute {
		t.Fatalf("hold %v, want capped at %v", rep.Hold, MaxHold)
	}
	r, err := p.Reserve(context.Background(), "hostile", time.Minute)
	if err != nil || r.Granted || r.Wait > MaxHold || r.Wait < MaxHold-time.Minute {
		t.Fatalf("reservation during a capped hold: %+v %v", r, err)
	}
	states, err := States(context.Background(), pool)
	if err != nil || states[0].Hold > MaxHold {
		t.Fatalf("state: %+v %v", states, err)
	}
}

// The heart of immediate reaction: a slow-down reported by one process
// re-spaces the slots another process was granted and is sleeping until,
// through the notification, before they are due — the same stretch the
// shared cursor got, so the next reservation lands after them at the new
// spacing. Without the listener the other process only learns of it at
// its next reservation (the negative control).
func TestSlowdownRespacesGrantedSlots(t *testing.T) {
	t.Parallel()
	for _, pollOnly := range []bool{false, true} {
		name := map[bool]string{false: "listening", true: "poll-only"}[pollOnly]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			url, pool := setup(t)
			// Slots 2 s apart on one fake clock, which the statements read.
			addPlatform(t, pool, platformSpec{name: "resp", rate: 0.5})
			clk := clocktest.New()
			a := fakePacer(t, url, clk, nil)
			b := fakePacer(t, url, clk, func(c *Config) { c.PollOnly = pollOnly })
			ctx := context.Background()
			// b connects its listener with its first reservation.
			var rs []Reservation
			for range 4 {
				r, err := b.Reserve(ctx, "resp", time.Minute)
				if err != nil || !r.Granted {
					t.Fatalf("%+v %v", r, err)
				}
				rs = append(rs, r)
			}
			if !pollOnly {
				waitFor(t, "b's listener", func() bool { return b.Stats().Listening })
			}
			type slept struct {
				k   int
				r   Reservation
				err error
			}
			done := make(chan slept, 3)
			for k := 1; k < 4; k++ {
				go func() {
					r := rs[k]
					err := b.Sleep(ctx, &r)
					done <- slept{k, r, err}
				}()
			}
			clocktest.WaitSleepers(t, clk, 3)
			clk.Advance(100 * time.Millisecond)       // the slow-down comes after the reservations
			rep := pressure(t, a, "resp", Feedback{}) // ×2: 2 s → 4 s
			if !rep.Increased || !rep.Respaced {
				t.Fatalf("pressure: %+v", rep)
			}
			if pollOnly {
				// Nothing tells b until it reserves again; then it catches up.
				if n := b.Stats().Respaced; n != 0 {
					t.Fatalf("poll-only: %d slots re-spaced without a reservation", n)
				}
				if _, err := b.Reserve(ctx, "resp", time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "re-spacing", func() bool { return b.Stats().Respaced == 3 })
			got := make([]Reservation, 4)
			got[0] = rs[0]
			for s := range stepUntil(t, clk, 3, 10*time.Millisecond, done) {
				if s.err != nil {
					t.Fatalf("slot %d: %v", s.k, s.err)
				}
				got[s.k] = s.r
			}
			for k := 2; k < 4; k++ {
				gap := got[k].Slot.Sub(got[k-1].Slot)
				if gap < 3999*time.Millisecond || gap > 4001*time.Millisecond {
					t.Fatalf("re-spaced slots %d and %d are %v apart, want 4 s (was %v)", k-1, k, gap, rs[k].Slot.Sub(rs[k-1].Slot))
				}
				if got[k].Interval != 4*time.Second || !got[k].ReservedAt.After(rs[k].ReservedAt) {
					t.Fatalf("re-spaced slot %d: %+v", k, got[k])
				}
			}
			if pollOnly {
				return // the cursor has moved on by b's catch-up reservation
			}
			next, err := a.Reserve(ctx, "resp", 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if gap := next.Slot.Sub(got[3].Slot); gap < 3999*time.Millisecond {
				t.Fatalf("the next reservation is %v after the last re-spaced slot, want ≥ 4 s: the cursor was not stretched alike", gap)
			}
		})
	}
}

// HoldLeft says how long a hold or a pause lasts, never how far a busy
// platform's next slot is: a job snoozed because its slot lay beyond its
// bound asked for the hold's wake, and the wake brought the platform's
// snoozed jobs back every 200 ms, ahead of every other job, while they
// snoozed again (an integration run: a platform back 16 s after a 5-s
// pause, behind the churn). HeldFor, which riverpace's MaxSleepers acts
// by, counts the backlog too: without it a platform whose jobs wait past
// their bound took the workers from the others (TestAdaptiveGoodputStrict-
// Destination: 0.45 of the allowance beside a busy loop, 0.85 with it).
func TestHoldLeftIsAHoldNotABacklog(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "busy", rate: 1})
	clk := clocktest.New()
	p := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	for i := range 4 {
		if r, err := p.Reserve(ctx, "busy", 10*time.Second); err != nil || !r.Granted {
			t.Fatalf("slot %d: %+v %v", i, r, err)
		}
	}
	r, err := p.Reserve(ctx, "busy", time.Second)
	if err != nil || r.Granted || r.Wait < 3*time.Second {
		t.Fatalf("a slot beyond the bound: %+v %v, want denied, ~4 s away", r, err)
	}
	if left := p.HoldLeft("busy", ""); left != 0 {
		t.Fatalf("HoldLeft of a platform whose next slot is %s away: %s, want 0 (no hold)", r.Wait, left)
	}
	if held := p.HeldFor("busy"); held != r.Wait {
		t.Fatalf("HeldFor of a platform whose next slot is %s away: %s, want until that slot (backlogged)", r.Wait, held)
	}
	if _, err := PauseFor(WithTime(ctx, clk.Now()), pool, "busy", 20*time.Second, ""); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Reserve(ctx, "busy", time.Second); err != nil || r.Granted || !r.Paused {
		t.Fatalf("paused: %+v %v, want denied", r, err)
	}
	for name, d := range map[string]time.Duration{"HoldLeft": p.HoldLeft("busy", ""), "HoldLeft of a key": p.HoldLeft("busy", "k"), "HeldFor": p.HeldFor("busy")} {
		if d < 19*time.Second || d > 20*time.Second {
			t.Fatalf("%s of a platform paused for 20 s: %s", name, d)
		}
	}
}

// A slot re-spaced beyond the caller's max wait is given back, and a pause
// gives every waiting slot back; reservations are then denied as paused
// until Resume.
func TestPauseGivesSlotsBackAndDenies(t *testing.T) {
	t.Parallel()
	// A slot every 2 s: the third lies 4 s ahead in the database's time,
	// so the pause comes before it however slowly this test runs (a slot
	// due within respaceLead of a pause still goes, and the fake clock
	// would never wake it).
	url, pool := setup(t, platformSpec{name: "pause", rate: 0.5})
	clk := clocktest.New()
	p := newPacer(t, url, func(c *Config) { c.Clock = clk })
	ctx := context.Background()
	var r Reservation
	for range 3 {
		var err error
		if r, err = p.Reserve(ctx, "pause", 10*time.Second); err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
	}
	waitFor(t, "listener", func() bool { return p.Stats().Listening })
	done := make(chan error, 1)
	go func() { done <- p.Sleep(ctx, &r) }()
	clocktest.WaitSleepers(t, clk, 1)
	if err := Pause(ctx, pool, "pause", time.Time{}, "maintenance"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrGivenBack) {
			t.Fatalf("a waiting slot when the platform is paused: %v, want ErrGivenBack", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the slot %s ahead was not given back within 30 s of the pause", r.Wait)
	}
	r, err := p.Reserve(ctx, "pause", time.Minute)
	if err != nil || r.Granted || !r.Paused || r.Wait != MaxHold {
		t.Fatalf("while paused: %+v %v, want denied, paused, wait MaxHold", r, err)
	}
	states, err := States(ctx, pool)
	if err != nil || !states[0].PausedIndefinitely || states[0].PauseReason != "maintenance" || states[0].PacedBy != PacedByPause {
		t.Fatalf("state while paused: %+v %v", states, err)
	}
	if err := Resume(ctx, pool, "pause"); err != nil {
		t.Fatal(err)
	}
	if d := p.HoldLeft("pause", ""); d < time.Hour {
		t.Fatalf("HoldLeft while paused until resumed: %s", d)
	}
	if r, err := p.Reserve(ctx, "pause", time.Minute); err != nil || !r.Granted || r.Paused {
		t.Fatalf("after resume: %+v %v", r, err)
	}
	// Resume sends no event: the granted reservation tells this process
	// the pause it heard of is over.
	if d := p.HoldLeft("pause", ""); d != 0 {
		t.Fatalf("HoldLeft after resume and a granted reservation: %s, want 0", d)
	}
	until := time.Now().Add(3 * time.Second)
	if err := Pause(ctx, pool, "pause", until, ""); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Reserve(ctx, "pause", time.Minute); err != nil || r.Granted || !r.Paused || r.Wait > 3*time.Second || r.Wait < 2*time.Second {
		t.Fatalf("timed pause: %+v %v, want denied until it ends", r, err)
	}
	if err := Pause(ctx, pool, "nope", time.Time{}, ""); !errors.Is(err, ErrUnknownPlatform) {
		t.Fatalf("pause of an unknown platform: %v", err)
	}
	if err := ClearHold(ctx, pool, "nope"); !errors.Is(err, ErrUnknownPlatform) {
		t.Fatalf("clear hold of an unknown platform: %v", err)
	}
}

// A process that heard a pause until resumed knows it is over at its next
// granted reservation, plain or a key's (Resume sends no event): HoldLeft
// is 0 again. Kept, the pause left the platform without blocks and held
// for ever in degraded pacing (HoldLeft 2562047 h).
func TestResumeEndsThePauseHeardOf(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "resumed", rate: 100})
	ctx := context.Background()
	for _, key := range []string{"", "k"} {
		p := newPacer(t, url, nil)
		reserve := func() (Reservation, error) {
			if key == "" {
				return p.Reserve(ctx, "resumed", time.Minute)
			}
			return p.ReserveKey(ctx, "resumed", key, time.Minute)
		}
		if r, err := reserve(); err != nil || !r.Granted {
			t.Fatalf("key %q: %+v %v", key, r, err)
		}
		waitFor(t, "listener", func() bool { return p.Stats().Listening })
		if err := Pause(ctx, pool, "resumed", time.Time{}, ""); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the pause heard of", func() bool { return p.HoldLeft("resumed", key) > time.Hour })
		if err := Resume(ctx, pool, "resumed"); err != nil {
			t.Fatal(err)
		}
		// A key's reservation may be denied for a moment (Retry: its next
		// slot is later than the platform's; on a loaded machine the slot
		// read passed while the statement ran): nothing is booked, and
		// AcquireKey reserves again, as a caller must.
		if r, err := p.AcquireKey(ctx, "resumed", key, time.Minute); err != nil || !r.Granted {
			t.Fatalf("key %q after resume: %+v %v", key, r, err)
		}
		if d := p.HoldLeft("resumed", key); d != 0 {
			t.Fatalf("key %q: HoldLeft after resume and a granted reservation: %s, want 0", key, d)
		}
	}
}

// Notifications from another process's report are parsed strictly.
func TestParseEvent(t *testing.T) {
	t.Parallel()
	p, ev, ok := parseEvent("feeds|7|1796054010.685273|0.1|Infinity|1796054015.5|Infinity")
	if !ok || p != "feeds" || ev.seq != 7 || ev.interval != 0.1 || !math.IsInf(ev.shift, 1) || ev.horizon != 1796054015.5 || !math.IsInf(ev.hold, 1) {
		t.Fatalf("parse: %q %+v %v", p, ev, ok)
	}
	for _, bad := range []string{"", "feeds", "feeds|x|1|1|1|1|1", "feeds|1|NaN|1|1|1|1", "|1|1|1|1|1|1", "a|1|1|1|1|1|1|1", "feeds|1|1|1|1|1", "feeds|1|1|1|-1|1|1"} {
		if _, _, ok := parseEvent(bad); ok {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// waitFor polls cond until it holds, failing after 10 s.
// stepUntil advances clk by step whenever a sleeper waits on it, until n
// results came on done, and yields them: callers sleeping on a fake clock
// wake at most step after their time, however long the test takes.
func stepUntil[T any](t *testing.T, clk *clocktest.Fake, n int, step time.Duration, done <-chan T) func(func(T) bool) {
	t.Helper()
	return func(yield func(T) bool) {
		deadline := time.Now().Add(30 * time.Second)
		for got := 0; got < n; {
			select {
			case r := <-done:
				got++
				if !yield(r) {
					return
				}
				continue
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d results within 30 s of stepping the clock", got, n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			err := clk.BlockUntilContext(ctx, n-got)
			cancel()
			if err == nil {
				clk.Advance(step)
			}
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// With respace off (the benchmark's baseline: fleetpace before adaptive
// pacing), a slow-down is no event: granted slots stand, the cursor is not
// stretched, nobody is notified; holds and the multiplier still apply.
func TestRespaceOff(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "old", rate: 20, noRespace: true})
	// One slot per statement on a clock that stands still: a block (taken
	// when round trips are slow) or time passing would move the cursor too.
	p := fakePacer(t, url, clocktest.New(), func(c *Config) { c.MaxBlock = 1 })
	if _, err := p.Reserve(context.Background(), "old", time.Minute); err != nil {
		t.Fatal(err)
	}
	before := readRow(t, pool, "old")
	rep := pressure(t, p, "old", Feedback{RetryAfter: time.Second}) // reserves one more slot
	if after := readRow(t, pool, "old"); after.cursor-before.cursor > 0.051 {
		t.Fatalf("cursor moved %.3fs for one reservation: stretched although respace is off", after.cursor-before.cursor)
	}
	if rep.Respaced || !rep.Increased || rep.Hold < 900*time.Millisecond {
		t.Fatalf("pressure with respace off: %+v, want increased and held, not slowed", rep)
	}
	if row := readAdapt(t, pool, "old"); row.seq != 0 {
		t.Fatalf("event_seq %d, want 0", row.seq)
	}
	// Nor does the process that received the Retry-After hold itself: its
	// granted slots stand (the naive baseline); the row's hold denies new
	// reservations.
	if d := p.heldLocally("old"); d != 0 {
		t.Fatalf("held locally for %s with respace off", d)
	}
}

// In estimating mode a platform that may not slow down at all
// (max_multiplier 1) is at its slowest at the first refusal: the worker
// cools it down (ReportResult.AtMax), as in multiplier mode. One that may
// slow down is not, until a refusal comes at its floor.
func TestEstimateAtMax(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "stiff", rate: 5, maxMult: 1, adapt: "estimate"}, platformSpec{name: "supple", rate: 5, maxMult: 4, adapt: "estimate"})
	clk := clocktest.New()
	p := fakePacer(t, url, clk, nil)
	if rep := pressure(t, p, "stiff", Feedback{}); !rep.AtMax {
		t.Fatalf("stiff: %+v, want AtMax at the first refusal", rep)
	}
	if rep := pressure(t, p, "supple", Feedback{}); rep.AtMax {
		t.Fatalf("supple: %+v, want a slow-down, not AtMax", rep)
	}
}

// State's JSON carries its units in its keys and reads back as written.
func TestStateJSONRoundTrip(t *testing.T) {
	t.Parallel()
	s := State{Platform: "p", Rate: 20, Burst: 2, Multiplier: 1.5, Hold: 1500 * time.Millisecond, HoldReason: "Retry-After",
		Paused: time.Minute, PauseReason: "x", AnnouncedRate: 5, AnnouncedFor: 30 * time.Second, EffectiveRate: 5,
		PacedBy: PacedByAnnounced, CursorAhead: 250 * time.Millisecond, Slowdowns: 3, Probe: true}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"hold_s":1.5`, `"paused_s":60`, `"announced_for_s":30`, `"cursor_ahead_s":0.25`, `"effective_rate_per_sec":5`} {
		if !strings.Contains(string(b), key) {
			t.Fatalf("%s lacks %s", b, key)
		}
	}
	var back State
	if err := json.Unmarshal(b, &back); err != nil || back != s {
		t.Fatalf("round trip: %+v %v, want %+v", back, err, s)
	}
}

// A hold moves granted slots only as far as it must: the earliest waiting
// slot lands at the hold and the rest keep their spacing behind it (not a
// whole hold's length later each).
func TestHoldShiftsGrantedSlotsToTheHold(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "shift", rate: 2})
	clk := clocktest.New()
	b := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	var rs []Reservation
	for range 3 {
		r, err := b.Reserve(ctx, "shift", 10*time.Second)
		if err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
		rs = append(rs, r)
	}
	waitFor(t, "listener", func() bool { return b.Stats().Listening })
	done := make(chan Reservation, 2)
	for k := 1; k < 3; k++ {
		go func() {
			r := rs[k]
			if err := b.Sleep(ctx, &r); err != nil {
				t.Errorf("slot %d: %v", k, err)
			}
			done <- r
		}()
	}
	clocktest.WaitSleepers(t, clk, 2)
	until := rs[0].Slot.Add(2 * time.Second)
	if err := Hold(WithTime(ctx, clk.Now()), pool, "shift", until, "test"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "re-spacing", func() bool { return b.Stats().Respaced == 2 })
	var got []Reservation
	for r := range stepUntil(t, clk, 2, 10*time.Millisecond, done) {
		got = append(got, r)
	}
	if got[0].Slot.After(got[1].Slot) {
		got[0], got[1] = got[1], got[0]
	}
	if d := got[0].Slot.Sub(until); d < -time.Millisecond || d > time.Millisecond {
		t.Fatalf("earliest granted slot %v from the hold, want at the hold (was %v before it)", d, until.Sub(rs[1].Slot))
	}
	if gap := got[1].Slot.Sub(got[0].Slot); gap < 499*time.Millisecond || gap > 501*time.Millisecond {
		t.Fatalf("slots %v apart after the hold, want the spacing, 500 ms", gap)
	}
	if r := readAdapt(t, pool, "shift"); r.holdReason != "test" || r.seq != 1 {
		t.Fatalf("row after the hold: %+v", r)
	}
}

// A hold's event moves the fleet's granted slots so that the earliest on
// the schedule's grid lands at the hold's end. A slot granted within the
// burst's tolerance lies off that grid, a little before its grid point:
// moved by the same shift it would land inside the hold, so it is given
// back instead (its caller reserves again, after the hold). (A loaded
// fleet sent one request 1 ms inside a 5-s Retry-After this way.)
func TestRespacedSlotNeverLandsInsideTheHold(t *testing.T) {
	var p Pacer
	now := time.Unix(100, 0)
	// The hold ends at 105; the grid's first slot after the pivot, 100.10,
	// moves there (shift 4.9); the spacing stays 50 ms.
	ev := event{seq: 1, at: 100, interval: 0.05, shift: 4.9, horizon: math.Inf(1), hold: 105}
	slot := func(at float64) *waiter {
		return &waiter{platform: "p", shared: true, slot: at, interval: 0.05, due: epochToTime(at),
			maxWait: time.Minute, wake: make(chan struct{}, 1)}
	}
	onGrid, offGrid, later := slot(100.10), slot(100.08), slot(100.15)
	for _, w := range []*waiter{onGrid, offGrid, later} {
		p.respace(w, ev, now)
	}
	if onGrid.givenBack || math.Abs(onGrid.slot-105) > 1e-9 {
		t.Errorf("the grid's slot: %+v, want moved to the hold's end, 105", onGrid)
	}
	if later.givenBack || math.Abs(later.slot-105.05) > 1e-9 {
		t.Errorf("the next slot: %+v, want 105.05", later)
	}
	if !offGrid.givenBack {
		t.Errorf("a slot 20 ms off the grid moved to %.3f, inside the hold (until 105): want it given back", offGrid.slot)
	}
}

// ClearHold ends a hold at once: the next reservation goes now, and a slot
// granted for after the hold is given back (its caller reserves again).
func TestClearHoldGoesNow(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "clear", rate: 20})
	clk := clocktest.New()
	p := newPacer(t, url, func(c *Config) { c.Clock = clk })
	ctx := context.Background()
	if _, err := p.Reserve(ctx, "clear", time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "listener", func() bool { return p.Stats().Listening })
	if err := Hold(ctx, pool, "clear", time.Now().Add(5*time.Second), "test"); err != nil {
		t.Fatal(err)
	}
	r, err := p.Reserve(ctx, "clear", time.Minute)
	if err != nil || !r.Granted || r.Wait < 4*time.Second {
		t.Fatalf("during the hold: %+v %v, want a slot after it", r, err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Sleep(ctx, &r) }()
	clocktest.WaitSleepers(t, clk, 1)
	if err := ClearHold(ctx, pool, "clear"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrGivenBack) {
		t.Fatalf("a slot placed after a cleared hold: %v, want ErrGivenBack", err)
	}
	if r, err := p.Reserve(ctx, "clear", 100*time.Millisecond); err != nil || !r.Granted || r.Wait > 100*time.Millisecond {
		t.Fatalf("after ClearHold: %+v %v, want a slot now", r, err)
	}
}

// Late in a fixed window, what is left spread until the reset is the
// slowest reading of the quota there is: the fleet never paces slower than
// the quota's limit per window, the longest any process saw (the shared row
// keeps it). p1 saw a window start (5 per 1 s); p2 sees 1 left, 900 ms
// before the reset, which alone reads 1.1/s (the control).
func TestLateWindowViewDoesNotSlowTheFleet(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "win", rate: 20})
	p1, p2 := newPacer(t, url, nil), newPacer(t, url, nil)
	ctx := context.Background()
	report := func(p *Pacer, q ratelimit.Info) {
		t.Helper()
		r, err := p.Reserve(ctx, "win", time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
		if _, err := p.Report(ctx, "win", r, Feedback{Kind: Clean, Quota: q}); err != nil {
			t.Fatal(err)
		}
		p.Flush(ctx) // a faster announcement waits for the clean batch
	}
	late := ratelimit.Info{Limit: 5, Remaining: 1, HasRemaining: true, Reset: 900 * time.Millisecond, HasReset: true}
	report(p1, ratelimit.Info{Limit: 5, Remaining: 4, HasRemaining: true, Reset: time.Second, HasReset: true})
	report(p2, late)
	if rate := late.Remaining / late.Reset.Seconds(); rate > 1.2 {
		t.Fatalf("the control: what is left until the reset reads %.2f/s, want about 1.1/s", rate)
	}
	row := readAdapt(t, pool, "win")
	if max := 0.2 / announcedShare; row.announcedInterval > max+1e-6 { // p2 saw room for 2 at most
		t.Fatalf("announced spacing %.4f s after p2's report, want ≤ %.4f s (5 per the fleet's 1-s window)", row.announcedInterval, max)
	}
}

// An announced slow-down re-spaces what the fleet already sent in the
// quota's window: a run at the ceiling (20/s) until the first answer says
// 5 per second puts the next slot where 5/s spacing from the run's start
// would, so no 1-s window holds more than the quota and the burst.
func TestAnnouncementRespacesTheRunSoFar(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "run", rate: 20})
	p := newPacer(t, url, nil)
	ctx := context.Background()
	var sent []time.Time
	var last Reservation
	for range 5 { // sent at the old spacing before the answer came back
		r, err := p.Reserve(ctx, "run", time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
		if err := p.Sleep(ctx, &r); err != nil && !errors.Is(err, ErrLate) {
			t.Fatal(err)
		}
		sent, last = append(sent, r.Slot), r
	}
	rep, err := p.Report(ctx, "run", last, Feedback{Kind: Clean,
		Quota: ratelimit.Info{Limit: 5, Remaining: 4, HasRemaining: true, Reset: time.Second, HasReset: true, Window: time.Second}})
	if err != nil || !rep.Respaced {
		t.Fatalf("the announcement is a slow-down: %+v %v", rep, err)
	}
	for range 6 {
		r, err := p.Reserve(ctx, "run", time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
		sent = append(sent, r.Slot)
	}
	// 5 sent, then paced at 5/s × 0.994: the next one at least 5 spacings
	// after the first (the pivot rule alone would put it 1 spacing after
	// the report).
	next := sent[5].Sub(sent[0])
	if min := secondsToDuration(5 * 0.2 / shareOf(5) * 0.95); next < min {
		t.Fatalf("first slot after the announcement %v after the run's first, want ≥ %v: the run's slots were not counted", next, min)
	}
	if n := fakedest.MaxInWindow(sent, time.Second); n > 6 {
		t.Fatalf("%d slots in one second, want ≤ 5 + burst 1: %v", n, sent)
	}
}

// The climb past the estimate is counted in requests under climbRate: a
// destination at 2/s or 1/s is probed after as many requests as one at
// climbRate (a probe costs a refusal), one at or above it after as many
// seconds. The control: without climbRate, 2/s climbs on the clock of 8/s.
// The approach to a bound (a start's bisection) is not slowed: at 2/s it
// reaches 0.9 × the bound when one at climbRate does (slowed, a start at
// 2/s took 48 s), it takes boundApproach, and the climb past the bound is
// slowed again.
func TestSlowClimbCountsRequests(t *testing.T) {
	t.Run("bound", func(t *testing.T) {
		t.Parallel()
		_, pool := setup(t)
		tune := defaultTuning(DefaultLateBudget)
		near := func(bound float64) float64 { return boundCrosses(t, pool, tune, bound/math.Sqrt2, bound, 0.9) }
		past := func(bound float64) float64 { return boundCrosses(t, pool, tune, bound/math.Sqrt2, bound, 1.05) }
		fast, slow := near(tune.climbRate), near(2)
		a := tune.boundApproach.Seconds()
		if math.Abs(slow-fast) > 0.1 || fast > a {
			t.Errorf("0.9 × a bound of 2/s after %.2f s, of %g/s after %.2f s: want the same, within the approach (%s)", slow, tune.climbRate, fast, tune.boundApproach)
		}
		// The approach to a bound ends after boundApproach, whatever that
		// is, not after a reading's approach.
		for _, d := range []time.Duration{tune.boundApproach, tune.approach / 3} {
			tu := tune
			tu.boundApproach = d
			if end := boundCrosses(t, pool, tu, 10/math.Sqrt2, 10, (1-tu.margin)*0.999); end < 0.85*d.Seconds() || end > d.Seconds() {
				t.Errorf("the approach to a bound ends %.2f s after the estimate, want within boundApproach (%s) and near it", end, d)
			}
		}
		if climbFast, climbSlow := past(tune.climbRate)-a, past(2)-a; math.Abs(climbSlow*2-climbFast*tune.climbRate) > 0.05*climbFast*tune.climbRate {
			t.Errorf("past a bound of 2/s %.2f s after the approach, of %g/s %.2f s: want as many requests", climbSlow, tune.climbRate, climbFast)
		}
	})
	t.Parallel()
	_, pool := setup(t)
	probeAt := func(tune tuning, est float64) float64 { return paceCrosses(t, pool, tune, est, 1.05) }
	tune := defaultTuning(DefaultLateBudget)
	fast, slow, slower := probeAt(tune, 8), probeAt(tune, 2), probeAt(tune, 1)
	if atRate := probeAt(tune, tune.climbRate); math.Abs(atRate-fast) > 0.1 {
		t.Fatalf("probe at %.2f s at %g/s and %.2f s at 8/s: at or above climbRate the climb is in seconds", atRate, tune.climbRate, fast)
	}
	for _, c := range []struct{ rate, at float64 }{{2, slow}, {1, slower}} {
		if reqs, want := c.at*c.rate, fast*tune.climbRate; math.Abs(reqs-want) > 0.05*want {
			t.Errorf("at %g/s the probe comes after %.0f requests (%.1f s), want %.0f (as at %g/s)", c.rate, reqs, c.at, want, tune.climbRate)
		}
	}
	tune.climbRate = 0
	if control := probeAt(tune, 2); math.Abs(control-fast) > 0.1 {
		t.Fatalf("control: without climbRate the probe at 2/s comes at %.2f s, want %.2f (as at 8/s)", control, fast)
	}
}

// A quota without an announced window is paced per the longest Reset seen,
// rounded up to the next whole second when it falls short of one by at
// most a tenth (a fixed window's first answer, seen after its start);
// a token bucket's refill time is kept as it is.
func TestWholeWindow(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ seen, want time.Duration }{
		{953 * time.Millisecond, time.Second},
		{time.Second, time.Second},
		{59200 * time.Millisecond, time.Minute},
		{125 * time.Millisecond, 125 * time.Millisecond}, // capacity 1 at 8/s
		{833 * time.Millisecond, 833 * time.Millisecond}, // capacity 10 at 12/s
		{0, 0},
	} {
		if got := wholeWindow(c.seen); got != c.want {
			t.Errorf("wholeWindow(%s) = %s, want %s", c.seen, got, c.want)
		}
	}
}
