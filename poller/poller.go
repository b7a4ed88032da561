// Package poller runs a jittered polling loop: a random startup delay, then a
// cycle function called over and over with a deterministic backoff schedule
// whose every sleep is jittered.
//
// Why: pollers that start together (a rollout batch, every process after a
// database restart) and sleep fixed intervals stay phase-aligned forever and
// hit their database as one synchronized herd. A random startup delay spreads
// the first polls over [0, StartupJitter]; jittering every later sleep keeps
// loops that drift toward alignment scattered. The underlying schedule stays
// deterministic (Base, ×2 after an empty or failed cycle, capped at Max, back
// to Base when a cycle finds work), so backoff is predictable while the
// instants are not. A loop starts at the top of the schedule: until a cycle
// finds work, it sleeps Max, as a loop idle for long does — ramping up from
// Base after every start (1, 2, 4, 8, 16 s) would make a restarted idle
// fleet poll about five times its steady rate for its first Max. See
// docs/design.md, "Clock and polling".
//
// Typical use:
//
//	err := poller.Run(ctx, poller.Config{Max: 30 * time.Second, Logger: logger},
//		func(ctx context.Context) (bool, error) {
//			n, err := scan(ctx)
//			return n > 0, err
//		})
//
// The pure pieces (Schedule, Jitter, StartupDelay) are exported, and
// Config.StartupSleep sleeps the startup delay alone for a caller that must
// start something else after it (a worker starts its queue client), with the
// same clock and randomness as the loop.
package poller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// Defaults for Config.
const (
	DefaultBase        = time.Second
	DefaultMax         = 30 * time.Second
	DefaultJitterRatio = 0.5
)

// NoStartupJitter, as Config.StartupJitter, disables the startup delay (the
// first cycle runs at once). Any negative duration does the same. A CLI flag
// like `--startup-jitter 0` maps to it.
const NoStartupJitter time.Duration = -1

// Bounds of Config: a loop that polls more often than every MinBase is a
// busy loop, and one that sleeps longer than MaxSleep (Max, StartupJitter)
// has stopped.
const (
	MinBase  = 10 * time.Millisecond
	MaxSleep = time.Hour
)

// NoJitter, as Config.JitterRatio, disables per-sleep jitter (every sleep is
// exactly the schedule). Any negative ratio does the same.
const NoJitter float64 = -1

// ErrInvalidConfig is wrapped by every error Config.Validate returns, so a CLI
// can map it to a usage error.
var ErrInvalidConfig = errors.New("invalid config")

// Config configures a polling loop. The zero value is the design's default:
// base 1 s, max 30 s, jitter ratio 0.5, startup jitter up to max, the real
// clock, process-wide randomness, no logging.
type Config struct {
	// Base is the sleep after a cycle that found work, and the first step of
	// the backoff. Default: 1 s. Must not be negative.
	Base time.Duration

	// Max caps the backoff schedule. Default: 30 s. Must be ≥ Base.
	Max time.Duration

	// JitterRatio j: every sleep is the schedule's value multiplied by a
	// uniform draw from [1−j, 1+j]. Default (0): 0.5. Must be ≤ 1; NoJitter
	// (or any negative value) disables jitter.
	JitterRatio float64

	// StartupJitter bounds the sleep before the first cycle, drawn uniformly
	// from [0, StartupJitter]. Default (0): Max. NoStartupJitter (or any
	// negative value) disables it.
	StartupJitter time.Duration

	// Rand returns uniform draws from [0, 1). Default: math/rand/v2's
	// Float64, randomly seeded per process (so processes do not share draws).
	// Called only from the goroutine running Run.
	Rand func() float64

	// Clock is what the loop sleeps on. Default (nil): the real clock.
	// Tests inject a fake (internal/clocktest) and advance it.
	Clock clock.Clock

	// Logger receives a warning for every failed cycle. Default: discard.
	Logger *slog.Logger
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.Base < 0 || (c.Base > 0 && c.Base < MinBase) || c.Base > MaxSleep:
		return fmt.Errorf("%w: poller.Config.Base must be in [%s, %s] (0: default), got %s", ErrInvalidConfig, MinBase, MaxSleep, c.Base)
	case c.Max < 0 || c.Max > MaxSleep:
		return fmt.Errorf("%w: poller.Config.Max must be in [0, %s] (0: default), got %s", ErrInvalidConfig, MaxSleep, c.Max)
	case c.StartupJitter > MaxSleep:
		return fmt.Errorf("%w: poller.Config.StartupJitter must be at most %s, got %s", ErrInvalidConfig, MaxSleep, c.StartupJitter)
	case math.IsNaN(c.JitterRatio) || c.JitterRatio > 1:
		return fmt.Errorf("%w: poller.Config.JitterRatio must be in [0, 1] (or negative to disable), got %v", ErrInvalidConfig, c.JitterRatio)
	}
	d := c.withDefaults()
	if d.Max < d.Base {
		return fmt.Errorf("%w: poller.Config.Max (%s) must be ≥ poller.Config.Base (%s)", ErrInvalidConfig, d.Max, d.Base)
	}
	return nil
}

// withDefaults returns c with every zero field set to its default and the
// "disabled" sentinels normalized to 0.
func (c Config) withDefaults() Config {
	if c.Base == 0 {
		c.Base = DefaultBase
	}
	if c.Max == 0 {
		c.Max = DefaultMax
	}
	switch {
	case c.JitterRatio == 0:
		c.JitterRatio = DefaultJitterRatio
	case c.JitterRatio < 0:
		c.JitterRatio = 0
	}
	switch {
	case c.StartupJitter == 0:
		c.StartupJitter = c.Max
	case c.StartupJitter < 0:
		c.StartupJitter = 0
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Cycle is one poll. found reports whether it found work (the next sleep is
// Base); an empty cycle or an error backs the schedule off. An error is
// logged and never stops the loop.
type Cycle func(ctx context.Context) (found bool, err error)

// Run validates cfg, sleeps the startup delay, then calls cycle until ctx
// ends, sleeping the jittered schedule between calls. The schedule starts
// settled (Schedule.Settle): an empty first cycle is followed by Max, a
// cycle that finds work by Base.
//
// Run returns nil when ctx ends — that is the normal way to stop it, and it
// returns promptly, mid-sleep included (a cycle in progress is given ctx and
// is expected to return). The only error it returns is an invalid Config,
// before any sleep or cycle.
func Run(ctx context.Context, cfg Config, cycle Cycle) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()

	if _, err := cfg.startupSleep(ctx); err != nil {
		return nil
	}

	sched := NewSchedule(cfg.Base, cfg.Max)
	sched.Settle()
	for ctx.Err() == nil {
		found, err := cycle(ctx)
		if ctx.Err() != nil {
			return nil // stopping; a cycle cut short by ctx is not a failure
		}
		if err != nil {
			found = false
		}
		next := sched.Next(found)
		sleep := Jitter(next, cfg.JitterRatio, cfg.Rand())
		if err != nil {
			cfg.Logger.WarnContext(ctx, "poller: cycle failed; backing off",
				slog.Any("error", err), slog.Duration("schedule", next), slog.Duration("sleep", sleep))
		}
		if err := clock.Sleep(ctx, cfg.Clock, sleep); err != nil {
			return nil
		}
	}
	return nil
}

// StartupSleep sleeps the startup delay — StartupDelay(StartupJitter,
// Rand()) on Clock, defaults applied — or until ctx ends (returning its
// error), and returns the delay drawn. Run does this before its first cycle;
// a caller that starts something else after the delay calls it itself and
// then runs the loop with StartupJitter NoStartupJitter. A delay is logged
// at info level.
func (c Config) StartupSleep(ctx context.Context) (time.Duration, error) {
	return c.withDefaults().startupSleep(ctx)
}

// startupSleep is StartupSleep on a config whose defaults are applied.
func (c Config) startupSleep(ctx context.Context) (time.Duration, error) {
	if c.StartupJitter <= 0 {
		return 0, ctx.Err()
	}
	d := StartupDelay(c.StartupJitter, c.Rand())
	if d > 0 {
		c.Logger.InfoContext(ctx, "startup jitter", slog.Duration("sleep", d.Round(time.Millisecond)))
	}
	return d, clock.Sleep(ctx, c.Clock, d)
}

// Schedule is the deterministic, unjittered backoff schedule: the sleep after
// the k-th consecutive empty or failed cycle is min(Base·2^(k−1), Max); the
// sleep after a cycle that found work is Base, and the backoff restarts from
// Base. The zero value is not usable; use NewSchedule. Not safe for
// concurrent use.
type Schedule struct {
	base, max, cur time.Duration
}

// NewSchedule returns a schedule starting at base and capped at max (max is
// raised to base if smaller).
func NewSchedule(base, max time.Duration) *Schedule {
	if max < base {
		max = base
	}
	return &Schedule{base: base, max: max, cur: base}
}

// Settle moves the schedule to its top, as after a long idle spell: the next
// empty or failed cycle sleeps Max; a cycle that finds work still brings it
// back to Base. Run settles its schedule before the first cycle, so a
// poller that has just started, knowing nothing of its work, polls at the
// rate of an idle one instead of ramping up from Base.
func (s *Schedule) Settle() { s.cur = s.max }

// Next returns the sleep to take after a cycle whose outcome is found, and
// advances the schedule.
func (s *Schedule) Next(found bool) time.Duration {
	if found {
		s.cur = s.base
		return s.base
	}
	d := s.cur
	if s.cur > s.max/2 {
		s.cur = s.max
	} else {
		s.cur *= 2
	}
	return d
}

// Jitter returns d multiplied by 1−ratio+2·ratio·u, which for u uniform in
// [0, 1) is uniform in [(1−ratio)·d, (1+ratio)·d). ratio ≤ 0 returns d.
func Jitter(d time.Duration, ratio, u float64) time.Duration {
	if ratio <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 - ratio + 2*ratio*u))
}

// StartupDelay returns max·u: for u uniform in [0, 1) a delay uniform in
// [0, max). max ≤ 0 returns 0.
func StartupDelay(max time.Duration, u float64) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(float64(max) * u)
}
