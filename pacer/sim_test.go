package pacer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/ratelimit"
)

// A simulation runs a fleet of pacers — processes, each with callers that
// reserve, send and report — against one of the fake destination's limiters
// (fakedest.Limiter), on one discrete-event clock (clocktest.Sim) that every
// pacer also gives its statements (Config.TimeFromClock): minutes of
// virtual time against the real pacer and the real database, in seconds.
//
// Its callers wait on the pacer and send at their slots, so the fleet
// delivers whatever pace it is granted at once. A fleet of workers does
// not: each request is a job its worker fetches first, and a pace that
// rises faster than they follow is granted ahead of what reaches the
// destination. A change that moves the pace fast (docs/benchmarks.md: a
// bound's target passed steeply, better here, worse in `fleetpace bench
// adapt`) must be measured there too.

// simConfig is one simulation.
type simConfig struct {
	procs, callers int
	rate           float64 // the platform's ceiling
	burst          int
	adapt          string // "estimate" (default) or "multiplier"
	noHeaders      bool
	rule           fakedest.Rule // the destination
	// changes replaces the destination's rule at the given virtual times
	// (counted from the start).
	changes  []simChange
	duration time.Duration
	latency  time.Duration // from the send to the answer
	// late draws how late after its slot a caller sends (default: never).
	late func(r *randSource) time.Duration
	// lateWake draws how late after its slot a caller wakes before the
	// pacer checks its lateness (a loaded machine's timer, a paused
	// process: the lateness Sleep sees; default: never).
	lateWake func(r *randSource) time.Duration
	maxWait  time.Duration // default 2 s
	seed     uint64
	// pollOnly runs the pacers without the slow-down listener.
	pollOnly bool
	// tune changes every pacer's tuning (a test's control).
	tune func(*tuning)
}

type simChange struct {
	at   time.Duration
	rule fakedest.Rule
}

// lateWaker is a simulated caller's pacer whose sleeps end late now and
// then (simConfig.lateWake): it sleeps past the slot by a draw before the
// pacer's Sleep looks at the slot.
type lateWaker struct {
	p    *Pacer
	sim  *clocktest.Sim
	rng  *randSource
	draw func(r *randSource) time.Duration
}

func (l lateWaker) Reserve(ctx context.Context, platform string, maxWait time.Duration) (Reservation, error) {
	return l.p.Reserve(ctx, platform, maxWait)
}

func (l lateWaker) Sleep(ctx context.Context, res *Reservation) error {
	if d := l.draw(l.rng); d > 0 {
		if wait := res.Slot.Add(d).Sub(l.sim.Now()); wait > 0 {
			l.sim.Sleep(wait)
		}
	}
	return l.p.Sleep(ctx, res)
}

// someLate draws late by up to upTo (in microseconds, uniformly) for a share
// of the draws, 0 otherwise: simConfig.late's and lateWake's usual draw.
func someLate(share float64, upTo time.Duration) func(*randSource) time.Duration {
	return func(rng *randSource) time.Duration {
		if rng.Float64() < share {
			return time.Duration(rng.IntN(int(upTo/time.Microsecond))) * time.Microsecond
		}
		return 0
	}
}

// randSource is a simulated caller's random source.
type randSource = rand.Rand

// simArrival is a request at the destination.
type simArrival struct {
	at time.Duration // since the start
	ok bool
	// what the caller was granted (for debugging)
	caller string
	slot   time.Duration
	late   time.Duration
	block  bool
}

type simResult struct {
	cfg      simConfig
	arrivals []simArrival // in arrival order
	pressure []simPressure
	window   simWindow // the platform's learned window at the end
	state    State     // the platform's state at the end, as States reads it
	start    time.Time // the clock at the start (arrivals count from it)
}

// simWindow is a pace row's learned window (win_* columns).
type simWindow struct {
	len, phase, ra float64
	quota          int
	resets         []float64
}

// simPressure is what a report of pressure did.
type simPressure struct {
	at time.Duration
	r  ReportResult
}

// allowance is what a rule allows per second, in the long run.
func allowance(r fakedest.Rule) float64 {
	if r.Window > 0 {
		return float64(r.WindowLimit) / r.Window.Seconds()
	}
	return r.Rate
}

// runSim runs cfg and returns what the destination saw.
func runSim(t *testing.T, cfg simConfig) simResult {
	t.Helper()
	if cfg.adapt == "" {
		cfg.adapt = "estimate"
	}
	if cfg.maxWait == 0 {
		cfg.maxWait = 2 * time.Second
	}
	if cfg.burst == 0 {
		cfg.burst = 1
	}
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "sim", rate: cfg.rate, burst: cfg.burst, adapt: cfg.adapt,
		backoff: 1.5, recovery: 1.1, probe: true, noHeaders: cfg.noHeaders})
	sim := clocktest.NewSim()
	// Long enough for a notification to reach every process before the
	// clock moves on.
	sim.Settle = time.Millisecond
	start := sim.Now()
	end := start.Add(cfg.duration)

	var (
		mu       sync.Mutex
		lim      = fakedest.NewLimiter(cfg.rule)
		changes  = cfg.changes
		arrivals []simArrival
		pressure []simPressure
	)
	admit := func(now time.Time, caller string, res Reservation) fakedest.Decision {
		mu.Lock()
		defer mu.Unlock()
		for len(changes) > 0 && !start.Add(changes[0].at).After(now) {
			lim = fakedest.NewLimiter(changes[0].rule)
			changes = changes[1:]
		}
		d := lim.Admit(now)
		arrivals = append(arrivals, simArrival{at: now.Sub(start), ok: d.OK, caller: caller, slot: res.Slot.Sub(start), late: res.Late, block: res.FromBlock})
		return d
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var live atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, cfg.procs*cfg.callers)
	var pacers []*Pacer
	for i := range cfg.procs {
		p := newPacer(t, url, func(c *Config) {
			c.Clock, c.TimeFromClock, c.PollOnly, c.CleanBatch = sim, true, cfg.pollOnly, -1
		})
		if cfg.tune != nil {
			cfg.tune(&p.tuning)
			p.tune = p.tuning.array()
		}
		pacers = append(pacers, p)
		for j := range cfg.callers {
			rng := rand.New(rand.NewPCG(cfg.seed, uint64(i*1000+j)))
			live.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer live.Add(-1)
				var slotter Slotter = p
				if cfg.lateWake != nil {
					slotter = lateWaker{p: p, sim: sim, rng: rng, draw: cfg.lateWake}
				}
				for sim.Now().Before(end) {
					res, err := AcquireFrom(ctx, slotter, sim, "sim", cfg.maxWait)
					var we *WaitError
					switch {
					case errors.As(err, &we):
						// A job snoozes: back after the wait.
						sim.Sleep(max(we.Wait, 10*time.Millisecond))
						continue
					case ctx.Err() != nil:
						return
					case err != nil && ctx.Err() == nil:
						errs <- err
						return
					}
					if cfg.late != nil {
						if d := cfg.late(rng); d > 0 {
							sim.Sleep(d)
						}
					}
					d := admit(sim.Now(), fmt.Sprintf("%d.%d", i, j), res)
					sim.Sleep(max(cfg.latency, time.Millisecond))
					info := ratelimit.Parse(d.Header, sim.Now())
					fb := Feedback{Kind: Clean, Quota: info}
					if !d.OK {
						fb.Kind, fb.RetryAfter = Pressure, info.RetryAfter
					}
					rr, err := p.Report(ctx, "sim", res, fb)
					if err != nil {
						if ctx.Err() == nil {
							errs <- err
						}
						return
					}
					if fb.Kind == Pressure {
						mu.Lock()
						pressure = append(pressure, simPressure{at: sim.Now().Sub(start), r: rr})
						mu.Unlock()
					}
				}
			}()
		}
	}
	// A slow-down's notification is one more participant until every
	// process has applied it: on a loaded machine it can take longer than
	// Settle to arrive, and the clock must not move on meanwhile (up to a
	// second of real time, in case one is lost).
	lag := lagging{}
	participants := func() int {
		n := int(live.Load())
		if !cfg.pollOnly && lag.behind(pacers) {
			n++
		}
		return n
	}
	runErr := sim.Run(ctx, end, participants)
	t.Logf("simulation: waited for %d slow-downs to reach every process, %d never did within a second", lag.waits, lag.lost)
	// Every caller stops at its next wake-up: run the clock on until then.
	cancel()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	drain, stop := context.WithCancel(context.Background())
	go sim.Run(drain, end.Add(24*time.Hour), participants) //nolint:errcheck // stopped below
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("simulation: callers did not stop")
	}
	stop()
	if runErr != nil {
		t.Fatalf("simulation: %v", runErr)
	}
	select {
	case err := <-errs:
		t.Fatalf("simulation: %v", err)
	default:
	}
	var w simWindow
	if err := pool.QueryRow(context.Background(), `SELECT win_len, win_phase, win_ra, win_quota, win_resets
		FROM fleetpace_pace WHERE platform = 'sim' AND key = ''`).Scan(&w.len, &w.phase, &w.ra, &w.quota, &w.resets); err != nil {
		t.Fatalf("simulation: the learned window: %v", err)
	}
	// On the simulation's clock (the pacers' own).
	states, err := StatesOf(pacers[0].withTime(context.Background()), pool, []string{"sim"})
	if err != nil || len(states) != 1 {
		t.Fatalf("simulation: the platform's state: %v (%d rows)", err, len(states))
	}
	w.phase -= timeToEpoch(start)
	for i := range w.resets {
		w.resets[i] -= timeToEpoch(start)
	}
	mu.Lock()
	defer mu.Unlock()
	return simResult{cfg: cfg, arrivals: arrivals, pressure: pressure, window: w, state: states[0], start: start}
}

// between counts the accepted and refused arrivals in [from, to).
func (r simResult) between(from, to time.Duration) (ok, refused int) {
	for _, a := range r.arrivals {
		if a.at >= from && a.at < to {
			if a.ok {
				ok++
			} else {
				refused++
			}
		}
	}
	return ok, refused
}

// goodput is accepted requests per second in [from, to) over allow.
func (r simResult) goodput(from, to time.Duration, allow float64) float64 {
	ok, _ := r.between(from, to)
	return float64(ok) / (to - from).Seconds() / allow
}

// refusedShare is the share of refused arrivals in [from, to).
func (r simResult) refusedShare(from, to time.Duration) float64 {
	ok, refused := r.between(from, to)
	if ok+refused == 0 {
		return 0
	}
	return float64(refused) / float64(ok+refused)
}

// settled is when goodput first held ≥ share of allow for 5 s (-1: never).
func (r simResult) settled(allow, share float64) time.Duration {
	for from := time.Duration(0); from+5*time.Second <= r.cfg.duration; from += 500 * time.Millisecond {
		if r.goodput(from, from+5*time.Second, allow) >= share {
			return from + 5*time.Second
		}
	}
	return -1
}

// refusalsStop is how long after at the refusals stop: the start of the
// first stretch of clean long without one (from at itself when none came).
// reached is how soon after at the fleet first delivered ≥ share × allow
// for 5 s (the start of that span, in steps of 0.5 s), or -1: never.
func (r simResult) reached(at time.Duration, allow, share float64) time.Duration {
	for from := at; from+5*time.Second <= r.cfg.duration; from += 500 * time.Millisecond {
		if r.goodput(from, from+5*time.Second, allow) >= share {
			return from - at
		}
	}
	return -1
}

func (r simResult) refusalsStop(at, clean time.Duration) time.Duration {
	from := at
	for _, a := range r.arrivals {
		if a.at < at || a.ok {
			continue
		}
		if a.at-from >= clean {
			break
		}
		from = a.at
	}
	return from - at
}

// maxWindow is the most arrivals in any 1-s window.
func (r simResult) maxWindow() int {
	times := make([]time.Time, len(r.arrivals))
	for i, a := range r.arrivals {
		times[i] = time.Time{}.Add(a.at)
	}
	return fakedest.MaxInWindow(times, time.Second)
}

// timeline is goodput per 5 s and what each pressure did, for the log.
func (r simResult) timeline() string {
	allow := allowance(r.cfg.rule)
	out := "goodput per 5 s:"
	for from := time.Duration(0); from < r.cfg.duration; from += 5 * time.Second {
		ok, refused := r.between(from, from+5*time.Second)
		out += fmt.Sprintf(" %.2f", float64(ok)/5/allow)
		if refused > 0 {
			out += fmt.Sprintf("(%d)", refused)
		}
	}
	out += "\npressure:"
	for _, p := range r.pressure {
		what := "-"
		switch {
		case p.r.Increased:
			what = "cut"
		case p.r.Stale:
			what = "stale"
		case p.r.Jitter:
			what = "jitter"
		case p.r.AtMax:
			what = "max"
		}
		out += fmt.Sprintf(" %.2fs:%s→%.2f", p.at.Seconds(), what, p.r.Estimate)
	}
	return out
}

func (r simResult) String() string {
	allow := allowance(r.cfg.rule)
	d := r.cfg.duration
	return fmt.Sprintf("goodput 10–70 s %.3f, last half %.3f, 429s %.2f%% (last half %.2f%%), ≥0.85 for 5 s at %s, largest window %d",
		r.goodput(10*time.Second, min(70*time.Second, d), allow), r.goodput(d/2, d, allow),
		100*r.refusedShare(10*time.Second, d), 100*r.refusedShare(d/2, d),
		r.settled(allow, 0.85), r.maxWindow())
}

// lagging tells whether a slow-down one process applied has not reached
// another yet, and for how long.
type lagging struct {
	seq   map[string]int64 // per row, the newest event the last check found missing somewhere
	since time.Time        // real time since it has been missing
	gone  bool             // counted as lost
	waits int              // slow-downs waited for
	lost  int              // slow-downs still missing somewhere after a second
}

// behind reports whether some process has not applied the newest event
// another applied, for at most a second of real time per event.
func (l *lagging) behind(pacers []*Pacer) bool {
	seqs := make([]map[string]int64, len(pacers))
	newest := map[string]int64{}
	for i, p := range pacers {
		seqs[i] = map[string]int64{}
		p.mu.Lock()
		for name, st := range p.local {
			seqs[i][name] = st.last.seq
			newest[name] = max(newest[name], st.last.seq)
		}
		p.mu.Unlock()
	}
	missing := map[string]int64{}
	for name, n := range newest {
		for _, s := range seqs {
			if s[name] < n {
				missing[name] = n
			}
		}
	}
	if len(missing) == 0 {
		l.seq = nil
		return false
	}
	if !maps.Equal(missing, l.seq) {
		l.seq, l.since, l.gone = missing, time.Now(), false
		l.waits++
	}
	if time.Since(l.since) < time.Second {
		return true
	}
	if !l.gone {
		l.gone = true
		l.lost++
	}
	return false
}
