package herd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func simulate(t *testing.T, cfg SimConfig) *SimResult {
	t.Helper()
	r, err := Simulate(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func only(t *testing.T, r *SimResult, m Mode) ModeResult {
	t.Helper()
	mr, ok := r.Mode(m)
	if !ok {
		t.Fatalf("mode %s not simulated", m)
	}
	return mr
}

// TestBookkeepingFailFast checks every event of a tiny fleet by hand: 3
// deterministic fail-fast pollers, 2 backends, 0.5-s claims, schedule
// 1 s → 4 s, settled at 4 s from the start (as poller.Run), free connection
// attempts.
//
//	t=0    p0 p1 served (end 0.5); p2 refused, sleeps 4 → 4.0
//	t=0.5  p0 p1 end, sleep 4 → 4.5
//	t=4.0  p2 served (end 4.5)
//	t=4.5  p0 served (end 5.0); p1 refused (scheduled before p2's end: p2
//	       still holds one), sleeps 4 → 8.5; p2 ends, sleeps 4 → 8.5
//	t=5.0  p0 ends, sleeps 4 → 9.0
func TestBookkeepingFailFast(t *testing.T) {
	t.Parallel()
	r := only(t, simulate(t, SimConfig{Pollers: 3, Backends: 2, ClaimTime: 500 * time.Millisecond, Base: time.Second,
		Max: 4 * time.Second, Duration: 6 * time.Second, AttemptCost: NoAttemptCost, Modes: []Mode{{}}}), Mode{})
	check := func(name string, got, want []int) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s per second = %v, want %v", name, got, want)
		}
	}
	check("polls", r.Polls, []int{3, 0, 0, 0, 3, 0})
	check("served", r.Served, []int{2, 0, 0, 0, 2, 0})
	check("refused", r.Refused, []int{1, 0, 0, 0, 1, 0})
	check("busy", r.Busy, []int{2, 0, 0, 0, 2, 0})
	check("pending", r.Pending, []int{0, 0, 0, 0, 0, 0})
	if r.RefusedTotal != 2 || r.FailedCycles != 2 || r.ServedTotal != 4 || r.PeakBusy != 2 || r.PeakPending != 0 {
		t.Errorf("totals: refused %d failed %d served %d peak busy %d peak pending %d, want 2 2 4 2 0",
			r.RefusedTotal, r.FailedCycles, r.ServedTotal, r.PeakBusy, r.PeakPending)
	}
	if r.MaxClaimTime != 0.5 {
		t.Errorf("longest claim %v s, want 0.5", r.MaxClaimTime)
	}
	if r.PeakPolls != 3 || r.MeanPolls != 1 || r.PeakToMean != 3 {
		t.Errorf("polls peak %d mean %v peak/mean %v, want 3 1 3", r.PeakPolls, r.MeanPolls, r.PeakToMean)
	}
	// The last refusal is in second 4, but a drain counts only after a
	// quiet longest sleep (4 s × 1.5): not within this 6-s run.
	if r.Drained || r.DrainSeconds != 6 {
		t.Errorf("drain %v s (drained %v), want not drained (6 s)", r.DrainSeconds, r.Drained)
	}
}

// TestBookkeepingRetry checks retry-on-acquire by hand: 3 deterministic
// pollers, 1 backend, 0.5-s claims, knocking every 0.1 s for 1 s, schedule
// settled at 4 s.
//
//	t=0    p0 served (end 0.5); p1 p2 refused, pending until 1.0
//	t=0.5  p0 ends, sleeps 4 → 4.5; p1, the oldest pending, served (end 1.0)
//	t=1.0  p2 gives up (failed cycle), sleeps 4 → 5.0; p1 ends, sleeps 4 → 5.0
//	t=4.5  p0 served (end 5.0)
//	t=5.0  p2 p1 refused, pending; p0 ends (sleeps 4 → 9.0); p2 served (end 5.5)
//	t=5.5  p2 ends; p1 served (end 6.0)
//
// Knocks: 2 pending for 0.5 s and 1 for 0.5 s in second 0 (10 + 5), 1 for
// 0.5 s in second 5 (5).
func TestBookkeepingRetry(t *testing.T) {
	t.Parallel()
	r := only(t, simulate(t, SimConfig{Pollers: 3, Backends: 1, ClaimTime: 500 * time.Millisecond, Base: time.Second,
		Max: 4 * time.Second, Duration: 6 * time.Second, AttemptCost: NoAttemptCost, RetryFor: time.Second,
		Modes: []Mode{Baseline}}), Baseline)
	for _, c := range []struct {
		name      string
		got, want []int
	}{
		{"polls", r.Polls, []int{3, 0, 0, 0, 1, 2}},
		{"served", r.Served, []int{2, 0, 0, 0, 1, 2}},
		{"refused", r.Refused, []int{2 + 15, 0, 0, 0, 0, 2 + 5}},
		{"pending", r.Pending, []int{2, 0, 0, 0, 0, 2}}, // p1 and p2 for an instant at 5.0
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s per second = %v, want %v", c.name, c.got, c.want)
		}
	}
	if r.FailedCycles != 1 || r.PeakPending != 2 || r.RefusedTotal != 24 {
		t.Errorf("failed %d, peak pending %d, refused %d; want 1, 2, 24", r.FailedCycles, r.PeakPending, r.RefusedTotal)
	}
	if r.Drained || r.DrainSeconds != 6 {
		t.Errorf("drain %v s (drained %v): refused in the last second, want not drained", r.DrainSeconds, r.Drained)
	}
}

// TestAttemptCostSlowsClaims: with attempts costing CPU, a claim started
// while retriers knock takes longer than the claim time.
func TestAttemptCostSlowsClaims(t *testing.T) {
	t.Parallel()
	cfg := SimConfig{Pollers: 200, Backends: 1, ClaimTime: 100 * time.Millisecond, Duration: 5 * time.Second,
		Cores: 1, AttemptCost: time.Millisecond, Modes: []Mode{Baseline}}
	slow := only(t, simulate(t, cfg), Baseline)
	cfg.AttemptCost = NoAttemptCost
	free := only(t, simulate(t, cfg), Baseline)
	if free.MaxClaimTime > 0.1000001 {
		t.Errorf("free attempts: longest claim %v s, want 0.1", free.MaxClaimTime)
	}
	// 199 pending knocking 10×/s at 1 ms each take a whole core: u = 0.95.
	if slow.MaxClaimTime < 1.9 {
		t.Errorf("costly attempts: longest claim %v s, want ≈ 2 s (0.1 s / (1 − 0.95))", slow.MaxClaimTime)
	}
}

// TestMassRestartTarget is the first target at the outage's defaults: after
// a mass restart fleetpace's polls peak at most twice their mean, while
// the deterministic schedule (the negative control) puts all N in one
// second.
func TestMassRestartTarget(t *testing.T) {
	t.Parallel()
	r := simulate(t, SimConfig{})
	fp := only(t, r, Fleetpace)
	if fp.PeakToMean > 2 {
		t.Errorf("fleetpace: polls/s peak/mean %.2f (peak %d, mean %.0f), want ≤ 2", fp.PeakToMean, fp.PeakPolls, fp.MeanPolls)
	}
	for _, m := range []Mode{{}, Baseline} {
		d := only(t, r, m)
		if d.Polls[0] != DefaultPollers {
			t.Errorf("%s: %d polls in second 0, want all %d", m, d.Polls[0], DefaultPollers)
		}
		if d.PeakToMean <= 2 {
			t.Errorf("negative control %s: polls/s peak/mean %.2f, want > 2", m, d.PeakToMean)
		}
	}
	// Startup jitter is what spreads a restart; cycle jitter alone does not.
	if cj := only(t, r, Mode{CycleJitter: true}); cj.PeakToMean <= 2 {
		t.Errorf("cycle jitter only: peak/mean %.2f, want > 2", cj.PeakToMean)
	}
}

// TestSaturationTarget is the second target: after a saturation window
// fail-fast drains within one max poll interval, while retry-on-acquire
// builds the wall (thousands of pending connections, knocks by the
// million) and the outage's baseline never drains.
func TestSaturationTarget(t *testing.T) {
	t.Parallel()
	for _, kind := range []ScenarioKind{Saturation, DBRestart} {
		cfg := SimConfig{Scenario: Scenario{Kind: kind}}
		r := simulate(t, cfg)
		max := cfg.withDefaults().Max
		for _, m := range AllModes() {
			if m.Retry || !m.CycleJitter {
				continue
			}
			ff := only(t, r, m)
			if !ff.Drained || ff.DrainSeconds > max.Seconds() {
				t.Errorf("%s %s: drained %v after %.0f s, want within %s", kind, m, ff.Drained, ff.DrainSeconds, max)
			}
			if ff.PeakPending != 0 {
				t.Errorf("%s %s: %d pending, want 0", kind, m, ff.PeakPending)
			}
		}
		for _, m := range AllModes() {
			if !m.Retry {
				continue
			}
			rt := only(t, r, m)
			ff := only(t, r, Mode{StartupJitter: m.StartupJitter, CycleJitter: m.CycleJitter})
			if rt.PeakPending < 1000 || rt.RefusedTotal < 50*ff.RefusedTotal {
				t.Errorf("%s %s: peak pending %d, refused %d (fail-fast: %d); want ≥ 1000 pending and ≥ 50× the refusals",
					kind, m, rt.PeakPending, rt.RefusedTotal, ff.RefusedTotal)
			}
		}
		if b := only(t, r, Baseline); b.Drained {
			t.Errorf("%s outage baseline: drained after %.0f s, want not drained (the wall)", kind, b.DrainSeconds)
		}
	}
}

func TestDeterministicWithSeed(t *testing.T) {
	t.Parallel()
	cfg := SimConfig{Pollers: 3000, Scenario: Scenario{Kind: Saturation}, Modes: []Mode{Fleetpace, Baseline}, Seed: 7}
	a, b := simulate(t, cfg), simulate(t, cfg)
	cfg.Seed = 8
	c := simulate(t, cfg)
	for i := range a.Modes {
		if !slices.Equal(a.Modes[i].Polls, b.Modes[i].Polls) || a.Modes[i].RefusedTotal != b.Modes[i].RefusedTotal {
			t.Errorf("%s: two runs with seed 7 differ", a.Modes[i].Name)
		}
	}
	if slices.Equal(a.Modes[0].Polls, c.Modes[0].Polls) {
		t.Error("fleetpace: seeds 7 and 8 gave the same polls per second")
	}
}

func TestValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  SimConfig
		want string
	}{
		{SimConfig{Pollers: -1}, "Pollers"},
		{SimConfig{Pollers: MaxPollers + 1}, "Pollers"},
		{SimConfig{Base: time.Minute}, "Max"},
		{SimConfig{JitterRatio: 1.5}, "JitterRatio"},
		{SimConfig{Scenario: Scenario{Kind: "flood"}}, "Scenario.Kind"},
		{SimConfig{Scenario: Scenario{Kind: Saturation, Hold: DefaultBackends}}, "Scenario.Hold"},
		{SimConfig{Scenario: Scenario{Kind: Saturation, Slowdown: 0.5}}, "Scenario.Slowdown"},
		{SimConfig{Scenario: Scenario{Kind: DBRestart, At: time.Hour}, Duration: time.Minute}, "Scenario.At"},
		{SimConfig{Modes: []Mode{Fleetpace, Fleetpace}}, "Modes"},
	} {
		err := c.cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an ErrInvalidConfig naming %s", c.cfg, err, c.want)
		}
	}
	if _, err := ParseMode("jittery/fail-fast"); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("ParseMode of an unknown mode: %v", err)
	}
	for _, m := range AllModes() {
		if got, err := ParseMode(m.String()); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
}

func TestReportAndChart(t *testing.T) {
	t.Parallel()
	r := simulate(t, SimConfig{Pollers: 2000})
	var text, js strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, m := range AllModes() {
		if !strings.Contains(text.String(), m.Label()) {
			t.Errorf("text output lacks mode %s:\n%s", m.Label(), text.String())
		}
	}
	if err := r.WriteJSON(&js); err != nil || !strings.Contains(js.String(), `"polls_peak_to_mean"`) {
		t.Errorf("JSON output (%v): %.300s", err, js.String())
	}
	dir := t.TempDir()
	for _, name := range []string{"herd.svg", "herd.png"} {
		path := filepath.Join(dir, name)
		if err := r.WriteChart(path); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if name == "herd.png" && !strings.HasPrefix(string(b), "\x89PNG") || name == "herd.svg" && !strings.Contains(string(b), "<svg") {
			t.Errorf("%s is not the right format (%d bytes)", name, len(b))
		}
	}
	if err := r.WriteChart(filepath.Join(dir, "missing", "x.svg")); err == nil {
		t.Error("chart into a missing directory: no error")
	}
	if got := Sparkline([]int{0, 1, 8, 4}, 1, 8); got != " ▁█▄" {
		t.Errorf("Sparkline = %q", got)
	}
}
