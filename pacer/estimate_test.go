package pacer

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A process that receives a Retry-After holds at once, before its report
// reaches the database: none of its slots goes inside the hold and its new
// reservations are denied without a round trip, while the report itself
// still waits for the row (locked here by another transaction). A slot
// that comes meanwhile waits for the report's answer; once the report
// lands, the hold is the fleet's, and the report's answer has moved the
// process's slots past the hold with the fleet's other slots: they are kept
// and go there — not given back, which left holes in the fleet's schedule
// after the hold.
func TestRetryAfterHoldsTheProcessAtOnce(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "held", rate: 2, adapt: "estimate"})
	clk := clocktest.New()
	p := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	start := clk.Now()
	first, err := p.Reserve(ctx, "held", time.Minute)
	if err != nil || !first.Granted {
		t.Fatalf("%+v %v", first, err)
	}
	sleep := func() (*Reservation, chan error) {
		r, err := p.Reserve(ctx, "held", time.Minute)
		if err != nil || !r.Granted || r.Wait <= 0 {
			t.Fatalf("%+v %v", r, err)
		}
		slept := make(chan error, 1)
		go func() { slept <- p.Sleep(ctx, &r) }()
		return &r, slept
	}
	_, early := sleep() // 500 ms out
	late, lateSlept := sleep()
	clocktest.WaitSleepers(t, clk, 2)

	// Another transaction holds the pace row: the report cannot land yet.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT 1 FROM fleetpace_pace WHERE platform = 'held' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	reported := make(chan ReportResult, 1)
	go func() {
		r, err := p.Report(ctx, "held", first, Feedback{Kind: Pressure, RetryAfter: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		reported <- r
	}()
	waitFor(t, "the process held while its report waits for the row", func() bool { return p.heldLocally("held") > 9*time.Second })
	// The early slot comes while the report is on its way: it waits.
	clk.Advance(600 * time.Millisecond)
	waitFor(t, "the early slot waiting for the report's answer", func() bool { return p.gated.Load() >= 1 })
	select {
	case err := <-early:
		t.Fatalf("the early slot went (%v) inside the hold", err)
	default:
	}
	r, err := p.Reserve(ctx, "held", time.Second)
	if err != nil || r.Granted || r.Wait < 9*time.Second {
		t.Fatalf("a reservation during the local hold: %+v %v, want denied for ~10 s", r, err)
	}
	select {
	case <-reported:
		t.Fatal("the report landed while the row was locked")
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rep := <-reported; rep.Hold < 9*time.Second {
		t.Fatalf("the fleet-wide hold after the report: %+v", rep)
	}
	other := fakePacer(t, url, clk, nil)
	if r, err := other.Reserve(ctx, "held", time.Second); err != nil || r.Granted {
		t.Fatalf("another process during the hold: %+v %v, want denied", r, err)
	}

	// Both slots were moved past the hold, a spacing apart, and kept.
	clocktest.WaitSleepers(t, clk, 2)
	var dues []time.Time
	p.mu.Lock()
	for w := range p.local["held"].waiters {
		if w.givenBack {
			t.Errorf("a slot was given back: a hole after the hold")
		}
		dues = append(dues, w.due)
	}
	held := p.local["held"].held
	p.mu.Unlock()
	slices.SortFunc(dues, time.Time.Compare)
	if len(dues) != 2 || dues[0].Before(held) || dues[0].Sub(start) > 11*time.Second || dues[1].Sub(dues[0]) < 400*time.Millisecond {
		t.Fatalf("slots due %v, want two, the first at the hold's end (%s after the start), a spacing apart",
			dues, held.Sub(start))
	}
	for i, slept := range []chan error{early, lateSlept} {
		clk.Advance(dues[i].Sub(clk.Now()))
		if err := <-slept; err != nil {
			t.Fatalf("slot %d, moved past the hold: %v, want sent", i, err)
		}
	}
	if late.Slot.Sub(start) < 10*time.Second {
		t.Fatalf("the later slot went at %s, inside the hold", late.Slot.Sub(start))
	}
}

// The fleet finds a destination's limit: three processes of twenty callers
// under a 30/s ceiling, against limiters allowing a third of it or less,
// settle near what each allows over seconds 20–90 with few refusals (the
// floors leave room for a loaded machine; bench adapt measures the figures),
// and never put more than ceiling + burst into a second. The seed's
// schedule (a multiplier ×2, ÷2 per 100 clean answers) is the control: on
// the same strict limiter it delivers less.
func TestEstimateFindsTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	for _, m := range []struct {
		name   string
		rule   fakedest.Rule
		floor  float64 // goodput over 20–90 s
		most   float64 // refused share over 20–90 s
		adapt  string
		weaker bool // the control: must stay under the estimate's figure
	}{
		{"strict-12", fakedest.Rule{Rate: 12, Strict: true, RetryAfter: fakedest.NoRetryAfter}, 0.85, 0.03, "", false},
		{"bucket-15-burst10", fakedest.Rule{Rate: 15, Burst: 10}, 0.85, 0.03, "", false},
		{"window-1s-10", fakedest.Rule{Window: time.Second, WindowLimit: 10}, 0.8, 0.03, "", false},
		{"window-10s-30", fakedest.Rule{Window: 10 * time.Second, WindowLimit: 30}, 0.85, 0.03, "", false},
		{"sliding-10s-100", fakedest.Rule{Window: 10 * time.Second, WindowLimit: 100, Sliding: true}, 0.8, 0.03, "", false},
		{"bucket-10-burst1-retry-after", fakedest.Rule{Rate: 10, Burst: 1}, 0.8, 0.03, "", false},
		{"window-1s-8-announced", fakedest.Rule{Window: time.Second, WindowLimit: 8, Headers: fakedest.XRateLimit}, 0.95, 0.005, "", false},
		// IETF fields on a fixed window: t= is in whole seconds. (Held for
		// the rounded reset, the process that read r=0 lost most of the
		// next window: 0.82–0.86 here.)
		{"window-1s-7-ietf", fakedest.Rule{Window: time.Second, WindowLimit: 7, Headers: fakedest.IETF}, 0.95, 0.005, "", false},
		{"window-1s-10-ietf", fakedest.Rule{Window: time.Second, WindowLimit: 10, Headers: fakedest.IETF}, 0.95, 0.005, "", false},
		{"strict-12-seed", fakedest.Rule{Rate: 12, Strict: true, RetryAfter: fakedest.NoRetryAfter}, 0, 1, "multiplier", true},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			r := runSim(t, simConfig{procs: 3, callers: 20, rate: 30, adapt: m.adapt, rule: m.rule,
				duration: 90 * time.Second, latency: 20 * time.Millisecond, seed: 1})
			allow := allowance(m.rule)
			good, refused := r.goodput(20*time.Second, 90*time.Second, allow), r.refusedShare(20*time.Second, 90*time.Second)
			t.Logf("%s: %s\n%s", m.name, r, r.timeline())
			if w := r.maxWindow(); w > 31 {
				t.Errorf("%d requests in one second, over the ceiling + burst (31)", w)
			}
			if m.weaker {
				if good >= 0.9 {
					t.Errorf("the control delivered %.3f of the allowance: it does not show the estimate's gain", good)
				}
				return
			}
			if good < m.floor || refused > m.most {
				t.Errorf("goodput %.3f (want ≥ %.2f), refused %.2f%% (want ≤ %.1f%%) over 20–90 s", good, m.floor, 100*refused, 100*m.most)
			}
		})
	}
}

// An announced quota with room for many requests is paced at all but 3 % ÷
// that room of it: a bucket of 10 with a burst of 10 (X-RateLimit-*) and
// fixed windows of 67 per 10 s and 7 per 1 s (IETF fields, t= in whole
// seconds) give the fleet at least 0.985 of what they allow over seconds
// 20–90, with at most 0.5 % refused. The control, 3 % under every announced
// rate, stays under 0.975 on each: the share is what the gain is.
func TestAnnouncedShareByRoom(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	rules := map[string]fakedest.Rule{
		"bucket-10-burst10-xrl": {Rate: 10, Burst: 10, Headers: fakedest.XRateLimit},
		"window-10s-67-ietf":    {Window: 10 * time.Second, WindowLimit: 67, Headers: fakedest.IETF},
		"window-1s-7-ietf":      {Window: time.Second, WindowLimit: 7, Headers: fakedest.IETF},
	}
	for name, rule := range rules {
		for _, byLimit := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/byLimit=%v", name, byLimit), func(t *testing.T) {
				t.Parallel()
				r := runSim(t, simConfig{procs: 3, callers: 20, rate: 30, rule: rule,
					duration: 90 * time.Second, latency: 20 * time.Millisecond, seed: 1,
					tune: func(tu *tuning) { tu.shareBySlack = byLimit }})
				good, refused := r.goodput(20*time.Second, 90*time.Second, allowance(rule)), r.refusedShare(20*time.Second, 90*time.Second)
				t.Logf("%s: %s", name, r)
				if w := r.maxWindow(); w > 31 {
					t.Errorf("%d requests in one second, over the ceiling + burst (31)", w)
				}
				switch {
				case !byLimit && good >= 0.975:
					t.Errorf("the control delivered %.3f of the allowance: it does not show the share's gain", good)
				case byLimit && (good < 0.985 || refused > 0.005):
					t.Errorf("goodput %.3f (want ≥ 0.985), refused %.2f%% (want ≤ 0.5%%) over 20–90 s", good, 100*refused)
				}
			})
		}
	}
}

// A cold start against a bucket of 8/s (capacity 1, Retry-After: 1) under a
// ceiling of 20/s: the first refusal halves the ceiling's pace, and a
// refusal right after a decrease bounds the limit instead of reading it,
// so the approach bisects instead of climbing back to where it was
// refused. Over three seeds the fleet reaches 0.85 of the limit for 5 s
// within 7 s of the start, in the median (the bar is 10 s in the
// benchmark; single runs read 4.0–5.5 s). The control, without the start's
// rules (no restart, no bisection, the held floor at half of an estimate
// already cut), reaches it later in the median (12–13 s; one run in 20
// read 5.5 s).
func TestEstimateStartsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	rule := fakedest.Rule{Rate: 8, Burst: 1}
	run := func(rules bool) time.Duration {
		var reach []time.Duration
		for seed := uint64(1); seed <= 3; seed++ {
			r := runSim(t, simConfig{procs: 3, callers: 20, rate: 20, rule: rule,
				duration: 40 * time.Second, latency: 20 * time.Millisecond, seed: seed,
				tune: func(tu *tuning) {
					if !rules {
						tu.restart, tu.bisect, tu.heldFloor = 1, false, 0.5
					}
				}})
			at := r.settled(8, 0.85) - 5*time.Second
			if at < 0 {
				at = time.Hour // never
			}
			reach = append(reach, at)
			t.Logf("start rules %v, seed %d: 0.85 for 5 s from %.1fs\n%s\n%s", rules, seed, at.Seconds(), r, r.timeline())
		}
		slices.Sort(reach)
		return reach[1]
	}
	reach := run(true)
	if reach > 7*time.Second {
		t.Errorf("the fleet held 0.85 of the limit for 5 s from %.1fs (median of 3), want within 7 s", reach.Seconds())
	}
	if control := run(false); control <= reach {
		t.Errorf("the control (no start rules) reached 0.85 at %.1fs (median of 3), as soon as the rules (%.1fs): the test proves nothing", control.Seconds(), reach.Seconds())
	}
}

// A limit that halves mid-run (a token bucket of 16/s, then 8/s, with
// Retry-After): refused below its reading (a refusal taken for jitter, or
// one that began an episode) and again right after, the fleet takes the
// limit for moved and restarts from a guess instead of approaching the old
// reading again; the refusals stop within 3 s (1.2–1.9 s in 34 runs), and
// what follows still delivers. The control, without that rule, approaches
// the old reading and crosses the new limit again (refusals went on for
// 3.6–12.8 s).
func TestEstimateFollowsADrop(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	const drop = 30 * time.Second
	run := func(guess bool) (stop time.Duration) {
		r := runSim(t, simConfig{procs: 3, callers: 20, rate: 20, rule: fakedest.Rule{Rate: 16, Burst: 1},
			changes:  []simChange{{drop, fakedest.Rule{Rate: 8, Burst: 1}}},
			duration: 90 * time.Second, latency: 20 * time.Millisecond, seed: 1,
			tune: func(tu *tuning) { tu.dropGuess = guess }})
		stop, after := r.refusalsStop(drop, 10*time.Second), r.goodput(drop+10*time.Second, 90*time.Second, 8)
		t.Logf("rule %v: refusals stop %.1fs after the drop; goodput 40–90 s %.3f\n%s\n%s", guess, stop.Seconds(), after, r, r.timeline())
		if after < 0.8 {
			t.Errorf("rule %v: goodput %.3f of the new limit over 40–90 s, want ≥ 0.8", guess, after)
		}
		return stop
	}
	stop := run(true)
	if stop > 3*time.Second {
		t.Errorf("refusals went on %.1fs after the limit halved, want ≤ 3 s", stop.Seconds())
	}
	if control := run(false); control <= stop {
		t.Errorf("the control (no drop rule) stopped refusals %.1fs after the drop, as soon as the rule (%.1fs): the test proves nothing", control.Seconds(), stop.Seconds())
	}
}

// A limit that doubles mid-run (a token bucket of 8/s, then 16/s): the
// climb past the reading steepens once it is 10 % past without a refusal,
// and the fleet delivers ≥ 0.85 × the new limit for 5 s within 30 s of the
// rise: 24–25 s in five runs with the rise 2 s after a probe's cut, the
// worst case (29 s without the steep climb); 16.5 s with the rise at 31 s
// (22 s without).
func TestEstimateFollowsARise(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	const rise = 23300 * time.Millisecond
	judgeRise(t, runSim(t, simConfig{procs: 3, callers: 50, rate: 20, rule: fakedest.Rule{Rate: 8, Burst: 1},
		changes:  []simChange{{rise, fakedest.Rule{Rate: 16, Burst: 1}}},
		duration: 70 * time.Second, latency: 5 * time.Millisecond, seed: 1}), rise)
}

// The climb past the reading is a cubic until it is steep (10 %) past it
// without a refusal, then doubles the pace every steepDouble: a limit that
// doubled is found seconds sooner, and the probe just past the reading
// comes when it did. The control: the cubic all along.
func TestClimbSteepensPastTheReading(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	passes := func(tune tuning, share float64) float64 { return paceCrosses(t, pool, tune, 8, share) }
	tune := defaultTuning(DefaultLateBudget)
	control := tune
	control.steep = 0
	if probe, want := passes(tune, 1.05), passes(control, 1.05); math.Abs(probe-want) > 0.06 {
		t.Errorf("the pace passes 1.05 × the reading at %.2f s, the cubic's at %.2f s: the probe moved", probe, want)
	}
	double, slow := passes(tune, 2), passes(control, 2)
	t.Logf("twice the reading after %.2f s (the cubic: %.2f s)", double, slow)
	if max := tune.approach.Seconds() + 11; double > max {
		t.Errorf("the pace passes twice the reading after %.2f s, want ≤ %.0f s", double, max)
	}
	if slow < double+3 {
		t.Errorf("the control passes twice the reading after %.2f s, not 3 s later than the steep climb (%.2f s): the test proves nothing", slow, double)
	}
}

// No ratchet: against a strict limiter with the requests of a loaded
// machine (a few per cent leave a few milliseconds late), lone refusals
// keep the estimate; over ten minutes the pace does not drift down: the
// last five minutes deliver as much as minutes 1–5.
func TestEstimateDoesNotRatchet(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	rule := fakedest.Rule{Rate: 8, Strict: true, RetryAfter: fakedest.NoRetryAfter}
	r := runSim(t, simConfig{procs: 3, callers: 10, rate: 30, rule: rule, duration: 10 * time.Minute,
		latency: 20 * time.Millisecond, seed: 2,
		late: someLate(0.05, 4*time.Millisecond)})
	early, late := r.goodput(time.Minute, 5*time.Minute, 8), r.goodput(5*time.Minute, 10*time.Minute, 8)
	t.Logf("%s; minutes 1–5 %.3f, 5–10 %.3f", r, early, late)
	if late < early-0.02 || late < 0.85 {
		t.Errorf("goodput fell from %.3f (minutes 1–5) to %.3f (5–10): the estimate ratchets down", early, late)
	}
}

// A loaded machine's jitter right after a refusal: against a bucket of 8/s
// (capacity 1, Retry-After: 1), one request in ten leaves up to 10 ms late
// (4 % under 8/s is 5 ms). A refusal within calm of a decrease reads as
// the decrease not being enough (a deeper cut, or a limit that dropped:
// half), so within calm of a reading the fleet settles `guard` × the
// margin under it: over three seeds at most one cut after the start goes
// below 0.75 × the limit, and goodput over 20–120 s holds ≥ 0.75
// (0.79–0.85 in single runs: each refusal still costs its hold). The
// guard makes such a cut rare, not impossible: a probe's reading can lie
// over the limit (8.5 of 8), and a request 10 ms late under the guard's
// pace of it is refused within the calm (0 in 16 seeds on a quiet and a
// loaded machine, 1 in 3 in one CI run). The control, without the guard,
// cut to half 1–8 times per seed (13–16 times in five seeds; goodput
// 0.28–0.86; an integration test on a loaded machine read 0.67–0.69 the
// same way).
func TestJitterAfterARefusalIsNoDrop(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	// The guard runs three seeds; the control stops at its third deep cut
	// and tries up to ten (a seed's run is not the same twice: the
	// database's timing moves it; it made 1 in six seeds once). The control probes as often as before
	// the confirmed plateau (every ~20 s, not ~24): each refusal's calm is
	// where a deep cut can come, and with fewer of them it cut 2 times in
	// six seeds once, too few to tell. Nor does it bisect from the reading
	// before (prevBisect): a refusal within calm under a probe's reading
	// then reads the mean of the reading before and the refused pace, not
	// the cut, and the control made too few deep cuts again.
	run := func(guard float64, seeds uint64) (deep int, worst float64) {
		worst = 1
		for seed := uint64(1); seed <= seeds && (guard > 1 || deep < 3); seed++ {
			r := runSim(t, simConfig{procs: 3, callers: 20, rate: 20, rule: fakedest.Rule{Rate: 8, Burst: 1},
				duration: 120 * time.Second, latency: 5 * time.Millisecond, seed: seed,
				late: someLate(0.1, 10*time.Millisecond),
				tune: func(tu *tuning) {
					tu.guard = guard
					if guard <= 1 {
						tu.confirmedPlateau, tu.prevBisect = 0, false
					}
				}})
			g := r.goodput(20*time.Second, 120*time.Second, 8)
			worst = min(worst, g)
			for _, p := range r.pressure {
				if p.at > 10*time.Second && p.r.Estimate > 0 && p.r.Estimate < 0.75*8 {
					deep++
				}
			}
			t.Logf("guard %v, seed %d: goodput 20–120 s %.3f\n%s\n%s", guard, seed, g, r, r.timeline())
		}
		return deep, worst
	}
	deep, worst := run(defaultTuning(DefaultLateBudget).guard, 3)
	if deep > 1 || worst < 0.75 {
		t.Errorf("with the guard: %d cuts under 0.75 × the limit after the start in three seeds, worst goodput %.3f; want at most one and ≥ 0.75", deep, worst)
	}
	if deep, worst := run(1, 10); deep < 3 {
		t.Errorf("the control (no guard, no confirmed plateau, no prevBisect) made %d deep cuts in ten seeds (worst goodput %.3f), not 3: the test proves nothing", deep, worst)
	}
}

// A fixed window of 2 per second under a ceiling of 20/s: a probe past the
// reading runs over the quota until one of the windows gets a third
// request (refused at 2.3/s), and the fleet walked the reading back down by
// the margin, a refusal (and a second's hold) per step. With probeBisect a
// probe's refusal reads the geometric mean of the level last accepted and
// the refused pace, and a refusal below a reading younger than an approach
// is no jitter: over seconds 10–70, in the median of three seeds, at most
// 2.5 % of the requests are refused (1.8 % over nine seeds in the
// simulation) and goodput holds ≥ 0.88. The control refuses more (3.5 %).
// Both run without startCycle: read by its cycle, the start lands under
// the quota, and the one refusal over 10–70 s is read alike (0.88 %
// either way; see TestAStartsCycleFindsAOneSecondWindow).
func TestProbeRefusalBisects(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	run := func(bisect bool) (refused, good float64) {
		return windowOfTwo(t, fmt.Sprintf("probeBisect %v", bisect), simConfig{latency: 5 * time.Millisecond,
			late: func(rng *randSource) time.Duration {
				if rng.IntN(10) == 0 {
					return time.Duration(rng.IntN(5000)) * time.Microsecond
				}
				return 0
			},
			tune: func(tu *tuning) { tu.probeBisect, tu.startCycle = bisect, 0 }})
	}
	refused, good := run(true)
	if refused > 0.025 || good < 0.88 {
		t.Errorf("refused %.2f%% of the requests over 10–70 s, goodput %.3f (medians of 3); want ≤ 2.5 %% and ≥ 0.88", 100*refused, good)
	}
	if control, _ := run(false); control <= refused+0.005 {
		t.Errorf("the control (no probeBisect) refused %.2f%%, not more than %.2f%%: the test proves nothing", 100*control, 100*refused)
	}
}

// In the simulation (3 processes × 20 callers under a ceiling of 20/s, 40
// s), a 1-s window of 2 read by the start's cycle is found in two or three
// refusals instead of five: over seconds 10–40 (medians of 3 seeds) at
// most 2.5 % refused and goodput at least 0.9 (1.79 %, 0.917), where the
// control (cut × 0.7 a refusal: 3.77 %, 0.850) lands its walk over the
// quota and walks down from there a refusal and a hold at a time.
func TestAStartsCycleFindsAOneSecondWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	run := func(startCycle float64) (refused, good float64) {
		return windowOfTwo(t, fmt.Sprintf("startCycle %.1f", startCycle), simConfig{latency: 2 * time.Millisecond, duration: 40 * time.Second,
			tune: func(tu *tuning) { tu.startCycle = startCycle }})
	}
	refused, good := run(defaultTuning(DefaultLateBudget).startCycle)
	if refused > 0.025 || good < 0.9 {
		t.Errorf("refused %.2f%% over 10–40 s, goodput %.3f (medians of 3); want ≤ 2.5 %% and ≥ 0.9", 100*refused, good)
	}
	if control, cgood := run(0); control <= refused+0.01 && cgood >= good-0.03 {
		t.Errorf("the control refused %.2f%% (goodput %.3f), not more than %.2f%% (%.3f): the test proves nothing",
			100*control, cgood, 100*refused, good)
	}
}

// windowOfTwo simulates 3 processes × 20 callers under a ceiling of 20/s
// against a fixed window of 2 per second for cfg's duration (default 70
// s), latency (+ 2 ms per seed), lateness and tuning, seeds 1–3, and
// returns the medians of the share refused and the goodput from second 10
// to the end.
func windowOfTwo(t *testing.T, label string, cfg simConfig) (refused, good float64) {
	t.Helper()
	var rs, gs []float64
	latency := cfg.latency
	if cfg.duration == 0 {
		cfg.duration = 70 * time.Second
	}
	for seed := uint64(1); seed <= 3; seed++ {
		cfg.procs, cfg.callers, cfg.rate, cfg.seed = 3, 20, 20, seed
		cfg.rule = fakedest.Rule{Window: time.Second, WindowLimit: 2}
		cfg.latency = latency + time.Duration(2*seed)*time.Millisecond
		r := runSim(t, cfg)
		rs = append(rs, r.refusedShare(10*time.Second, cfg.duration))
		gs = append(gs, r.goodput(10*time.Second, cfg.duration, 2))
		t.Logf("%s, seed %d: %s\n%s", label, seed, r, r.timeline())
	}
	slices.Sort(rs)
	slices.Sort(gs)
	return rs[1], gs[1]
}

// A reading a probe confirmed is held confirmedPlateau longer before the
// next probe: the pace passes it that much later (the climb past it is the
// same curve, shifted); a new reading's plateau is the approach's.
func TestConfirmedPlateauDelaysTheProbe(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	tune := defaultTuning(DefaultLateBudget)
	p := tune.confirmedPlateau.Seconds()
	if p <= 0 {
		t.Fatal("confirmedPlateau is 0 by default")
	}
	plain := plateauCrosses(t, pool, tune, 8, 8, 0, 1)
	held := plateauCrosses(t, pool, tune, 8, 8, p, 1)
	if math.Abs(held-plain-p) > 0.06 {
		t.Errorf("with a plateau of %.0f s the pace passes the reading at %.2f s, without at %.2f s; want %.0f s later", p, held, plain, p)
	}
	// Under climbRate the plateau is on the climb's clock: longer in
	// proportion, like the rest of the climb.
	slowPlain := plateauCrosses(t, pool, tune, 2, 2, 0, 1)
	slowHeld := plateauCrosses(t, pool, tune, 2, 2, p, 1)
	if want := p * tune.climbRate / 2; math.Abs(slowHeld-slowPlain-want) > 0.1 {
		t.Errorf("at 2/s the plateau of %.0f s delays the probe %.2f s, want %.2f s", p, slowHeld-slowPlain, want)
	}
	// A bound's approach has no plateau: est_plateau does not touch it.
	if a, b := plateauCrosses(t, pool, tune, 6, 8, 0, 0.9), plateauCrosses(t, pool, tune, 6, 8, p, 0.9); a != b {
		t.Errorf("the approach to a bound passes 0.9 × it at %.2f s, with a plateau at %.2f s", a, b)
	}
}

// Against a strict bucket that answers Retry-After: 1, every probe costs
// a second's hold. Once probes confirm the reading, they come
// confirmedPlateau further apart: fewer refusals, more delivered. The
// control (no confirmed plateau) probes every approach + climb. And after
// minutes of confirmed readings a limit that doubles right after a probe's
// refusal (the worst case: a whole confirmed plateau and climb before the
// next probe) is still found within 30 s.
func TestConfirmedReadingProbesLessOften(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	// A probe's refusal is at 181.0 s in the default's run (seed 1; probes
	// every 24 s since the second reading).
	const from, to, rise = 40 * time.Second, 180 * time.Second, 182 * time.Second
	var refusals, control int
	var good, controlGood float64
	var risen simResult
	run := func(plateau time.Duration, refused *int, good *float64, changes []simChange, duration time.Duration) func(*testing.T) {
		return func(t *testing.T) {
			t.Parallel()
			r := runSim(t, simConfig{procs: 3, callers: 50, rate: 20, rule: fakedest.Rule{Rate: 8, Burst: 1},
				changes: changes, duration: duration, latency: 5 * time.Millisecond, seed: 1,
				tune: func(tu *tuning) { tu.confirmedPlateau = plateau }})
			_, *refused = r.between(from, to)
			*good = r.goodput(from, to, 8)
			t.Logf("confirmedPlateau %s: %d refusals over %s–%s, goodput %.3f\n%s\n%s", plateau, *refused, from, to, *good, r, r.timeline())
			if w := r.maxWindow(); w > 21 {
				t.Errorf("%d requests in one second, over the ceiling + burst (21)", w)
			}
			if changes != nil {
				risen = r
			}
		}
	}
	t.Run("both", func(t *testing.T) {
		t.Run("default", run(defaultTuning(DefaultLateBudget).confirmedPlateau, &refusals, &good,
			[]simChange{{rise, fakedest.Rule{Rate: 16, Burst: 1}}}, rise+40*time.Second))
		t.Run("control", run(0, &control, &controlGood, nil, to))
	})
	if good < 0.9 {
		t.Errorf("goodput %.3f over %s–%s, want ≥ 0.9", good, from, to)
	}
	if refusals > control-2 || good < controlGood+0.005 {
		t.Errorf("%d refusals over %s–%s, goodput %.3f; the control %d, %.3f: want two probes fewer (24 s apart, not 20) and more delivered",
			refusals, from, to, good, control, controlGood)
	}
	if risen.cfg.duration > 0 {
		judgeRise(t, risen, rise)
	}
}

// judgeRise fails unless the fleet delivered ≥ 0.85 × the doubled limit
// (16/s) for 5 s within 30 s of the rise, never over the ceiling + burst.
func judgeRise(t *testing.T, r simResult, rise time.Duration) {
	t.Helper()
	reach := r.reached(rise, 16, 0.85)
	t.Logf("≥ 0.85 × the new limit for 5 s from %s after the rise at %s\n%s\n%s", reach, rise, r, r.timeline())
	if reach < 0 || reach > 30*time.Second {
		t.Errorf("the fleet delivered ≥ 0.85 × the doubled limit for 5 s from %s after the rise (-1: never), want within 30 s", reach)
	}
	if w := r.maxWindow(); w > 21 {
		t.Errorf("%d requests in one second, over the ceiling + burst (21)", w)
	}
}

// A refusal under a reading younger than an approach, reading within two
// margins of it, confirms the reading it leads to: the plateau at it lasts
// confirmedPlateau longer, as after a probe's refusal. A fixed window lets
// a probe run over its quota until one of its windows fills, so the
// probe's reading is often a little high and the pace at it is refused
// seconds later: two refusals a cycle, and the second reading, which the
// first brackets, was probed again as soon as a new one. The control
// (confirmUnder off) confirms only a refusal past the plateau; a refusal
// under an old reading confirms nothing either way.
func TestRefusalUnderAYoungReadingConfirms(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "under", rate: 25, adapt: "estimate", probe: true, noHeaders: true})
	tune := defaultTuning(DefaultLateBudget)
	want := tune.confirmedPlateau.Seconds()
	// A reading of 10.6/s (no reading before it), refused at 10.2/s, 50
	// accepted since the hold before: 10.2 × 50/51 (plateauExcess).
	young := 10.2 * 50 / 51
	if r := refuseReading(t, pool, "under", tune, 10.6, 0, 5, 10.2); math.Abs(r.est-young) > 0.01 || r.plateau != want {
		t.Errorf("refused at 10.2/s 5 s after a reading of 10.6/s: estimate %.2f/s, plateau %.1f s; want %.2f/s, %.0f s", r.est, r.plateau, young, want)
	}
	if r := refuseReading(t, pool, "under", tune, 10.6, 0, 20, 10.2); math.Abs(r.est-10.2) > 0.01 || r.plateau != 0 {
		t.Errorf("refused at 10.2/s 20 s after the reading: estimate %.2f/s, plateau %.1f s; want 10.2/s, none", r.est, r.plateau)
	}
	control := tune
	control.confirmUnder = false
	if r := refuseReading(t, pool, "under", control, 10.6, 0, 5, 10.2); math.Abs(r.est-young) > 0.01 || r.plateau != 0 {
		t.Errorf("control: estimate %.2f/s, plateau %.1f s after the young reading's refusal; want %.2f/s and none (the test proves nothing)", r.est, r.plateau, young)
	}
}

// A probe refused past the steep turn raised the reading from 10.26/s to
// 12/s (a fixed window's lag read as a limit that moved up); the pace at
// it is refused within calm, at 10.58/s. That refusal reads the geometric
// mean of the reading before (est_prev) and the refused pace, 10.42/s, not
// the cut × beta (7.4/s: 18 s to climb back, in fleetpace bench adapt's
// 1-s window of 10/s) the control makes. A refusal that raises a reading
// remembers the reading it raised. A reading raised twofold (a limit that
// rose) is cut as before.
func TestRefusalUnderAYoungReadingBisectsFromTheOneBefore(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "prev", rate: 25, adapt: "estimate", probe: true, noHeaders: true})
	tune := defaultTuning(DefaultLateBudget)
	// (Raised to 12.5/s, or under it with lagRead: the pace a hold before.)
	if r := refuseReading(t, pool, "prev", tune, 10.26, 0, 20, 12.5); r.est <= 10.26*1.05 || r.est > 12.51 || r.prev != 10.26 {
		t.Errorf("a probe refused at 12.5/s past a reading of 10.26/s: estimate %.2f/s, the reading before %.2f/s; want over 10.26/s, at most 12.5/s, and 10.26/s", r.est, r.prev)
	}
	r := refuseReading(t, pool, "prev", tune, 12, 10.26, 1, 10.58)
	if want := math.Sqrt(10.26 * 10.58); math.Abs(r.est-want) > 0.01 || r.prev != 10.26 {
		t.Errorf("refused at 10.58/s 1 s after a reading of 12/s raised from 10.26/s: estimate %.2f/s (the one before kept: %.2f/s); want %.2f/s (10.26)", r.est, r.prev, want)
	}
	control := tune
	control.prevBisect = false
	if r := refuseReading(t, pool, "prev", control, 12, 10.26, 1, 10.58); r.est > 10.58*tune.beta*1.01 {
		t.Errorf("control: estimate %.2f/s; want the cut × beta, %.2f/s (the test proves nothing)", r.est, 10.58*tune.beta)
	}
	// A limit of 8/s that doubled: the rise read at 18.1/s, the guard's
	// pace refused at 15.9/s. The mean of 8 and 15.9 is no reading of the
	// new limit: the cut × beta (11.1/s, and the bisection up to 13.3/s)
	// as before.
	if r := refuseReading(t, pool, "prev", tune, 18.1, 8, 1, 15.9); r.est > 15.9*tune.beta*1.01 {
		t.Errorf("refused at 15.9/s 1 s after a reading of 18.1/s raised from 8/s: estimate %.2f/s; want the cut × beta, %.2f/s", r.est, 15.9*tune.beta)
	}
}

// Two overshoots prevBisect did not cover, met by fleetpace bench adapt's
// 1-s window of 10/s over 10 minutes, each cut × beta within calm: the
// guard's pace refused under the reading before too (10.29/s, then a
// probe's 11.62/s, refused at 10.22/s: 7.16/s), and a rise read after a
// bound's approach, which remembered no reading before (13.62/s: 8.39/s).
// With prevWide the first reads the geometric mean of the pace at the
// reading before (a margin under it) and the refused pace, and the second
// remembers the bound's target the pace passed, so that the refusal after
// it bisects from there. The control (prevWide off) cuts the first and
// remembers nothing in the second.
func TestRefusalUnderTheReadingBeforeBisects(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "wide", rate: 25, adapt: "estimate", probe: true, noHeaders: true})
	tune := defaultTuning(DefaultLateBudget)
	control := tune
	control.prevWide = false
	lower := 10.29 * (1 - tune.margin)
	if r, want := refuseReading(t, pool, "wide", tune, 11.62, 10.29, 1, 10.22), math.Sqrt(lower*10.22); math.Abs(r.est-want) > 0.01 {
		t.Errorf("refused at 10.22/s 1 s after a reading of 11.62/s raised from 10.29/s: estimate %.2f/s; want %.2f/s", r.est, want)
	}
	if r := refuseReading(t, pool, "wide", control, 11.62, 10.29, 1, 10.22); r.est > 10.22*tune.beta*1.01 {
		t.Errorf("control: estimate %.2f/s; want the cut × beta, %.2f/s (the test proves nothing)", r.est, 10.22*tune.beta)
	}
	// Refused well under the reading before (a limit that dropped): cut.
	if r := refuseReading(t, pool, "wide", tune, 11.62, 10.29, 1, 9); r.est > 9*tune.beta*1.01 {
		t.Errorf("refused at 9/s 1 s after a reading of 11.62/s raised from 10.29/s: estimate %.2f/s; want the cut × beta, %.2f/s", r.est, 9*tune.beta)
	}
	// A bound's approach from 9 to 10.3/s, passed: a probe refused at
	// 13.62/s (over steep past the target: a limit that moved up) reads
	// 13.62/s and remembers 10.3/s.
	if r := refuseApproach(t, pool, "wide", tune, 9, 10.3, 0, 25, 13.62); math.Abs(r.est-13.62) > 0.01 || r.prev != 10.3 {
		t.Errorf("a probe refused at 13.62/s past a bound's target of 10.3/s: estimate %.2f/s, the reading before %.2f/s; want 13.62/s and 10.3/s", r.est, r.prev)
	}
	if r := refuseApproach(t, pool, "wide", control, 9, 10.3, 0, 25, 13.62); math.Abs(r.est-13.62) > 0.01 || r.prev != 0 {
		t.Errorf("control: estimate %.2f/s, the reading before %.2f/s; want 13.62/s and none (the test proves nothing)", r.est, r.prev)
	}
}

// A probe read a 1-s window of 2/s at 2.118/s, 6 % over its quota (raised
// from 1.717/s); the pace under that reading, 2.03/s, is refused 17 s
// later. At 2/s the climb's clock runs at a quarter of the seconds', so
// the reading is younger than an approach (45 s): the refusal reads the
// geometric mean of the reading before and the refused pace, not jitter.
// The control (youngClock off: an approach is 12 s) takes it for jitter
// and keeps 2.118/s, where the fleet was refused every half minute in
// fleetpace bench adapt. At climbRate and above the two clocks agree.
func TestAYoungReadingIsYoungOnTheClimbsClock(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "slow", rate: 20, adapt: "estimate", probe: true, noHeaders: true})
	tune := defaultTuning(DefaultLateBudget)
	control := tune
	control.youngClock = false
	if r, want := refuseRow(t, pool, "slow", tune, 2.118, 2.118, 1.717, 17, 100, 2.03, 1), math.Sqrt(1.717*2.03); math.Abs(r.est-want) > 0.01 {
		t.Errorf("refused at 2.03/s 17 s after a reading of 2.118/s raised from 1.717/s: estimate %.3f/s; want %.3f/s", r.est, want)
	}
	if r := refuseRow(t, pool, "slow", control, 2.118, 2.118, 1.717, 17, 100, 2.03, 1); r.est != 2.118 {
		t.Errorf("control: estimate %.3f/s; want the reading kept, 2.118/s (the test proves nothing)", r.est)
	}
	// Older than its approach on the climb's clock (60 s at 2/s): jitter.
	if r := refuseRow(t, pool, "slow", tune, 2.118, 2.118, 1.717, 60, 100, 2.03, 1); r.est != 2.118 {
		t.Errorf("refused at 2.03/s 60 s after the reading: estimate %.3f/s; want the reading kept (jitter)", r.est)
	}
	// At 10/s (over climbRate) 17 s is older than an approach either way.
	if r := refuseRow(t, pool, "slow", tune, 10.59, 10.59, 8.6, 17, 100, 10.15, 1); r.est != 10.59 {
		t.Errorf("refused at 10.15/s 17 s after a reading of 10.59/s: estimate %.3f/s; want the reading kept (jitter)", r.est)
	}
}

// A probe climbs past a reading of 8/s on the steep curve and is refused
// 28 s after it, at 18.3/s, with Retry-After 1. The destination answered a
// pace it saw a while ago, and the climb ran on meanwhile: the reading is
// the geometric mean of the refused pace and the pace the fleet sent one
// hold (1 s) before, which was accepted. The control (lagRead off) reads
// the refused pace, where fleetpace bench adapt's bucket of 8/s that
// doubled to 16/s was refused again at the pace under it and cut to
// 11.3/s. A refusal without a Retry-After (nginx) reads the refused pace:
// a strict limiter refuses where the pace crosses it.
func TestAProbesLateRefusalReadsThePaceBefore(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "lag", rate: 25, adapt: "estimate", probe: true, noHeaders: true})
	tune := defaultTuning(DefaultLateBudget)
	control := tune
	control.lagRead = false
	// The pace 1 s before the refusal, as the schedule's own function has it.
	var then float64
	if err := pool.QueryRow(context.Background(), `SELECT LEAST(1.0 / fleetpace_pace_adaptive('estimate', 25, 1, 8, 8, 4, 27, $1), 25)`,
		tune.array()).Scan(&then); err != nil {
		t.Fatal(err)
	}
	if then <= 8 || then >= 18.3 {
		t.Fatalf("the probe's pace 1 s before the refusal is %.2f/s; the test wants it between the reading and the refused pace", then)
	}
	if r, want := refuseRow(t, pool, "lag", tune, 8, 8, 0, 28, 100, 18.3, 1), math.Sqrt(then*18.3); math.Abs(r.est-want) > 0.01 || r.prev != 8 {
		t.Errorf("a probe refused at 18.3/s 28 s after a reading of 8/s: estimate %.2f/s (the reading before %.2f/s); want %.2f/s (8/s)", r.est, r.prev, want)
	}
	if r := refuseRow(t, pool, "lag", control, 8, 8, 0, 28, 100, 18.3, 1); math.Abs(r.est-18.3) > 0.01 {
		t.Errorf("control: estimate %.2f/s; want the refused pace, 18.3/s (the test proves nothing)", r.est)
	}
	if r := refuseRow(t, pool, "lag", tune, 8, 8, 0, 28, 100, 18.3, 0); math.Abs(r.est-18.3) > 0.01 {
		t.Errorf("without a Retry-After: estimate %.2f/s; want the refused pace, 18.3/s", r.est)
	}
}

// refused is a pace row's estimate after a refusal.
type refused struct{ est, plateau, prev float64 }

// refuseReading sets platform's row to a reading of est (requests/s) age
// seconds old, raised from prev (0: none), nearly everything accepted
// since and a lone refusal 5 s ago (so that none is taken for jitter), and
// reports a refusal of a request sent at sent (requests/s), Retry-After 1.
func refuseReading(t *testing.T, pool *pgxpool.Pool, platform string, tune tuning, est, prev, age, sent float64) refused {
	t.Helper()
	return refuseApproach(t, pool, platform, tune, est, est, prev, age, sent)
}

// refuseApproach is refuseReading with the row approaching estMax from est
// (estMax above est: a bound's target).
func refuseApproach(t *testing.T, pool *pgxpool.Pool, platform string, tune tuning, est, estMax, prev, age, sent float64) refused {
	t.Helper()
	return refuseRow(t, pool, platform, tune, est, estMax, prev, age, 5, sent, 1)
}

// refuseRow is refuseApproach with the last refusal jitterAgo seconds ago
// (one older than tuning's jitterMemory leaves the refusal free to be
// taken for jitter) and a Retry-After of retry seconds (0: none).
func refuseRow(t *testing.T, pool *pgxpool.Pool, platform string, tune tuning, est, estMax, prev, age, jitterAgo, sent, retry float64) refused {
	t.Helper()
	ctx := context.Background()
	const now = 1e6
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET est = $3, est_max = $6, est_prev = $4, est_at = $1::float8 - $2::float8,
	    est_plateau = 4, est_guess = false, cut_below = false, acc_cut = 50, ref_cut = 0, acc_rate = $3,
	    acc_at = $1::float8 - 0.1, acc_from = $1::float8 - 30, jitter_at = $1::float8 - $7::float8, held_at = 0,
	    hold_until = 0, doubled_at = 0, meas_window = 0, meas_window_at = 0 WHERE platform = $5`, now, age, est, prev, platform, estMax, jitterAgo); err != nil {
		t.Fatal(err)
	}
	reportAnswers(t, pool, platform, tune, now, true, now-0.5, 1/sent, retry, 0)
	var r refused
	if err := pool.QueryRow(ctx, `SELECT est, est_plateau, est_prev FROM fleetpace_pace WHERE platform = $1`, platform).
		Scan(&r.est, &r.plateau, &r.prev); err != nil {
		t.Fatal(err)
	}
	return r
}

// A fixed window of 20 per 10 s refuses 2.2 s into a run with
// Retry-After 7.8: what it accepted over the window and the hold is its
// quota, 20 in 10 s. The accepted rate was averaged over the shortest
// measurement window (2 s) until the hold made it 7.8 s; with rescale it
// is carried over and the reading is ~2/s. The control reads it as if
// averaged over the new window: about 4 × that (6.9/s in fleetpace bench
// adapt's run), and the fleet walked down from there for 40 s.
func TestALongHoldReadsWhatWasAccepted(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	read := func(name string, tune tuning) float64 {
		addPlatform(t, pool, platformSpec{name: name, rate: 20, adapt: "estimate", probe: true, noHeaders: true})
		ctx := context.Background()
		report := func(now float64, pressure bool, retry float64, answered int) {
			reportAnswers(t, pool, name, tune, now, pressure, now-0.05, 0.05, retry, answered)
		}
		const start = 1e6
		for i := 1; i <= 20; i++ {
			report(start+0.1*float64(i), false, 0, 1)
		}
		report(start+2.2, true, 7.8, 0)
		var est float64
		if err := pool.QueryRow(ctx, `SELECT est FROM fleetpace_pace WHERE platform = $1`, name).Scan(&est); err != nil {
			t.Fatal(err)
		}
		return est
	}
	tune := defaultTuning(DefaultLateBudget)
	want := 20 / (2.1 + 7.8)
	if est := read("rescaled", tune); math.Abs(est-want) > 0.3 {
		t.Errorf("20 accepted in 2.1 s, then held 7.8 s: estimate %.2f/s; want about %.2f/s", est, want)
	}
	control := tune
	control.rescale = false
	if est := read("unscaled", control); est < 2*want {
		t.Errorf("control: estimate %.2f/s; want over %.2f/s (the test proves nothing)", est, 2*want)
	}
}

// A fixed window of 20 per 10 s, entered part way through: the run's 20
// went in the first second and the hold was 5.94 s, so the first long hold
// reads more than the quota (20 in 8.1 s), and the fleet paces that from
// the hold's end, a window's reset. The next window fills 8.3 s in and
// refuses, held to its end (1.7 s): what was accepted from the one hold's
// end to the end of this one is the quota over the window, 20 in 10 s.
// The control (cycleHold 0) reads more (the refused pace, less the long
// hold's share), and fleetpace bench adapt's 10-s window of 2/s walked
// down from there by the margin, a refusal and a hold a step. Held for a
// second only (Retry-After: 1: a sliding log's next expiry, a strict
// limiter's next slot), the refusal is no window's: not read by its cycle.
func TestARefusalUnderAWindowsReadingReadsTheCycle(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	// read reports the sequence to a new platform, the refusal held for
	// its window's rest (hold 0) or for hold seconds.
	read := func(name string, tune tuning, hold float64) (first, second float64) {
		addPlatform(t, pool, platformSpec{name: name, rate: 20, adapt: "estimate", probe: true, noHeaders: true})
		ctx := context.Background()
		est := func() float64 {
			var e float64
			if err := pool.QueryRow(ctx, `SELECT est FROM fleetpace_pace WHERE platform = $1`, name).Scan(&e); err != nil {
				t.Fatal(err)
			}
			return e
		}
		const start, reset = 1e6, 1e6 + 8.14 // the window's resets: every 10 s from reset
		for i := 1; i <= 20; i++ {
			reportAnswers(t, pool, name, tune, start+0.05*float64(i), false, start+0.05*float64(i-1), 0.05, 0, 1)
		}
		reportAnswers(t, pool, name, tune, start+2.2, true, start+2.15, 0.05, reset-start-2.2, 0)
		first = est()
		// The pace under the reading from the hold's end, 20 accepted in
		// the window, the 21st refused until its end.
		spacing := 1 / (first * (1 - tune.margin))
		at := reset
		for range 20 {
			at += spacing
			reportAnswers(t, pool, name, tune, at, false, at-0.05, spacing, 0, 1)
		}
		at += spacing
		if hold == 0 {
			hold = reset + 10 - at
			if hold <= defaultTuning(DefaultLateBudget).cycleHold.Seconds() || hold > 5 {
				t.Fatalf("the 21st request at %.2f s into the window, held %.2f s: the test wants a window's rest of 1.5–5 s (first reading %.2f/s)",
					at-reset, hold, first)
			}
		}
		reportAnswers(t, pool, name, tune, at, true, at-0.05, spacing, hold, 0)
		return first, est()
	}
	// The estimate's own rule: no window is learned (with one, the first
	// long hold would start a trial at the ceiling, not this pace).
	tune := defaultTuning(DefaultLateBudget)
	tune.winMin = 0
	first, second := read("cycle", tune, 0)
	if first < 2.2 {
		t.Fatalf("the first long hold read %.2f/s; the test wants it over the quota (2/s)", first)
	}
	if math.Abs(second-2) > 0.1 {
		t.Errorf("20 accepted from one reset to the next, held to it: estimate %.3f/s (from %.2f/s); want 2/s", second, first)
	}
	control := tune
	control.cycleHold = 0
	_, controlled := read("control", control, 0)
	if controlled < 2.15 {
		t.Errorf("control: estimate %.3f/s; want over 2.15/s (the test proves nothing)", controlled)
	}
	// Read by its cycle, this would be 20 in 9.25 s: 2.16/s.
	_, second1 := read("second", tune, 0.95)
	if math.Abs(second1-controlled) > 0.01 {
		t.Errorf("held 0.95 s: estimate %.3f/s; want the control's %.3f/s (no window's rest)", second1, controlled)
	}
	t.Logf("first long hold %.3f/s; then %.3f/s (control %.3f/s, held a second %.3f/s)", first, second, controlled, second1)
}

// reportAnswers runs the report statement for platform: answered answers
// (all clean and fresh), a refusal among them if pressure, of requests
// reserved at reservedAt and spaced interval seconds apart.
// fleetpace_pace_report takes p_sent_from in a form of its own, with no
// defaults, and the form without it (an older process's call, 16 or 17
// arguments) calls that one: every call resolves to one function, and an
// older process that creates its own form again replaces the 17-argument
// one instead of adding a third that makes calls ambiguous.
func TestReportFunctionForms(t *testing.T) {
	t.Parallel()
	_, pool := setup(t, platformSpec{name: "forms", rate: 20, adapt: "estimate", noHeaders: true})
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT pronargs, pronargdefaults FROM pg_proc WHERE proname = 'fleetpace_pace_report' ORDER BY pronargs`)
	if err != nil {
		t.Fatal(err)
	}
	var forms [][2]int16
	for rows.Next() {
		var f [2]int16
		if err := rows.Scan(&f[0], &f[1]); err != nil {
			t.Fatal(err)
		}
		forms = append(forms, f)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(forms) != 2 || forms[0] != [2]int16{17, 1} || forms[1] != [2]int16{18, 0} {
		t.Fatalf("fleetpace_pace_report forms (arguments, defaults): %v; want [17 1] and [18 0]", forms)
	}
	tune := defaultTuning(DefaultLateBudget).array()
	args := []any{"forms", 1e6, false, 1e6 - 0.01, 0.05, nil, 1, 1, 1, nil, nil, nil, "test", nil, nil, tune, "", 1e6 - 0.01}
	for _, n := range []int{16, 17, 18} {
		ph := make([]string, n)
		for i := range ph {
			ph[i] = fmt.Sprintf("$%d", i+1)
		}
		if _, err := pool.Exec(ctx, `SELECT * FROM fleetpace_pace_report(`+strings.Join(ph, ", ")+`)`, args[:n]...); err != nil {
			t.Errorf("a call with %d arguments: %v", n, err)
		}
	}
	var cycle int
	if err := pool.QueryRow(ctx, `SELECT acc_cycle FROM fleetpace_pace WHERE platform = 'forms'`).Scan(&cycle); err != nil {
		t.Fatal(err)
	}
	if cycle != 1 {
		t.Errorf("acc_cycle %d after three answers, one with its slot; want 1", cycle)
	}
}

// sentFrom is the earliest slot a test's report without pressure carries:
// the reservation's time (nil with pressure).
func sentFrom(pressure bool, reservedAt float64) *float64 {
	if pressure {
		return nil
	}
	return &reservedAt
}

func reportAnswers(t *testing.T, pool *pgxpool.Pool, platform string, tune tuning, now float64, pressure bool,
	reservedAt, interval, retry float64, answered int) {
	t.Helper()
	rows, err := pool.Query(context.Background(), reportSQL, platform, now, pressure, reservedAt, interval, retry,
		answered, answered, answered, nil, nil, nil, "test", nil, nil, tune.array(), "", sentFrom(pressure, reservedAt))
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// A refusal on the plateau under a young reading reads the excess that
// made it: the destination let the pace through until it had one request
// too many, so the limit is at least one request in N + 1 under the pace
// (N accepted since the hold before), and the step is at most one margin
// (a fixed window refuses sooner or later by its phase). A 1-s window of 2
// read at 2.41/s, paced at 2.31/s, refused the 31st request: 2.31 × 30/31;
// after 11 accepted, the margin's 2.31 × 0.96. The control reads the
// refused pace (2.29/s, the mean with the pace under the reading before),
// and the fleet walked down by the margin from there, a refusal and a
// hold a step (five refusals in a minute in fleetpace bench adapt). Not
// under the reading this one was raised from (est_prev) when the refused
// pace is over it: that level was accepted. Under an old reading a lone
// refusal is jitter either way.
func TestARefusalOnAYoungPlateauReadsItsExcess(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	ctx := context.Background()
	// read sets a new platform's row to a reading est (raised from prev)
	// set age seconds ago at a hold's end, accepted since it, and reports
	// a refusal at sent (requests/s), Retry-After 1.
	read := func(name string, tune tuning, est, prev, age float64, accepted int, sent float64) float64 {
		t.Helper()
		addPlatform(t, pool, platformSpec{name: name, rate: 20, adapt: "estimate", probe: true, noHeaders: true})
		const now = 1e6
		if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET est = $3::float8, est_max = $3::float8, est_prev = $4,
		    est_at = $1::float8 - $2::float8, est_plateau = 0, est_guess = false, cut_below = false, acc_cut = $6, ref_cut = 0,
		    acc_rate = $3::float8 * 0.95, acc_at = $1::float8 - 0.1, acc_from = $1::float8 - 30, jitter_at = $1::float8 - 100,
		    held_at = $1::float8 - $2::float8 - 1, hold_until = $1::float8 - $2::float8, doubled_at = $1::float8 - $2::float8 - 1,
		    meas_window = 2, meas_window_at = $1::float8 - 10 WHERE platform = $5`, now, age, est, prev, name, accepted); err != nil {
			t.Fatal(err)
		}
		reportAnswers(t, pool, name, tune, now, true, now-0.5, 1/sent, 1, 0)
		var e float64
		if err := pool.QueryRow(ctx, `SELECT est FROM fleetpace_pace WHERE platform = $1`, name).Scan(&e); err != nil {
			t.Fatal(err)
		}
		return e
	}
	tune := defaultTuning(DefaultLateBudget)
	control := tune
	control.plateauExcess = false
	many, manyControl := read("many", tune, 2.409, 2.374, 13, 30, 2.31), read("many-control", control, 2.409, 2.374, 13, 30, 2.31)
	t.Logf("30 accepted at 2.31/s under 2.41/s: %.3f/s (control %.3f/s)", many, manyControl)
	if want := 2.31 * 30 / 31; math.Abs(many-want) > 0.003 {
		t.Errorf("30 accepted at 2.31/s, then a refusal: estimate %.3f/s, want %.3f/s (one request in 31 under)", many, want)
	}
	if manyControl < 2.25 {
		t.Errorf("control: estimate %.3f/s, want the refused pace or more (the test proves nothing)", manyControl)
	}
	if few, want := read("few", tune, 2.409, 2.374, 5, 11, 2.31), 2.31*(1-tune.margin); math.Abs(few-want) > 0.003 {
		t.Errorf("11 accepted at 2.31/s, then a refusal: estimate %.3f/s, want %.3f/s (a margin under, no more)", few, want)
	}
	// Over ten minutes a probe read 2.33/s from a reading of 2.037/s, and
	// the plateau's refusals walked it back: refused at 2.05/s, over that
	// reading, whose pace was accepted for 90 s. The mean of the two
	// (prevBisect, 2.043/s), no more than the earlier reading: 2.037/s, not
	// a margin under the refused pace (1.968/s, 4 % under the quota).
	if back := read("back", tune, 2.134, 2.037, 8, 18, 2.05); math.Abs(back-2.037) > 0.001 {
		t.Errorf("refused at 2.05/s over the reading before (2.037/s): estimate %.3f/s, want 2.037/s", back)
	}
	if old := read("old", tune, 8, 0, 60, 400, 7.68); old != 8 {
		t.Errorf("a lone refusal under a reading a minute old: estimate %.3f/s, want 8/s (jitter)", old)
	}
}

// A start's refusal held for a second, after at least two accepted since
// the hold before, reads the cycle: the refused pace is the upper reading,
// what was accepted from the end of the hold before to the end of this
// one the lower, and the limit is read at their geometric mean (at least
// startCycle of the upper reading, and the count per second of the hold).
// A 1-s window of 2 under a ceiling of 20/s lets 2 through in the first
// 0.1 s, then holds the fleet a second; again at the pace under the
// reading (2 accepted, a refusal 0.25 s after the hold): with startCycle
// the reading is under 3/s after two refusals, where the control, cut by
// beta a refusal, is still at 6.7/s (and walked down in five refusals and
// holds over 8–11 s in fleetpace bench adapt). A strict limiter's cycle
// (one accepted, then a refusal) reads as before, and so does a bucket
// whose cycle accepted more than the restart (19 in 0.95 s at 20/s).
func TestAStartsRefusalReadsTheCycle(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	ctx := context.Background()
	n := 0
	// walk reports cycles to a new platform from its start: each accepted
	// answers 1/pace apart after the hold before (the first at 0.05 s),
	// then a refusal with Retry-After 1, the pace 0.96 of the reading
	// before after the first; it returns the reading after each. After the
	// first cycle, late answers arrive first: to requests that went before
	// the hold, reported after it (their process heard of it late).
	gap := 1.0 // spacings of the pace between the accepted answers
	walk := func(tune tuning, late int, accepted ...int) []float64 {
		t.Helper()
		n++
		name := fmt.Sprintf("start%d", n)
		addPlatform(t, pool, platformSpec{name: name, rate: 20, adapt: "estimate", probe: true, noHeaders: true})
		const start = 1e6
		now, pace := start, 20.0
		var out []float64
		for i, k := range accepted {
			if i == 0 {
				now -= 1 / pace // the first answer at 0.05 s
			}
			for j := range late * min(i, 1) {
				reportAnswers(t, pool, name, tune, now+0.001*float64(j+1), false, now-1.02, 1/pace, 0, 1)
			}
			for range k {
				now += gap / pace
				reportAnswers(t, pool, name, tune, now, false, now-0.01, 1/pace, 0, 1)
			}
			now += 1 / pace
			reportAnswers(t, pool, name, tune, now, true, now-0.01, 1/pace, 1, 0)
			var est float64
			if err := pool.QueryRow(ctx, `SELECT est FROM fleetpace_pace WHERE platform = $1`, name).Scan(&est); err != nil {
				t.Fatal(err)
			}
			out = append(out, est)
			now, pace = now+1, est*0.96
		}
		return out
	}
	tune := defaultTuning(DefaultLateBudget)
	control := tune
	control.startCycle = 0

	got, ctl := walk(tune, 0, 2, 2), walk(control, 0, 2, 2)
	t.Logf("a 1-s window of 2: %.2f/s, then %.2f/s; control %.2f/s, then %.2f/s", got[0], got[1], ctl[0], ctl[1])
	if got[1] > 3 {
		t.Errorf("a 1-s window of 2: %.2f/s after two refusals; want ≤ 3/s", got[1])
	}
	if ctl[1] < 6 {
		t.Errorf("the control read %.2f/s after two refusals, not ≥ 6/s: the test proves nothing", ctl[1])
	}
	if got[0] < ctl[0]*tune.startCycle*0.99 {
		t.Errorf("the first refusal read %.2f/s, under startCycle (%.2f) of the control's %.2f/s", got[0], tune.startCycle, ctl[0])
	}
	// A cut from a reading (8/s, est_max no higher) refused again within
	// calm after two accepted: a strict limiter's jitter near its rate,
	// the cycle mostly its hold. Read by the cycle, a strict bucket of 8/s
	// in the integration test was cut to ~3/s; it is read as the control.
	fromReading := func(tune tuning) float64 {
		t.Helper()
		n++
		name := fmt.Sprintf("start%d", n)
		addPlatform(t, pool, platformSpec{name: name, rate: 20, adapt: "estimate", probe: true, noHeaders: true})
		const now = 1e6
		if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET est = 8, est_max = 8, est_prev = 0, est_at = $1::float8 - 0.5,
		    est_plateau = 0, est_guess = false, cut_below = false, acc_cut = 2, ref_cut = 0, acc_rate = 7,
		    acc_at = $1::float8 - 0.1, acc_from = $1::float8 - 30, jitter_at = $1::float8 - 100, held_at = $1::float8 - 1.5,
		    hold_until = $1::float8 - 0.5, doubled_at = $1::float8 - 1.5, meas_window = 1, meas_window_at = $1::float8 - 1.5
		    WHERE platform = $2`, now, name); err != nil {
			t.Fatal(err)
		}
		reportAnswers(t, pool, name, tune, now, true, now-0.01, 1/7.68, 1, 0)
		var est float64
		if err := pool.QueryRow(ctx, `SELECT est FROM fleetpace_pace WHERE platform = $1`, name).Scan(&est); err != nil {
			t.Fatal(err)
		}
		return est
	}
	// A strict limiter: the start's cycle of one, then another after the
	// hold, with three answers to requests sent before the hold reported
	// after it (their processes heard of it late). Counted (as acc_cut
	// counts them: 5.16/s here against 6.72/s), a strict bucket of 8/s in
	// fleetpace bench adapt read its start at 3.6/s and took 40 s back.
	// Only the cycle's own requests count.
	if got, own := walk(tune, 3, 1, 1), walk(tune, 0, 1, 1); math.Abs(got[1]-own[1]) > 1e-9 {
		t.Errorf("a cycle of one after late answers: %.3f/s, without them %.3f/s; want the same", got[1], own[1])
	} else {
		t.Logf("a cycle of one after late answers: %.3f/s, without them %.3f/s", got[1], own[1])
	}
	if got, ctl := fromReading(tune), fromReading(control); math.Abs(got-ctl) > 1e-9 {
		t.Errorf("a refusal within calm of a cut from a reading: %.3f/s, the control %.3f/s; want the same", got, ctl)
	}
	// A fleet short of work (a start whose sources come due over its
	// first seconds): a strict limiter's cycle of one, then two accepted
	// 5 spacings apart and a refusal, a third of the slots its pace offered
	// unused and more. Read by the count, the second cycle is a window of
	// 2 (under 5/s); it reads as the control, cut by beta.
	gap = 5
	short, shortCtl := walk(tune, 0, 1, 2), walk(control, 0, 1, 2)
	noSent := tune
	noSent.cycleSent = 0
	shortAll := walk(noSent, 0, 1, 2)
	gap = 1
	t.Logf("a fleet short of work: %.2f/s (the control %.2f/s; read by the count %.2f/s)", short[1], shortCtl[1], shortAll[1])
	if math.Abs(short[1]-shortCtl[1]) > 1e-9 {
		t.Errorf("a fleet short of work: %.3f/s, the control %.3f/s; want the same", short[1], shortCtl[1])
	}
	if shortAll[1] > 5 {
		t.Errorf("read by the count whatever was sent, the short cycle read %.2f/s, not under 5/s: the test proves nothing", shortAll[1])
	}
	for _, c := range []struct {
		name     string
		accepted int
	}{{"a strict limiter", 1}, {"a bucket with a burst", 19}} {
		got, ctl := walk(tune, 0, c.accepted), walk(control, 0, c.accepted)
		if math.Abs(got[0]-ctl[0]) > 1e-9 {
			t.Errorf("%s: %.3f/s, the control %.3f/s; want the same", c.name, got[0], ctl[0])
		}
	}
}
