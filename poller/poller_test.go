package poller

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
)

// setup returns a self-advancing fake clock (every sleep ends at once, in
// virtual time) and a config that uses it, with a seeded random source.
func setup(t *testing.T, seed uint64) (*clocktest.Auto, Config) {
	t.Helper()
	c := clocktest.NewAuto()
	return c, Config{Clock: c, Rand: rand.New(rand.NewPCG(seed, 0x5eed)).Float64}
}

// scripted returns a cycle that replays outcomes ("found", "empty", "fail")
// and cancels ctx after the last one.
func scripted(cancel context.CancelFunc, outcomes ...string) Cycle {
	i := 0
	return func(ctx context.Context) (bool, error) {
		o := outcomes[i]
		i++
		if i == len(outcomes) {
			cancel()
		}
		switch o {
		case "found":
			return true, nil
		case "fail":
			return false, errors.New("database unreachable")
		default:
			return false, nil
		}
	}
}

func secs(ss ...float64) []time.Duration {
	out := make([]time.Duration, len(ss))
	for i, s := range ss {
		out[i] = time.Duration(s * float64(time.Second))
	}
	return out
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestScheduleProgression(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		base, max time.Duration
		outcomes  []bool
		want      []time.Duration
	}{
		{
			name: "doubles to the default cap", base: time.Second, max: 30 * time.Second,
			outcomes: []bool{false, false, false, false, false, false, false, false},
			want:     secs(1, 2, 4, 8, 16, 30, 30, 30),
		},
		{
			name: "work resets to base", base: time.Second, max: 30 * time.Second,
			outcomes: []bool{false, false, false, false, true, false, false, true, true},
			want:     secs(1, 2, 4, 8, 1, 1, 2, 1, 1),
		},
		{
			name: "cap that is not a power of two", base: time.Second, max: 5 * time.Second,
			outcomes: []bool{false, false, false, false, false},
			want:     secs(1, 2, 4, 5, 5),
		},
		{
			name: "max below base is raised to base", base: 2 * time.Second, max: time.Second,
			outcomes: []bool{false, false, true},
			want:     secs(2, 2, 2),
		},
		{
			name: "huge max does not overflow", base: time.Duration(math.MaxInt64 / 3), max: math.MaxInt64,
			outcomes: []bool{false, false, false},
			want:     []time.Duration{math.MaxInt64 / 3, 2 * (math.MaxInt64 / 3), math.MaxInt64},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := NewSchedule(tt.base, tt.max)
			var got []time.Duration
			for _, found := range tt.outcomes {
				got = append(got, s.Next(found))
			}
			if !equalDurations(got, tt.want) {
				t.Fatalf("schedule = %v, want %v", got, tt.want)
			}
		})
	}
}

// Run follows the schedule exactly: with jitter disabled, the sleeps are 30
// until the first cycle that finds work, then 1 after work, 1→2→4→…→30 while
// empty, back to 1 on work, and a failed cycle backs off like an empty one.
func TestRunExactSchedule(t *testing.T) {
	t.Parallel()
	clock, cfg := setup(t, 1)
	cfg.JitterRatio = NoJitter
	cfg.StartupJitter = NoStartupJitter
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	cycle := scripted(cancel,
		"empty", "empty", // 30 30: a loop starts settled
		"found",                                                       // 1
		"empty", "empty", "empty", "empty", "empty", "empty", "empty", // 1 2 4 8 16 30 30
		"found",                          // 1
		"empty", "fail", "fail", "empty", // 1 2 4 8
		"found", "found", "fail") // 1 1 (then cancelled)
	if err := Run(ctx, cfg, cycle); err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := secs(30, 30, 1, 1, 2, 4, 8, 16, 30, 30, 1, 1, 2, 4, 8, 1, 1)
	if !equalDurations(clock.Sleeps(), want) {
		t.Fatalf("sleeps = %v, want %v", clock.Sleeps(), want)
	}
}

// A failed cycle backs off exactly like an empty one, and is logged.
func TestFailedCycleBacksOffLikeEmpty(t *testing.T) {
	t.Parallel()
	run := func(outcome string) ([]time.Duration, string) {
		clock, cfg := setup(t, 7) // same seed → same jitter draws
		var logs bytes.Buffer
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		cfg.StartupJitter = NoStartupJitter
		outcomes := []string{"found", outcome, outcome, outcome, outcome, outcome, outcome, outcome, "found"}
		if err := Run(ctx, cfg, scripted(cancel, outcomes...)); err != nil {
			t.Fatalf("Run: %v", err)
		}
		return clock.Sleeps(), logs.String()
	}
	empty, emptyLogs := run("empty")
	failed, failedLogs := run("fail")
	if !equalDurations(empty, failed) {
		t.Fatalf("failed-cycle sleeps %v differ from empty-cycle sleeps %v", failed, empty)
	}
	// The jittered sleeps still follow the backoff: the 6th after work is
	// ≥ 0.5 × 30 s.
	if failed[6] < 15*time.Second {
		t.Fatalf("6th sleep after failures = %v, want ≥ 15s (schedule 30s × [0.5, 1.5])", failed[6])
	}
	if n := strings.Count(failedLogs, "cycle failed"); n != 7 {
		t.Fatalf("logged %d failed cycles, want 7; logs:\n%s", n, failedLogs)
	}
	if !strings.Contains(failedLogs, "database unreachable") {
		t.Fatalf("log does not carry the cycle's error:\n%s", failedLogs)
	}
	if emptyLogs != "" {
		t.Fatalf("empty cycles logged something:\n%s", emptyLogs)
	}
}

// With a fixed draw the jittered sleeps are exact, the base sleep included,
// and the zero Config uses the documented defaults (startup jitter up to 30 s,
// ratio 0.5, base 1 s).
func TestRunDefaultsAndExactJitter(t *testing.T) {
	t.Parallel()
	clock, cfg := setup(t, 1)
	cfg.Rand = func() float64 { return 0.25 } // factor 1 − 0.5 + 2·0.5·0.25 = 0.75
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var firstPoll time.Duration
	calls := 0
	cycle := func(context.Context) (bool, error) {
		calls++
		if calls == 1 {
			firstPoll = clock.Elapsed()
		}
		if calls == 4 {
			cancel()
		}
		return calls == 2, nil // empty, found, empty, empty
	}
	if err := Run(ctx, cfg, cycle); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if firstPoll != 7500*time.Millisecond {
		t.Fatalf("first poll at %v, want 7.5s (0.25 × default max 30s)", firstPoll)
	}
	want := secs(7.5, 22.5, 0.75, 0.75) // startup, max 30s (settled), base 1s, 1s — each × 0.75
	if !equalDurations(clock.Sleeps(), want) {
		t.Fatalf("sleeps = %v, want %v", clock.Sleeps(), want)
	}
}

// Property: over many random draws and outcomes, every sleep lies in
// [1−j, 1+j] × the schedule, and the draws actually cover that range.
func TestEverySleepWithinJitterBounds(t *testing.T) {
	t.Parallel()
	for _, j := range []float64{0.1, 0.5, 1} {
		t.Run(fmt.Sprintf("j=%v", j), func(t *testing.T) {
			t.Parallel()
			clock, cfg := setup(t, uint64(j*1000))
			cfg.JitterRatio = j
			cfg.StartupJitter = NoStartupJitter
			outcomes := rand.New(rand.NewPCG(99, 1))
			var found []bool
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			const cycles = 20000
			cycle := func(context.Context) (bool, error) {
				f := outcomes.IntN(4) == 0
				found = append(found, f)
				if len(found) == cycles {
					cancel()
				}
				if !f && outcomes.IntN(3) == 0 {
					return false, errors.New("boom")
				}
				return f, nil
			}
			if err := Run(ctx, cfg, cycle); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if len(clock.Sleeps()) != cycles-1 {
				t.Fatalf("%d sleeps, want %d", len(clock.Sleeps()), cycles-1)
			}
			sched := NewSchedule(DefaultBase, DefaultMax)
			sched.Settle()
			minRatio, maxRatio := math.Inf(1), math.Inf(-1)
			for i, got := range clock.Sleeps() {
				s := sched.Next(found[i])
				lo := time.Duration(float64(s) * (1 - j))
				hi := time.Duration(float64(s) * (1 + j))
				if got < lo || got > hi {
					t.Fatalf("sleep %d = %v outside [%v, %v] (schedule %v, j=%v)", i, got, lo, hi, s, j)
				}
				r := float64(got) / float64(s)
				minRatio, maxRatio = min(minRatio, r), max(maxRatio, r)
			}
			if minRatio > 1-j+0.01 || maxRatio < 1+j-0.01 {
				t.Fatalf("jitter factors span [%.3f, %.3f], want close to [%.3f, %.3f]", minRatio, maxRatio, 1-j, 1+j)
			}
		})
	}
}

func TestJitterAndStartupDelayPure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"jitter u=0 is the low end", Jitter(10*time.Second, 0.5, 0), 5 * time.Second},
		{"jitter u=0.5 is the schedule", Jitter(10*time.Second, 0.5, 0.5), 10 * time.Second},
		{"jitter u=0.75", Jitter(10*time.Second, 0.5, 0.75), 12500 * time.Millisecond},
		{"ratio 1 can reach zero", Jitter(10*time.Second, 1, 0), 0},
		{"ratio 0 is identity", Jitter(10*time.Second, 0, 0.9), 10 * time.Second},
		{"startup u=0", StartupDelay(30*time.Second, 0), 0},
		{"startup u=0.5", StartupDelay(30*time.Second, 0.5), 15 * time.Second},
		{"startup disabled", StartupDelay(0, 0.5), 0},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

// pollTimes starts n loops at the same virtual instant and returns, for
// each, the offset of its k-th poll (k = 1: the first poll).
func pollTimes(t *testing.T, n, k int, configure func(*Config)) []time.Duration {
	t.Helper()
	out := make([]time.Duration, n)
	for i := range n {
		clock, cfg := setup(t, uint64(i))
		configure(&cfg)
		ctx, cancel := context.WithCancel(t.Context())
		calls := 0
		err := Run(ctx, cfg, func(context.Context) (bool, error) {
			calls++
			if calls == k {
				out[i] = clock.Elapsed()
				cancel()
			}
			return false, nil
		})
		cancel()
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	return out
}

// buckets counts offsets per 1-s bucket over [0, span).
func buckets(offsets []time.Duration, span time.Duration) []int {
	b := make([]int, int(span/time.Second))
	for _, o := range offsets {
		i := int(o / time.Second)
		if i >= len(b) {
			i = len(b) - 1 // the closed end of [0, span] belongs to the last bucket
		}
		b[i]++
	}
	return b
}

// A fleet restarted at once: 1,000 loops started at the same instant have first
// polls spread over [0, max], with no 1-s bucket above 3× the mean.
func TestStartupJitterSpreadsFirstPolls(t *testing.T) {
	t.Parallel()
	const n = 1000
	offsets := pollTimes(t, n, 1, func(*Config) {}) // defaults: max 30 s, startup jitter = max
	for i, o := range offsets {
		if o < 0 || o > DefaultMax {
			t.Fatalf("loop %d first poll at %v, outside [0, %v]", i, o, DefaultMax)
		}
	}
	b := buckets(offsets, DefaultMax)
	mean := float64(n) / float64(len(b))
	for i, c := range b {
		if float64(c) > 3*mean {
			t.Fatalf("bucket %ds holds %d first polls, above 3× the mean %.1f; buckets %v", i, c, mean, b)
		}
		if float64(c) < mean/3 {
			t.Fatalf("bucket %ds holds only %d first polls: not spread over [0, max]; buckets %v", i, c, b)
		}
	}
	t.Logf("first polls per 1-s bucket (mean %.1f): %v", mean, b)
}

// The naive loop of the incident (no startup jitter, no per-sleep jitter)
// fails the same property: all 1,000 first polls land in one bucket, and the
// herd stays aligned at every later poll.
func TestNaiveScheduleClusters(t *testing.T) {
	t.Parallel()
	const n = 1000
	naive := func(c *Config) {
		c.StartupJitter = NoStartupJitter
		c.JitterRatio = NoJitter
	}
	b := buckets(pollTimes(t, n, 1, naive), DefaultMax)
	mean := float64(n) / float64(len(b))
	if b[0] != n || float64(b[0]) <= 3*mean {
		t.Fatalf("naive first polls per bucket = %v, want all %d in bucket 0 (above 3× mean %.1f)", b, n, mean)
	}
	sixth := pollTimes(t, n, 6, naive) // after 5 × 30 s of empty cycles
	for i, o := range sixth {
		if o != 150*time.Second {
			t.Fatalf("naive loop %d polled the 6th time at %v, want exactly 150s (phase-aligned)", i, o)
		}
	}

	// Per-sleep jitter alone (startup jitter off) re-scatters the same herd.
	jittered := pollTimes(t, n, 6, func(c *Config) { c.StartupJitter = NoStartupJitter })
	jb := buckets(jittered, 5*time.Minute)
	for i, c := range jb {
		if c > n*15/100 {
			t.Fatalf("with per-sleep jitter, bucket %ds still holds %d of %d 6th polls; buckets %v", i, c, n, jb)
		}
	}
}

// Cancelling ctx during a long sleep stops Run at once: the clock never
// moves, so only the cancellation can end the sleep.
func TestPromptStop(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   Config
		calls int // cycles run before the sleep that is cut short
	}{
		{"during the backoff sleep", Config{Base: time.Hour, Max: time.Hour, StartupJitter: NoStartupJitter}, 1},
		{"during the startup sleep", Config{Base: time.Hour, Max: time.Hour, Rand: func() float64 { return 0.99 }}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := clocktest.New()
			tt.cfg.Clock = c
			ctx, cancel := context.WithCancel(t.Context())
			var calls atomic.Int32
			done := make(chan error, 1)
			go func() {
				done <- Run(ctx, tt.cfg, func(context.Context) (bool, error) {
					calls.Add(1)
					return false, nil
				})
			}()
			clocktest.WaitSleepers(t, c, 1) // Run is in its hour-long sleep
			if n := calls.Load(); n != int32(tt.calls) {
				t.Fatalf("cycle called %d times before the sleep, want %d", n, tt.calls)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run returned %v, want nil on cancellation", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return after cancel")
			}
			if n := calls.Load(); n != int32(tt.calls) {
				t.Fatalf("cycle called %d times in all, want %d (none after the cancel)", n, tt.calls)
			}
		})
	}
}

// StartupSleep draws the delay from Rand and sleeps it on Clock, as Run
// does before its first cycle; disabled, it does not sleep.
func TestStartupSleep(t *testing.T) {
	t.Parallel()
	c := clocktest.NewAuto()
	d, err := Config{Clock: c, Max: 10 * time.Second, Rand: func() float64 { return 0.3 }}.StartupSleep(t.Context())
	if err != nil || d != 3*time.Second || c.Elapsed() != 3*time.Second {
		t.Fatalf("StartupSleep = %v, %v after %v of virtual time; want 3s (0.3 × max 10s), nil, 3s", d, err, c.Elapsed())
	}
	d, err = Config{Clock: c, StartupJitter: NoStartupJitter}.StartupSleep(t.Context())
	if err != nil || d != 0 || len(c.Sleeps()) != 1 {
		t.Fatalf("disabled StartupSleep = %v, %v, sleeps %v; want no sleep", d, err, c.Sleeps())
	}
}

// A cycle that fails because ctx ended is not logged as a failure, and a
// cancelled ctx never runs a cycle.
func TestStopDuringCycle(t *testing.T) {
	t.Parallel()
	_, cfg := setup(t, 1)
	var logs bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.StartupJitter = NoStartupJitter
	ctx, cancel := context.WithCancel(t.Context())
	err := Run(ctx, cfg, func(ctx context.Context) (bool, error) {
		cancel()
		return false, ctx.Err()
	})
	if err != nil || logs.Len() != 0 {
		t.Fatalf("Run = %v, logs %q; want nil and no log", err, logs.String())
	}

	called := false
	if err := Run(ctx, cfg, func(context.Context) (bool, error) { called = true; return false, nil }); err != nil || called {
		t.Fatalf("Run on a cancelled ctx = %v, cycle called %v; want nil, false", err, called)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		cfg   Config
		field string // "" = valid
	}{
		{"zero value", Config{}, ""},
		{"jitter disabled", Config{JitterRatio: NoJitter, StartupJitter: NoStartupJitter}, ""},
		{"jitter 1", Config{JitterRatio: 1}, ""},
		{"jitter above 1", Config{JitterRatio: 1.5}, "JitterRatio"},
		{"jitter NaN", Config{JitterRatio: math.NaN()}, "JitterRatio"},
		{"negative base", Config{Base: -time.Second}, "Base"},
		{"negative max", Config{Max: -time.Second}, "Max"},
		{"max below base", Config{Base: 10 * time.Second, Max: 5 * time.Second}, "Max"},
		{"base above default max", Config{Base: time.Minute}, "Max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig naming %s", err, tt.field)
			}
			called := false
			if err := Run(t.Context(), tt.cfg, func(context.Context) (bool, error) { called = true; return false, nil }); !errors.Is(err, ErrInvalidConfig) || called {
				t.Fatalf("Run = %v (cycle called %v), want ErrInvalidConfig before any cycle", err, called)
			}
		})
	}
}

// A restarted idle fleet polls at its steady rate from the start: after the
// startup delay a loop that finds nothing sleeps the top of its schedule,
// so 1,000 loops make about 2 polls each in their first 2 × Max, as idle
// loops do. A loop that ramps up from Base after its start (1, 2, 4, 8,
// 16 s: the schedule unsettled, computed here from the same pieces) makes
// about 5: a restarted fleet would poll several times its steady rate.
func TestRestartedIdleLoopPollsAtSteadyRate(t *testing.T) {
	t.Parallel()
	const n, window = 1000, 2 * DefaultMax
	total := 0
	for i := range n {
		clock, cfg := setup(t, uint64(i))
		ctx, cancel := context.WithCancel(t.Context())
		err := Run(ctx, cfg, func(context.Context) (bool, error) {
			if clock.Elapsed() >= window {
				cancel()
				return false, nil
			}
			total++
			return false, nil
		})
		cancel()
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	ramped := 0
	for i := range n {
		_, cfg := setup(t, uint64(i))
		sched := NewSchedule(DefaultBase, DefaultMax) // not settled
		for at := StartupDelay(DefaultMax, cfg.Rand()); at < window; at += Jitter(sched.Next(false), DefaultJitterRatio, cfg.Rand()) {
			ramped++
		}
	}
	got, naive := float64(total)/n, float64(ramped)/n
	t.Logf("polls per loop in the first %v: %.2f settled, %.2f ramping from base", window, got, naive)
	if got > 2.6 {
		t.Fatalf("a restarted idle loop polled %.2f times in its first %v, want about 2 (its steady rate)", got, window)
	}
	if naive < 4 {
		t.Fatalf("the ramping loop polled only %.2f times: this test would not catch a ramp", naive)
	}
}
