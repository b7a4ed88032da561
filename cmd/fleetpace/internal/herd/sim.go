package herd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
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
	d := c.withDefaults()
	switch {
	case c.Pollers < 0 || c.Pollers > MaxPollers:
		return invalid("Pollers %d must be in 1..%d", c.Pollers, MaxPollers)
	case c.Backends < 0:
		return invalid("Backends %d must be ≥ 1", c.Backends)
	}
	if err := checkPolling(c.ClaimTime, c.Base, c.Max, d.Base, d.Max, c.JitterRatio); err != nil {
		return err
	}
	switch {
	case c.Duration < 0 || d.Duration > 24*time.Hour:
		return invalid("Duration %s must be in (0, 24h]", c.Duration)
	case c.RetryDelay < 0:
		return invalid("RetryDelay %s must be > 0", c.RetryDelay)
	case c.RetryFor < 0:
		return invalid("RetryFor %s must be > 0", c.RetryFor)
	case c.AttemptCost < NoAttemptCost:
		return invalid("AttemptCost %s must be ≥ 0", c.AttemptCost)
	case c.Cores < 0:
		return invalid("Cores %d must be ≥ 1", c.Cores)
	case c.Parallel < 0:
		return invalid("Parallel %d must be ≥ 1", c.Parallel)
	}
	s := d.Scenario
	switch s.Kind {
	case Restart, DBRestart, Saturation:
	default:
		return invalid("Scenario.Kind %q is not one of %s, %s, %s", s.Kind, Restart, DBRestart, Saturation)
	}
	switch {
	case c.Scenario.At < 0:
		return invalid("Scenario.At %s must not be negative", c.Scenario.At)
	case c.Scenario.For < 0:
		return invalid("Scenario.For %s must be > 0", c.Scenario.For)
	case math.IsNaN(c.Scenario.Slowdown) || math.IsInf(c.Scenario.Slowdown, 0) || c.Scenario.Slowdown < 0 || (c.Scenario.Slowdown > 0 && c.Scenario.Slowdown < 1):
		return invalid("Scenario.Slowdown %v must be ≥ 1", c.Scenario.Slowdown)
	case s.Hold < 0 || s.Hold >= d.Backends:
		return invalid("Scenario.Hold %d must be in 0..Backends−1 (%d)", s.Hold, d.Backends-1)
	case s.Kind != Restart && s.At+s.For > d.Duration:
		return invalid("Scenario.At + For (%s) must be ≤ Duration %s", s.At+s.For, d.Duration)
	}
	seen := map[Mode]bool{}
	for _, m := range c.Modes {
		if seen[m] {
			return invalid("Modes lists %s twice", m)
		}
		seen[m] = true
	}
	return nil
}

func (c SimConfig) withDefaults() SimConfig {
	c.Pollers = cmp.Or(c.Pollers, DefaultPollers)
	c.Backends = cmp.Or(c.Backends, DefaultBackends)
	orDefault(&c.ClaimTime, DefaultClaimTime)
	orDefault(&c.Base, poller.DefaultBase)
	orDefault(&c.Max, poller.DefaultMax)
	c.JitterRatio = cmp.Or(c.JitterRatio, poller.DefaultJitterRatio)
	orDefault(&c.RetryDelay, DefaultRetryDelay)
	orDefault(&c.RetryFor, DefaultRetryFor)
	orDefault(&c.AttemptCost, DefaultAttemptCost)
	if c.AttemptCost < 0 {
		c.AttemptCost = 0
	}
	c.Cores = cmp.Or(c.Cores, DefaultCores)
	c.Seed = cmp.Or(c.Seed, DefaultSeed)
	if len(c.Modes) == 0 {
		c.Modes = AllModes()
	}
	c.Parallel = cmp.Or(c.Parallel, runtime.GOMAXPROCS(0))
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
// checkPolling checks the polling schedule the simulation and the drill
// share: the settings as given, and Base and Max with their defaults.
func checkPolling(claimTime, base, max, dBase, dMax time.Duration, jitterRatio float64) error {
	switch {
	case claimTime < 0:
		return invalid("ClaimTime %s must be > 0", claimTime)
	case base < 0:
		return invalid("Base %s must be > 0", base)
	case max < 0 || dMax < dBase:
		return invalid("Max %s must be ≥ Base %s", dMax, dBase)
	case math.IsNaN(jitterRatio) || jitterRatio < 0 || jitterRatio > 1:
		return invalid("JitterRatio %v must be in (0, 1]", jitterRatio)
	}
	return nil
}

// invalid is the error of a bad field: format, wrapping ErrInvalidConfig.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

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
