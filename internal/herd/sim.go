package herd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fleetpace/fleetpace/poller"
)

// Defaults for SimConfig, from the outage: 11,543 pollers, a 368-backend
// pool, a claim query of 170 ms (which makes the fleet's steady state
// 11,543 / 30 s × 0.17 s ≈ 65 concurrent claims, as measured), and a retry
// that knocked for up to 10 s before the poll loop could back off.
const (
	DefaultPollers     = 11_543
	DefaultBackends    = 368
	DefaultClaimTime   = 170 * time.Millisecond
	DefaultRetryDelay  = 100 * time.Millisecond
	DefaultRetryFor    = 10 * time.Second
	DefaultAttemptCost = 2 * time.Millisecond
	DefaultCores       = 64
	DefaultSlowdown    = 10
	DefaultSeed        = 1
)

// MaxPollers bounds SimConfig.Pollers (memory: about 100 bytes a poller per
// mode simulated at once).
const MaxPollers = 1_000_000

// ErrInvalidConfig is wrapped by every configuration error, so a CLI can map
// it to a usage error.
var ErrInvalidConfig = errors.New("herd: invalid config")

// ScenarioKind names what happens to the fleet.
type ScenarioKind string

// Scenarios.
const (
	// Restart starts every poller at t=0 with a fresh schedule (a rollout,
	// or every process restarted after a database restart).
	Restart ScenarioKind = "restart"
	// DBRestart drops every connection of a warm fleet at At and refuses
	// every attempt for For.
	DBRestart ScenarioKind = "db-restart"
	// Saturation multiplies the claim time of a warm fleet by Slowdown and
	// takes Hold backends, from At for For.
	Saturation ScenarioKind = "saturation"
)

// Scenario configures the event the fleet goes through. The zero value is a
// mass restart.
type Scenario struct {
	// Kind is the scenario. Default: Restart.
	Kind ScenarioKind

	// At is when the database restart or the saturation window starts.
	// Default: Max. Ignored by Restart.
	At time.Duration

	// For is how long the database stays down or saturated. Default: 20 s
	// for DBRestart, 60 s for Saturation. Ignored by Restart.
	For time.Duration

	// Slowdown multiplies the claim time of claims started in the
	// saturation window. Default: 10 (Saturation only; 1 leaves the claim
	// time alone).
	Slowdown float64

	// Hold is how many backends something else takes during the saturation
	// window. Default: 0. Must be < Backends.
	Hold int
}

// SimConfig configures Simulate. The zero value is the outage's fleet under
// a mass restart, in every mode.
type SimConfig struct {
	// Pollers is the fleet size N. Default: DefaultPollers (11,543).
	Pollers int

	// Backends is the pool's cap K. Default: DefaultBackends (368).
	Backends int

	// ClaimTime is the claim query's service time S on an unloaded server.
	// Default: DefaultClaimTime (170 ms).
	ClaimTime time.Duration

	// Base, Max and JitterRatio are the pollers' schedule, as in
	// poller.Config. Defaults: poller.DefaultBase, DefaultMax,
	// DefaultJitterRatio. JitterRatio applies to the modes with per-cycle
	// jitter; startup jitter is drawn over [0, Max).
	Base, Max   time.Duration
	JitterRatio float64

	// Scenario is what happens to the fleet. Default: a mass restart.
	Scenario Scenario

	// Duration is how much virtual time is simulated. Default: 2 × Max for
	// Restart (every poller has started and backed off to Max: the restart's
	// transient), At + For + 10 × Max otherwise (long enough for a
	// re-synchronized fleet to show its herd again).
	Duration time.Duration

	// RetryDelay is how often a retry-on-acquire poller knocks again while
	// it holds its place. Default: DefaultRetryDelay (100 ms).
	RetryDelay time.Duration

	// RetryFor is how long a retry-on-acquire poller knocks before its cycle
	// fails. Default: DefaultRetryFor (10 s, the outage's retry budget).
	RetryFor time.Duration

	// AttemptCost is the server CPU one connection attempt costs, granted or
	// refused. Default: DefaultAttemptCost (2 ms). NoAttemptCost makes
	// attempts free.
	AttemptCost time.Duration

	// Cores is the server's CPU count that attempts compete for. Default:
	// DefaultCores (64).
	Cores int

	// Seed makes the run reproducible: the same seed, the same figures.
	// Default: DefaultSeed.
	Seed uint64

	// Modes are the modes simulated, each on its own fleet. Default:
	// AllModes().
	Modes []Mode

	// Parallel bounds how many modes are simulated at once. Default:
	// GOMAXPROCS. The result does not depend on it.
	Parallel int
}

// NoAttemptCost, as SimConfig.AttemptCost, makes connection attempts free.
const NoAttemptCost time.Duration = -1

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c SimConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	d := c.withDefaults()
	switch {
	case c.Pollers < 0 || c.Pollers > MaxPollers:
		return bad("Pollers %d must be in 1..%d", c.Pollers, MaxPollers)
	case c.Backends < 0:
		return bad("Backends %d must be ≥ 1", c.Backends)
	case c.ClaimTime < 0:
		return bad("ClaimTime %s must be > 0", c.ClaimTime)
	case c.Base < 0:
		return bad("Base %s must be > 0", c.Base)
	case c.Max < 0 || d.Max < d.Base:
		return bad("Max %s must be ≥ Base %s", d.Max, d.Base)
	case math.IsNaN(c.JitterRatio) || c.JitterRatio < 0 || c.JitterRatio > 1:
		return bad("JitterRatio %v must be in (0, 1]", c.JitterRatio)
	case c.Duration < 0 || d.Duration > 24*time.Hour:
		return bad("Duration %s must be in (0, 24h]", c.Duration)
	case c.RetryDelay < 0:
		return bad("RetryDelay %s must be > 0", c.RetryDelay)
	case c.RetryFor < 0:
		return bad("RetryFor %s must be > 0", c.RetryFor)
	case c.AttemptCost < NoAttemptCost:
		return bad("AttemptCost %s must be ≥ 0", c.AttemptCost)
	case c.Cores < 0:
		return bad("Cores %d must be ≥ 1", c.Cores)
	case c.Parallel < 0:
		return bad("Parallel %d must be ≥ 1", c.Parallel)
	}
	s := d.Scenario
	switch s.Kind {
	case Restart, DBRestart, Saturation:
	default:
		return bad("Scenario.Kind %q is not one of %s, %s, %s", s.Kind, Restart, DBRestart, Saturation)
	}
	switch {
	case c.Scenario.At < 0:
		return bad("Scenario.At %s must not be negative", c.Scenario.At)
	case c.Scenario.For < 0:
		return bad("Scenario.For %s must be > 0", c.Scenario.For)
	case math.IsNaN(s.Slowdown) || math.IsInf(s.Slowdown, 0) || c.Scenario.Slowdown < 0 || (c.Scenario.Slowdown > 0 && c.Scenario.Slowdown < 1):
		return bad("Scenario.Slowdown %v must be ≥ 1", c.Scenario.Slowdown)
	case s.Hold < 0 || s.Hold >= d.Backends:
		return bad("Scenario.Hold %d must be in 0..Backends−1 (%d)", s.Hold, d.Backends-1)
	case s.Kind != Restart && s.At+s.For > d.Duration:
		return bad("Scenario.At + For (%s) must be ≤ Duration %s", s.At+s.For, d.Duration)
	}
	seen := map[Mode]bool{}
	for _, m := range c.Modes {
		if seen[m] {
			return bad("Modes lists %s twice", m)
		}
		seen[m] = true
	}
	return nil
}

func (c SimConfig) withDefaults() SimConfig {
	if c.Pollers == 0 {
		c.Pollers = DefaultPollers
	}
	if c.Backends == 0 {
		c.Backends = DefaultBackends
	}
	orDefault(&c.ClaimTime, DefaultClaimTime)
	orDefault(&c.Base, poller.DefaultBase)
	orDefault(&c.Max, poller.DefaultMax)
	if c.JitterRatio == 0 {
		c.JitterRatio = poller.DefaultJitterRatio
	}
	orDefault(&c.RetryDelay, DefaultRetryDelay)
	orDefault(&c.RetryFor, DefaultRetryFor)
	orDefault(&c.AttemptCost, DefaultAttemptCost)
	if c.AttemptCost < 0 {
		c.AttemptCost = 0
	}
	if c.Cores == 0 {
		c.Cores = DefaultCores
	}
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	if len(c.Modes) == 0 {
		c.Modes = AllModes()
	}
	if c.Parallel == 0 {
		c.Parallel = runtime.GOMAXPROCS(0)
	}
	s := &c.Scenario
	if s.Kind == "" {
		s.Kind = Restart
	}
	if s.Kind == Restart {
		s.At, s.For, s.Slowdown, s.Hold = 0, 0, 1, 0
	} else {
		orDefault(&s.At, c.Max)
		switch s.Kind {
		case DBRestart:
			orDefault(&s.For, 20*time.Second)
			s.Slowdown, s.Hold = 1, 0
		case Saturation:
			orDefault(&s.For, 60*time.Second)
			if s.Slowdown == 0 {
				s.Slowdown = DefaultSlowdown
			}
		}
	}
	if c.Duration == 0 {
		if s.Kind == Restart {
			c.Duration = 2 * c.Max
		} else {
			c.Duration = s.At + s.For + 10*c.Max
		}
	}
	return c
}

// orDefault sets *v to def if it is zero.
func orDefault(v *time.Duration, def time.Duration) {
	if *v == 0 {
		*v = def
	}
}

// Mode is one way of polling: which jitter the schedule has and what a
// poller does when it cannot get a connection.
type Mode struct {
	// StartupJitter delays each poller's first cycle by U[0, Max).
	StartupJitter bool
	// CycleJitter multiplies every sleep by U[1−j, 1+j].
	CycleJitter bool
	// Retry keeps a refused poller knocking for RetryFor (retry-on-acquire)
	// instead of failing its cycle at once (fail-fast).
	Retry bool
}

// Named modes.
var (
	// Fleetpace is fleetpace's polling: both jitters, fail fast.
	Fleetpace = Mode{StartupJitter: true, CycleJitter: true}
	// Baseline is the outage's: a deterministic schedule and
	// retry-on-acquire.
	Baseline = Mode{Retry: true}
)

// AllModes returns the eight modes: the four schedules (deterministic,
// cycle jitter only, startup jitter only, both), each with retry-on-acquire
// and with fail-fast.
func AllModes() []Mode {
	var out []Mode
	for _, sched := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
		for _, retry := range []bool{true, false} {
			out = append(out, Mode{StartupJitter: sched[0], CycleJitter: sched[1], Retry: retry})
		}
	}
	return out
}

// ScheduleName is the mode's schedule: deterministic, cycle-jitter,
// startup-jitter or both-jitter.
func (m Mode) ScheduleName() string {
	switch {
	case m.StartupJitter && m.CycleJitter:
		return "both-jitter"
	case m.StartupJitter:
		return "startup-jitter"
	case m.CycleJitter:
		return "cycle-jitter"
	}
	return "deterministic"
}

// ConnName is the mode's connection policy: retry or fail-fast.
func (m Mode) ConnName() string {
	if m.Retry {
		return "retry"
	}
	return "fail-fast"
}

// String is "schedule/connection", e.g. "both-jitter/fail-fast".
func (m Mode) String() string { return m.ScheduleName() + "/" + m.ConnName() }

// Label is String with "(fleetpace)" or "(outage baseline)" appended where
// it applies.
func (m Mode) Label() string {
	switch m {
	case Fleetpace:
		return m.String() + " (fleetpace)"
	case Baseline:
		return m.String() + " (outage baseline)"
	}
	return m.String()
}

// ParseMode parses a Mode's String.
func ParseMode(s string) (Mode, error) {
	for _, m := range AllModes() {
		if m.String() == strings.TrimSpace(s) {
			return m, nil
		}
	}
	names := make([]string, 0, 8)
	for _, m := range AllModes() {
		names = append(names, m.String())
	}
	return Mode{}, fmt.Errorf("%w: mode %q is not one of %s", ErrInvalidConfig, s, strings.Join(names, ", "))
}

// SimResult is what Simulate measured.
type SimResult struct {
	// Config is the configuration run, defaults filled in.
	Config SimConfig `json:"-"`
	// Modes has one entry per mode, in Config.Modes order.
	Modes []ModeResult `json:"modes"`
	// Wall is the wall time the simulation took.
	Wall time.Duration `json:"-"`
}

// ModeResult is one mode's figures. Per-second series are indexed by the
// second of virtual time.
type ModeResult struct {
	Mode Mode `json:"-"`
	// Name is Mode.Label().
	Name string `json:"mode"`

	// Polls is the number of claims attempted (one per cycle, served or
	// refused) in each second.
	Polls []int `json:"polls_per_second"`
	// Served is the number of claims that got a backend in each second.
	Served []int `json:"served_per_second"`
	// Refused is the number of refused connection attempts in each second
	// (for retry, every knock counts).
	Refused []int `json:"refused_per_second"`
	// Busy and Pending are the most backends busy and pollers holding a
	// pending connection at any instant of each second.
	Busy    []int `json:"busy_max_per_second"`
	Pending []int `json:"pending_max_per_second"`

	PeakPolls    int     `json:"polls_peak"`
	MeanPolls    float64 `json:"polls_mean"`
	PeakToMean   float64 `json:"polls_peak_to_mean"`
	PeakServed   int     `json:"served_peak"`
	PeakBusy     int     `json:"busy_peak"`
	PeakPending  int     `json:"pending_peak"`
	RefusedTotal int64   `json:"refused"`
	FailedCycles int64   `json:"failed_cycles"`
	ServedTotal  int64   `json:"served"`
	MaxClaimTime float64 `json:"claim_time_max_seconds"`
	DrainSeconds float64 `json:"drain_seconds"`
	Drained      bool    `json:"drained"`
	Events       int64   `json:"events"`
}

// Simulate runs the simulation once per mode and returns the figures. It
// returns an error only for an invalid config or a cancelled ctx.
func Simulate(ctx context.Context, cfg SimConfig) (*SimResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	res := &SimResult{Config: cfg, Modes: make([]ModeResult, len(cfg.Modes))}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cfg.Parallel)
	for i, m := range cfg.Modes {
		g.Go(func() error {
			r, err := newSim(&cfg, m).run(gctx)
			if err != nil {
				return err
			}
			res.Modes[i] = *r
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	res.Wall = time.Since(start)
	return res, nil
}

// Mode returns the result of mode m, if it was simulated.
func (r *SimResult) Mode(m Mode) (ModeResult, bool) {
	for _, mr := range r.Modes {
		if mr.Mode == m {
			return mr, true
		}
	}
	return ModeResult{}, false
}

// EventEnd is when the scenario's event ends: the end of the saturation
// window or of the database outage, or 0 for a mass restart. Drain is
// measured from it.
func (c SimConfig) EventEnd() time.Duration {
	c = c.withDefaults()
	return c.Scenario.At + c.Scenario.For
}

// LongestSleep is the longest sleep a poller of any mode takes: Max × (1 +
// JitterRatio).
func (c SimConfig) LongestSleep() time.Duration {
	c = c.withDefaults()
	return time.Duration(float64(c.Max) * (1 + c.JitterRatio))
}

// Event kinds. Events at one instant are handled in the order they were
// scheduled.
const (
	evPhase  uint8 = iota // scenario boundary
	evDone                // a claim finished
	evGiveUp              // a retrier's budget ran out
	evPoll                // a poller wakes
	evTick                // 100-ms bookkeeping
)

type event struct {
	at   int64 // virtual ns
	seq  uint64
	who  int32
	gen  uint32
	kind uint8
}

func (a *event) less(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// eventHeap is a binary min-heap by (at, seq): ties are handled in the order
// they were scheduled, so a run is deterministic.
type eventHeap []event

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(&s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s[r].less(&s[l]) {
			m = r
		}
		if !s[m].less(&s[i]) {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// Poller states.
const (
	sleeping uint8 = iota
	pending
	claiming
)

type simPoller struct {
	sched *poller.Schedule
	gen   uint32
	state uint8
}

type waiter struct {
	who int32
	gen uint32
}

// claim is a claim in flight: it ends when the work clock reaches done.
type claim struct {
	who   int32
	gen   uint32
	done  float64 // work clock at which it ends
	start int64   // virtual ns, for the longest claim time
}

const tick = 100 * time.Millisecond

// sim is one mode's fleet. Not safe for concurrent use.
type sim struct {
	cfg   *SimConfig
	mode  Mode
	rnd   *rand.Rand
	ratio float64

	now  int64
	seq  uint64
	h    eventHeap
	ps   []simPoller
	fifo []waiter // pending pollers, oldest first; stale entries skipped
	head int

	busy, pending int
	down, window  bool

	// Claims in flight progress together at rate: 1 on an idle server,
	// less under attempt load or in the saturation window. work is the
	// claim work (in unloaded nanoseconds) every claim in flight has received
	// since the start; all claims need ClaimTime of it, so they end in the
	// order they started.
	work     float64
	rate     float64
	claims   []claim
	claimHd  int
	doneGen  uint32  // invalidates a stale completion event
	doneAt   float64 // work target the pending completion event is for
	doneRate float64 // rate it was computed with

	// attempts in the last 10 ticks (a sliding second), for the server load.
	ring    [10]int
	ringIdx int
	ringSum int
	knocks  float64 // retry knocks not yet attributed to a second

	r ModeResult
}

func newSim(cfg *SimConfig, m Mode) *sim {
	modeIdx := uint64(0)
	for i, am := range AllModes() {
		if am == m {
			modeIdx = uint64(i)
		}
	}
	s := &sim{cfg: cfg, mode: m, rnd: rand.New(rand.NewPCG(cfg.Seed, 0x6865726400+modeIdx))}
	if m.CycleJitter {
		s.ratio = cfg.JitterRatio
	}
	secs := int((cfg.Duration + time.Second - 1) / time.Second)
	s.r = ModeResult{Mode: m, Name: m.Label(), Polls: make([]int, secs), Served: make([]int, secs), Refused: make([]int, secs),
		Busy: make([]int, secs), Pending: make([]int, secs)}
	return s
}

func (s *sim) schedule(at int64, kind uint8, who int32, gen uint32) {
	s.seq++
	s.h.push(event{at: at, seq: s.seq, kind: kind, who: who, gen: gen})
}

func (s *sim) sec() int {
	i := int(s.now / int64(time.Second))
	return min(i, len(s.r.Polls)-1)
}

func (s *sim) capacity() int {
	if s.window {
		return s.cfg.Backends - s.cfg.Scenario.Hold
	}
	return s.cfg.Backends
}

func (s *sim) run(ctx context.Context) (*ModeResult, error) {
	cfg := s.cfg
	n := cfg.Pollers
	s.ps = make([]simPoller, n)
	s.h = make(eventHeap, 0, n+64)
	s.rate = 1
	if cfg.Scenario.Kind == Restart {
		for i := range s.ps {
			s.ps[i].sched = poller.NewSchedule(cfg.Base, cfg.Max)
			var d time.Duration
			if s.mode.StartupJitter {
				d = poller.StartupDelay(cfg.Max, s.rnd.Float64())
			}
			s.schedule(int64(d), evPoll, int32(i), 0)
		}
	} else {
		// A warm fleet: schedules backed off to Max, next polls spread over
		// [0, Max) — the same phases in every mode.
		warm := rand.New(rand.NewPCG(cfg.Seed, 0x7761726d))
		for i := range s.ps {
			sc := poller.NewSchedule(cfg.Base, cfg.Max)
			for sc.Next(false) <= cfg.Max/2 {
			}
			s.ps[i].sched = sc
			s.schedule(int64(float64(cfg.Max)*warm.Float64()), evPoll, int32(i), 0)
		}
		s.schedule(int64(cfg.Scenario.At), evPhase, 0, 0)
		s.schedule(int64(cfg.Scenario.At+cfg.Scenario.For), evPhase, 1, 0)
	}
	s.schedule(0, evTick, 0, 0)

	end := int64(cfg.Duration)
	for len(s.h) > 0 && s.h[0].at < end {
		e := s.h.pop()
		s.advance(e.at)
		s.r.Events++
		if s.r.Events&0xfffff == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		switch e.kind {
		case evPoll:
			if s.ps[e.who].gen == e.gen {
				s.poll(e.who)
			}
		case evDone:
			if e.gen == s.doneGen {
				s.doneAt = -1 // always schedule the next one
				s.completeClaims()
			}
		case evGiveUp:
			if p := &s.ps[e.who]; p.gen == e.gen && p.state == pending {
				s.pending--
				s.finish(e.who, true)
			}
		case evTick:
			s.onTick()
			s.schedule(e.at+int64(tick), evTick, 0, 0)
		case evPhase:
			s.phase(e.who == 0)
		}
		s.rescheduleDone()
	}
	s.advance(end)
	s.summarize()
	return &s.r, nil
}

// advance moves virtual time to t: the claims in flight progress, and the
// pending retriers' knocks since the last event are counted.
func (s *sim) advance(t int64) {
	if t <= s.now {
		return
	}
	dt := float64(t - s.now)
	if s.busy > 0 {
		s.work += s.rate * dt
	}
	if s.pending > 0 {
		s.knocks += float64(s.pending) * dt / float64(s.cfg.RetryDelay)
		if whole := math.Floor(s.knocks); whole > 0 {
			s.r.Refused[s.sec()] += int(whole)
			s.r.RefusedTotal += int64(whole)
			s.knocks -= whole
		}
	}
	s.now = t
}

func (s *sim) onTick() {
	s.ringIdx = (s.ringIdx + 1) % len(s.ring)
	s.ringSum -= s.ring[s.ringIdx]
	s.ring[s.ringIdx] = 0
	i := s.sec()
	s.r.Busy[i] = max(s.r.Busy[i], s.busy)
	s.r.Pending[i] = max(s.r.Pending[i], s.pending)
}

// phase starts (start=true) or ends the scenario's event.
func (s *sim) phase(start bool) {
	switch s.cfg.Scenario.Kind {
	case DBRestart:
		s.down = start
		if start {
			// Every claim in flight fails with its connection.
			for _, c := range s.claims[s.claimHd:] {
				if p := &s.ps[c.who]; p.gen == c.gen && p.state == claiming {
					s.busy--
					s.finish(c.who, true)
				}
			}
			s.claims, s.claimHd = s.claims[:0], 0
		}
	case Saturation:
		s.window = start
	}
	if !start {
		s.grantPending()
	}
}

// poll is one cycle's first connection attempt.
func (s *sim) poll(who int32) {
	i := s.sec()
	s.r.Polls[i]++
	s.ring[s.ringIdx]++
	s.ringSum++
	if s.down || s.busy >= s.capacity() {
		s.r.Refused[i]++
		s.r.RefusedTotal++
		if !s.mode.Retry {
			s.finish(who, true)
			return
		}
		p := &s.ps[who]
		p.gen++
		p.state = pending
		s.pending++
		s.r.Pending[i] = max(s.r.Pending[i], s.pending)
		s.fifo = append(s.fifo, waiter{who: who, gen: p.gen})
		s.schedule(s.now+int64(s.cfg.RetryFor), evGiveUp, who, p.gen)
		return
	}
	s.grant(who)
}

// grant gives who a backend for one claim.
func (s *sim) grant(who int32) {
	p := &s.ps[who]
	p.gen++
	p.state = claiming
	s.busy++
	i := s.sec()
	s.r.Served[i]++
	s.r.ServedTotal++
	s.r.Busy[i] = max(s.r.Busy[i], s.busy)
	s.claims = append(s.claims, claim{who: who, gen: p.gen, done: s.work + float64(s.cfg.ClaimTime), start: s.now})
}

// completeClaims ends every claim whose work is done.
func (s *sim) completeClaims() {
	freed := false
	for s.claimHd < len(s.claims) {
		c := s.claims[s.claimHd]
		if c.done > s.work+1e-3 {
			break
		}
		s.claimHd++
		if p := &s.ps[c.who]; p.gen != c.gen || p.state != claiming {
			continue
		}
		s.r.MaxClaimTime = max(s.r.MaxClaimTime, float64(s.now-c.start)/float64(time.Second))
		s.busy--
		s.finish(c.who, false)
		freed = true
	}
	if s.claimHd > 4096 && s.claimHd*2 > len(s.claims) {
		s.claims = append(s.claims[:0], s.claims[s.claimHd:]...)
		s.claimHd = 0
	}
	if freed {
		s.grantPending()
	}
}

// rescheduleDone recomputes the claims' rate and, if it or the oldest claim
// changed, schedules the next completion.
func (s *sim) rescheduleDone() {
	s.rate = s.claimRate()
	for s.claimHd < len(s.claims) {
		c := s.claims[s.claimHd]
		if p := &s.ps[c.who]; p.gen == c.gen && p.state == claiming {
			break
		}
		s.claimHd++
	}
	if s.claimHd == len(s.claims) {
		s.doneGen++
		s.doneAt, s.doneRate = 0, 0
		return
	}
	target := s.claims[s.claimHd].done
	if target == s.doneAt && s.rate == s.doneRate {
		return
	}
	s.doneGen++
	s.doneAt, s.doneRate = target, s.rate
	wait := math.Max(0, target-s.work) / s.rate
	s.schedule(s.now+int64(math.Ceil(wait)), evDone, 0, s.doneGen)
}

// claimRate is how fast claims progress: 1 on an idle server, divided by
// the saturation window's slowdown, times the share of CPU that connection
// attempts leave.
func (s *sim) claimRate() float64 {
	r := 1.0
	if s.window {
		r /= s.cfg.Scenario.Slowdown
	}
	if s.cfg.AttemptCost > 0 {
		perSec := float64(s.ringSum) + float64(s.pending)*float64(time.Second)/float64(s.cfg.RetryDelay)
		r *= 1 - min(0.95, perSec*s.cfg.AttemptCost.Seconds()/float64(s.cfg.Cores))
	}
	return r
}

// grantPending hands free backends to the longest-waiting retriers.
func (s *sim) grantPending() {
	if s.down {
		return
	}
	for s.pending > 0 && s.busy < s.capacity() && s.head < len(s.fifo) {
		w := s.fifo[s.head]
		s.head++
		if p := &s.ps[w.who]; p.gen != w.gen || p.state != pending {
			continue
		}
		s.pending--
		s.grant(w.who)
	}
	if s.head > 4096 && s.head*2 > len(s.fifo) {
		s.fifo = append(s.fifo[:0], s.fifo[s.head:]...)
		s.head = 0
	}
}

// finish ends who's cycle (failed or not; an idle fleet's cycle finds no
// work either way) and schedules its next poll the way poller.Run does.
func (s *sim) finish(who int32, failed bool) {
	p := &s.ps[who]
	if failed {
		s.r.FailedCycles++
	}
	p.gen++
	p.state = sleeping
	sleep := poller.Jitter(p.sched.Next(false), s.ratio, s.rnd.Float64())
	s.schedule(s.now+int64(sleep), evPoll, who, p.gen)
}

func (s *sim) summarize() {
	r := &s.r
	total := 0
	for _, v := range r.Polls {
		total += v
		r.PeakPolls = max(r.PeakPolls, v)
	}
	for _, v := range r.Served {
		r.PeakServed = max(r.PeakServed, v)
	}
	for _, v := range r.Busy {
		r.PeakBusy = max(r.PeakBusy, v)
	}
	for _, v := range r.Pending {
		r.PeakPending = max(r.PeakPending, v)
	}
	r.MeanPolls = float64(total) / s.cfg.Duration.Seconds()
	if r.MeanPolls > 0 {
		r.PeakToMean = float64(r.PeakPolls) / r.MeanPolls
	}
	// Drained: from the event's end to the end of the last second with a
	// refused attempt or a pending poller. It counts only if the run goes on
	// quietly after it for the longest sleep a poller takes, so a herd that
	// comes back every Max would have shown up.
	endSec := int(s.cfg.EventEnd() / time.Second)
	last := -1
	for i := endSec; i < len(r.Polls); i++ {
		if r.Refused[i] > 0 || r.Pending[i] > 0 {
			last = i
		}
	}
	if last >= 0 {
		r.DrainSeconds = max(0, float64(last+1)-s.cfg.EventEnd().Seconds())
	}
	r.Drained = float64(last+1)+s.cfg.LongestSleep().Seconds() <= s.cfg.Duration.Seconds()
	if !r.Drained {
		r.DrainSeconds = (s.cfg.Duration - s.cfg.EventEnd()).Seconds()
	}
}
