package pacer

import (
	"math"
	"time"
)

// tuning is every number the shared statements decide by. It is passed with
// each statement (the schema's fleetpace_pace_* functions read it as t[1…]),
// so this file is the one place they are set. See docs/design.md,
// "Adaptive pacing", for why each is what it is.
type tuning struct {
	// approach is how long the pace takes to climb from just under the
	// estimate (what the destination surely accepts) to just under the rate
	// the refusal came at: a cubic, fast at first and flat at the end, so
	// the fleet spends most of it near the limit; when the two are one, a
	// plateau.
	approach time.Duration
	// climb is the coefficient of the cubic climb past the refusal's rate:
	// the pace is that × (1 − margin) × (1 + climb × x³), x seconds after
	// the approach (×1.1 after 7 s, ×1.7 after 13 s).
	climb float64
	// margin is how far under its estimate the fleet settles: refusals at
	// a strict limiter's spacing edge come from jitter, not from the rate.
	margin float64
	// late is how late after its slot a request may leave; slack how long
	// it may then take to reach the destination (Config.LateBudget,
	// SendSlack).
	late, slack time.Duration
	// beta is the cut when refusals go on within calm of a decrease: the
	// pace restarts from the rate the refused request was sent at × beta,
	// or what the destination accepted if lower.
	beta float64
	// heldFloor: where a destination holds the fleet briefly (Retry-After
	// of at most measureMin), a refusal cuts the estimate to what was
	// accepted per unit of time, holds included, but to no less than this
	// share of its upper reading: after a burst at the ceiling a strict
	// limiter's penalty holds pull the accepted rate far under what it
	// allows. The same as beta: a cut of the one kind compounded with the
	// other (0.35) took a strict bucket of 8/s 12 s to reach. A lone
	// refusal (nearly every answer since the last decrease accepted) is
	// no burst: it is not cut by the accepted rate.
	heldFloor float64
	// bisect: a refusal right after a decrease, or at a start, is a bound
	// on the limit, not a reading: the approach aims at the geometric mean
	// of the restart and the bound. Off only in TestEstimateStartsFast's
	// control.
	bisect bool
	// restart: with no reading of the limit (the first refusal, at the
	// ceiling's pace; a limit that moved down), the pace restarts from this
	// share of the refused rate, a halving.
	restart float64
	// calm: a refusal later than this after the latest decrease starts a
	// new episode (its estimate is what the fleet got answered).
	calm time.Duration
	// jitterMemory: a lone refusal below the estimate is jitter unless
	// another came within this.
	jitterMemory time.Duration
	// measureMin, measureMax bound the time constant of the answered-rate
	// measurement (the longest hold a destination asked for lately).
	measureMin, measureMax time.Duration
	// Re-spacing and announcements.
	lead         time.Duration // respaceLead
	respaceRatio float64
	announced    float64 // announcedShare
	maxHold      time.Duration
	resetMemory  time.Duration
	probeMargin  float64 // 'multiplier' mode
	probeSteps   float64 // 'multiplier' mode
	// climbRate: under this estimate (requests/s) the plateau at a
	// reading and the climb past it take longer in proportion, so a probe
	// past the limit comes after as many requests as at climbRate, not
	// after as many seconds: each probe costs a refusal (a fixed window of
	// 2/s refused 3.4 % over 5 minutes at 4, 1.8 % at 8, in the
	// simulation). An approach to a bound is not slowed. Above 8 a limit
	// of 8/s that doubles is found after more than 30 s.
	climbRate float64
	// dropGuess: a destination that holds and refuses, right after a
	// refusal below a reading, a pace below the estimate again has moved
	// its limit down: restart from a guess (docs/design.md, "Adaptive
	// pacing"). Off only in TestEstimateFollowsADrop's control.
	dropGuess bool
	// steep: once the cubic climb has gone this far past the reading
	// without a refusal, the limit has moved up (or the reading was low):
	// the climb then doubles the pace every steepDouble, so a limit that
	// doubled is found in seconds, not in the cubic's minute. 0: the
	// cubic all along (a test's control).
	steep       float64
	steepDouble time.Duration
	// guard: within calm of the estimate's setting (the refusal's hold and
	// the calm after it) the fleet settles guard × margin under the curve.
	// A refusal then reads as a decrease that was not enough (a deeper cut,
	// or a limit that dropped); on a loaded machine requests 5–10 ms late
	// at a strict limiter of 8/s (4 % is 5 ms) made that reading of plain
	// jitter, and the pace spent 20 s at half the limit. 2 since a late
	// slot is given up past the margin (lateMargin): 3 cost a strict
	// bucket of 14/s two requests a probe and bought nothing the simulation
	// or the bench could tell. 1: no guard (a test's control).
	guard float64
	// boundApproach is the approach's length when it aims at a bound's
	// bisection (a start, a cut right after a decrease) rather than at a
	// reading: that target is a guess, and the sooner the fleet is there
	// the sooner a guess too high is refused (within seconds of a drop,
	// not ten) and one too low climbed past (a limit of 8/s that doubled
	// was found after 26 s at 12, 12.5 s at 8, in the simulation).
	boundApproach time.Duration
	// probeBisect: a probe's refusal (the pace at most steep past the
	// level last accepted) reads the geometric mean of that level and the
	// refused pace, not the refused pace; and a refusal below a reading
	// younger than an approach is no jitter. A fixed window lets a probe
	// run over its quota until one of its windows gets one too many (a
	// window of 2/s was refused at 2.3/s), and the walk back down by the
	// margin cost a hold per step: 3.6 % of a 2/s window's requests were
	// refused over 10–70 s, 1.8 % with it, in the simulation. Off only in
	// TestProbeRefusalBisects's control.
	probeBisect bool
	// confirmedPlateau: once a probe's refusal reads what the reading
	// before it did (within two margins), the plateau at the reading
	// lasts this much longer (on the climb's clock) before the next probe.
	// Each probe costs a refusal and its hold: a strict bucket of 8/s
	// answering Retry-After: 1 was probed every 20 s, and that and the
	// margin were 0.894 of its limit over 10 minutes (every 24 s with
	// this, in the simulation 0.896 → 0.914 over 40–180 s). A limit that
	// rose is found by the next probe, this much later: a doubled 8/s
	// that rose 1.3 s after a probe's refusal was reached (0.85 × for
	// 5 s) 25 s after it without, 29 s with 4 s, 30 s with 5 s, 31 s with
	// 6 s (30.5 s with 4 s at the refusal's instant: its hold): the 30-s
	// bound is what sets it. 0: every plateau is approach long (a test's
	// control).
	confirmedPlateau time.Duration
	// confirmUnder: a refusal under a reading younger than an approach
	// confirms the reading it leads to as a probe's does (within two
	// margins of the one before): the probe read the limit a little high,
	// and the two refusals bracket it. A fixed window lets a probe run
	// over its quota until one of its windows fills, so a 1-s window of
	// 10/s is refused twice a cycle, and the second reading was probed
	// again as soon as a new one: every 22 s, 26 s with this (in the
	// simulation, seconds 10–180, medians of 3: 0.907 → 0.921, a window
	// of 8/s 0.901 → 0.907). Off only in a test's control.
	confirmUnder bool
	// prevBisect: a refusal under a reading younger than an approach,
	// above the reading a refusal raised it from (by at most twice steep),
	// reads the geometric mean of the two, within calm too (no cut ×
	// beta). A fixed window
	// lets a probe run over its quota until one of its windows fills, and
	// a climb turned steep meanwhile was refused 20–30 % over the quota
	// and read as a limit that moved up: the pace at that reading, refused
	// within calm, was cut × beta (a 1-s window of 10/s: 12.0/s, then
	// 7.4/s, 18 s to climb back); after calm the reading walked down by
	// the margin, a refusal and a hold a step. Off only in a test's
	// control.
	prevBisect bool
	// prevWide: with prevBisect, a refusal under the reading before too
	// (above the pace at it, a margin under) reads the geometric mean of
	// that pace and the refused one, and a probe refused past a bound's
	// target remembers the target as the reading before. Both were cut ×
	// beta within calm on a 1-s window of 10/s over 10 minutes (11.62/s
	// refused at 10.22/s: 7.16/s; 13.62/s after a bound: 8.39/s). Off
	// only in a test's control.
	prevWide bool
	// rescale: when the measurement window changes (a hold longer than
	// any lately), the accepted and refused rates averaged over the old
	// one are carried to the new one. Read as if averaged over the new
	// one, a 10-s window of 20 refused 2.2 s into a run (Retry-After 8)
	// read 6.9/s, four times what it accepts, and the fleet walked down
	// from there for 40 s. Off only in a test's control.
	rescale bool
	// youngClock: a reading is younger than an approach on the climb's
	// clock, which runs slower in proportion under climbRate (as the
	// plateau at it does), not in seconds. In seconds, a 1-s window of 2/s
	// that a probe read 6 % over its quota, refused 17 s later at the pace
	// under the reading, took that refusal for jitter, kept the reading
	// and was refused again every half minute. Off only in a test's
	// control.
	youngClock bool
	// lagRead: a probe refused past the steep turn, with a Retry-After,
	// reads the geometric mean of the refused pace and the pace the fleet
	// sent one hold (at most measureMin) before, which was accepted: the
	// destination answers a pace it saw a while ago (a fixed window when
	// one of its windows fills), and the steep climb runs on meanwhile. A
	// bucket of 8/s that doubled read 18.3/s, and the guard's pace under
	// that was refused and cut to 11.3/s. Off only in a test's control.
	lagRead bool
	// cycleHold: where the destination holds the fleet for longer than
	// measureMin (a window or a log at least that long), a refusal under
	// a young reading held for longer than this reads no more than what
	// was accepted from the end of the hold before to the end of this
	// one: a fixed window's quota over its length (its holds end at its
	// resets). Read as the refused pace, a 10-s window of 20 walked down
	// from 2.77/s by the margin, a refusal and a hold a step. A hold of a
	// second (Retry-After: 1) is a strict limiter's next slot or a
	// sliding log's next expiry, rounded up, not a window's rest: read,
	// a log of 66 per 10 s read 6.0/s. 0: off (a test's control).
	cycleHold time.Duration
	// plateauExcess: a refusal of the plateau under a young reading (the
	// pace under it, steady since the hold before) reads no more than the
	// refused pace × N/(N+1), N the requests accepted at it since: the
	// destination let the pace through until it had one request too many,
	// so the limit lies at least one request in N+1 under it. No more than
	// a margin under it, whatever N: a fixed window refuses sooner or later
	// by its phase, and a step of two margins left a 1-s window of 2 paced
	// 8 % under its quota in the simulation. Read as the refused pace, a
	// 1-s window of 2 read at 2.41/s walked down by the margin, a refusal
	// and a hold a step, five refusals in a minute. Not under the reading
	// this one was raised from when the refused pace is over it: that
	// level's pace was accepted. Off only in a test's control.
	plateauExcess bool
	// startCycle: a refusal with no reading to stand on (a start's, or
	// one within calm of a cut on a bound's approach, not of a cut from a
	// reading: a strict limiter's jitter there refuses after a few
	// requests, and its cycle is mostly the hold), held by the destination for a
	// short while (measureMin at most: a 1-s window's rest, a bucket's
	// penalty), with at least two requests sent since the hold before
	// accepted (not a strict limiter's lone one; counted by their slots, not
	// by when their answers arrived), reads no more than the geometric
	// mean of the upper reading and what was accepted over the cycle (from
	// the end of the hold before to the end of this one), nor than the
	// count accepted per second of the hold (a window of that length),
	// nor less than startCycle × the upper reading. Cut by beta a refusal,
	// a 1-s window of 2 under a ceiling of 20/s walked down from 10/s in
	// five refusals and holds over 8–11 s. It assumes the fleet sent at its
	// pace through the cycle: a fleet short of work (a start whose sources
	// come due over its first seconds) that had two accepted in a cycle
	// reads as a window of 2 (docs/benchmarks.md: the cycle read again).
	// 0: off (a test's control).
	startCycle float64
	// cycleSent: startCycle reads a cycle only where the fleet sent at
	// least this share of the slots the refused pace offered since the
	// hold before (what was accepted, and the refusal). A start whose
	// sources come due over its first seconds sent two requests in a
	// second at 9.6/s, and the count read a strict bucket of 8/s as a
	// window of 2 (3.6/s; 0.85 of it reached after 49 s). A window's
	// cycle sends at its pace until the window fills. 0: whatever it sent
	// (a test's control).
	cycleSent float64
	// holdCursor: where an event's hold (or pause) reaches its horizon —
	// every granted slot after the pivot given back — the cursor goes to
	// the hold's end, not a spacing past the horizon (t[39]).
	holdCursor bool
	// winMin: a destination whose refusals' resets (now + Retry-After)
	// lie on one grid of whole seconds, at least this long, is a fixed
	// window: the fleet takes its quota per window at the ceiling and
	// holds at the window's end (docs/design.md, "A learned window").
	// Paced under the quota, a 10-s window of 20 was 0.91–0.95 of what it
	// allows, where a client that sends through every hold takes all of it
	// (refused 40 %). Shorter windows answer Retry-After: 1 anywhere in
	// them, which puts no grid in sight. The first long hold (a
	// Retry-After of 2 s or more) of a window not learned yet is a trial:
	// from its end the fleet sends at the ceiling until the next refusal,
	// one window later. 0: no window is learned or tried (a test's
	// control).
	winMin time.Duration
	// winTol is how much later than the destination's reset a refusal's
	// reset bound may be: a Retry-After in whole seconds is rounded up by
	// up to one, and the report reaches the database after the answer. A
	// learned window's requests end this long before its grid's next
	// point.
	winTol time.Duration
	// winProbe: after this many windows filled to the learned quota
	// without a refusal, the quota grows by one (a limit that rose is found
	// a request at a time; a probe refused costs a refusal at the window's
	// end, where the fleet holds anyway).
	winProbe int
	// shareBySlack: the margin an announced rate is paced under
	// (1 − announced) is divided by the slack the destination showed: the
	// largest Remaining it answered lately + 1, at most its limit. A quota
	// of many requests per window, or a bucket with a burst, absorbs a late
	// or an early request that a strict limiter does not; a strict one
	// announcing q=8;w=1 answers Remaining 0 every time (read by its limit,
	// nginx's rule refused 4.4 % of a fleet paced at 0.996 of it). false:
	// announced everywhere (a test's control).
	shareBySlack bool
	// lateMargin: paced by the destination (slower than the ceiling), a
	// request may leave at most the margin's share of its spacing after
	// its slot (never more than the late budget). The margin is all the
	// pace leaves between the spacing granted and the destination's: a
	// request later than that, followed by one on time, reaches a strict
	// limiter sooner after it than the limiter's spacing and is refused,
	// and the refusal costs the fleet its hold (a second, at a bucket
	// answering Retry-After: 1). Later than that, the slot is given up
	// (ErrLate) and the caller takes the next: one slot lost instead. Go
	// side only (Sleep and the send-by check); false: the late budget
	// alone (a test's control).
	lateMargin bool
}

// defaultTuning is the pacer's tuning.
func defaultTuning(late time.Duration) tuning {
	return tuning{
		approach:      12 * time.Second,
		climb:         3e-4,
		margin:        0.04,
		late:          late,
		slack:         SendSlack + epochPrecision,
		beta:          0.7,
		heldFloor:     0.7,
		restart:       0.5,
		bisect:        true,
		calm:          2 * time.Second,
		jitterMemory:  30 * time.Second,
		measureMin:    2 * time.Second,
		measureMax:    60 * time.Second,
		lead:          respaceLead,
		respaceRatio:  respaceRatio,
		announced:     announcedShare,
		maxHold:       MaxHold,
		resetMemory:   resetMemory,
		probeMargin:   probeMargin,
		probeSteps:    probeSteps,
		climbRate:     8,
		dropGuess:     true,
		steep:         0.1,
		steepDouble:   4 * time.Second,
		guard:         2,
		boundApproach: 8 * time.Second,
		probeBisect:   true,

		confirmedPlateau: 4 * time.Second,
		confirmUnder:     true,
		prevBisect:       true,
		prevWide:         true,
		rescale:          true,
		youngClock:       true,
		lagRead:          true,
		cycleHold:        1500 * time.Millisecond,
		plateauExcess:    true,
		startCycle:       0.4,
		cycleSent:        1.0 / 3,
		holdCursor:       true,
		winMin:           3 * time.Second,
		winTol:           1250 * time.Millisecond,
		winProbe:         8,
		shareBySlack:     true,
		lateMargin:       true,
	}
}

// epochPrecision is what the schedule leaves for rounding: times are epoch
// seconds in float8, about a microsecond apart at this century's epochs,
// and the arithmetic of a long schedule drifts by a few.
const epochPrecision = 100 * time.Microsecond

// tuneAnnounced is the index of the announced share in array (t[14]): a
// report that announces a quota passes its own share there.
const tuneAnnounced = 13

// array is t as the statements take it (t[1] is the first).
func (t tuning) array() []float64 {
	return []float64{
		t.approach.Seconds(), t.climb, t.margin, t.late.Seconds(), t.slack.Seconds(),
		t.beta, t.heldFloor, t.calm.Seconds(), t.jitterMemory.Seconds(),
		t.measureMin.Seconds(), t.measureMax.Seconds(),
		t.lead.Seconds(), t.respaceRatio, t.announced, t.maxHold.Seconds(), t.resetMemory.Seconds(),
		t.probeMargin, t.probeSteps, t.climbRate, boolFloat(t.dropGuess), t.restart, boolFloat(t.bisect),
		t.steep, t.steepDouble.Seconds(), t.guard, t.boundApproach.Seconds(), boolFloat(t.probeBisect),
		t.confirmedPlateau.Seconds(), boolFloat(t.confirmUnder), boolFloat(t.prevBisect),
		boolFloat(t.prevWide), boolFloat(t.rescale), boolFloat(t.youngClock),
		boolFloat(t.lagRead), t.cycleHold.Seconds(), boolFloat(t.plateauExcess), t.startCycle,
		t.cycleSent, boolFloat(t.holdCursor), t.winMin.Seconds(), t.winTol.Seconds(), float64(t.winProbe),
	}
}

// boolFloat is b as the statements' tuning takes it: 1 or 0.
func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ceilingTau is fleetpace_pace_tau: the burst tolerance, in seconds, a
// platform's schedule keeps once lateness is paid for.
func (t tuning) ceilingTau(rate float64, burst int) float64 {
	if rate <= 0 {
		return 0
	}
	return math.Max(float64(burst-1)/rate-math.Max(t.late.Seconds()+t.slack.Seconds()-1/rate, 0), 0)
}

// ceilingInterval is fleetpace_pace_ceiling: the shortest spacing the
// ceiling allows, seconds.
func (t tuning) ceilingInterval(rate float64, burst int) float64 {
	if rate <= 0 {
		return 0
	}
	return math.Max(1/rate, (1+t.late.Seconds()+t.slack.Seconds()+t.ceilingTau(rate, burst))/math.Max(math.Floor(rate+float64(burst)), 1))
}

// lateTolerance is how late a request may leave after a slot granted at
// spacing interval (seconds) on a platform of rate and burst. Paced by the
// destination (adaptation or an announced quota: slower than the ceiling),
// the late budget: a late request lands closer to the next one than the
// spacing the destination was found to allow, and a strict limiter refuses
// it, a fixed window counts one more. Paced by the ceiling, up to half the
// spacing, which the ceiling's rate + burst per second can pay for at a
// slow pace. Never more than keeps every 1-s window at the destination
// within rate + burst (floor(rate + burst) × interval − 1 − slack − tau,
// which is the late budget itself at a fast ceiling's spacing), and at
// least minLate.
func (t tuning) lateTolerance(rate float64, burst int, interval float64) time.Duration {
	if rate <= 0 || interval <= 0 {
		return minLate
	}
	bound := math.Max(math.Floor(rate+float64(burst)), 1)*interval - 1 - t.slack.Seconds() - t.ceilingTau(rate, burst)
	tol := math.Max(t.late.Seconds(), interval/2)
	if interval > t.ceilingInterval(rate, burst)*(1+1e-6) {
		tol = t.late.Seconds()
	}
	return max(secondsToDuration(math.Min(bound, tol)), minLate)
}

// marginLate is how late after its slot a request paced by the destination
// may leave by the slot's mapped time alone (see lateMargin): the margin's
// share of spacing interval, at least minLate; 0 where the ceiling paces
// (interval no longer than its spacing) or lateMargin is off. Unlike
// lateTolerance it leaves out how uncertain the mapping is: each process's
// mapping errs by its own bias, which no check of lateness can take back.
func (t tuning) marginLate(rate float64, burst int, interval float64) time.Duration {
	if !t.lateMargin || rate <= 0 || interval <= t.ceilingInterval(rate, burst)*(1+1e-6) {
		return 0
	}
	return max(secondsToDuration(interval*t.margin), minLate)
}
