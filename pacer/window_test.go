package pacer

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// windowCounts is what the destination accepted and refused in each of
// its fixed windows (size, on the clock's grid, as fakedest's are) that lie
// wholly within [from, to) of the run.
func (r simResult) windowCounts(size, from, to time.Duration) (ok, refused []int) {
	first := r.start.Add(from).Add(size - 1).Truncate(size)
	for w := first; !w.Add(size).After(r.start.Add(to)); w = w.Add(size) {
		o, f := r.between(w.Sub(r.start), w.Add(size).Sub(r.start))
		ok, refused = append(ok, o), append(refused, f)
	}
	return ok, refused
}

// A fixed window the destination does not announce is learned from its
// refusals' resets (now + Retry-After, on one grid of whole seconds), and
// the fleet then takes each window's quota and holds at its end: three
// processes of twenty callers under a 20/s ceiling, against windows of 20
// and 67 per 10 s, fill every window from second 40 on with its quota
// exactly, no refusal, and never more than ceiling + burst in a second.
// States then says the platform is paced by that window. The control (no
// window learned: the estimate paces under the quota) leaves some window
// short. A strict limiter answering Retry-After: 1 (a
// bucket's next slot) is never taken for a window.
func TestLearnedWindowTakesEachQuota(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	t.Parallel()
	for _, m := range []struct {
		name    string
		rule    fakedest.Rule
		control bool
	}{
		{"window-10s-20", fakedest.Rule{Window: 10 * time.Second, WindowLimit: 20}, false},
		{"window-10s-67", fakedest.Rule{Window: 10 * time.Second, WindowLimit: 67}, false},
		{"window-10s-20-control", fakedest.Rule{Window: 10 * time.Second, WindowLimit: 20}, true},
		{"strict-8", fakedest.Rule{Rate: 8, Strict: true}, false},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			cfg := simConfig{procs: 3, callers: 20, rate: 20, rule: m.rule,
				duration: 70 * time.Second, latency: 20 * time.Millisecond, seed: 1}
			if m.control {
				cfg.tune = func(tu *tuning) { tu.winMin = 0 }
			}
			r := runSim(t, cfg)
			all, allRefused := r.windowCounts(max(m.rule.Window, time.Second), 0, 70*time.Second)
			t.Logf("%s: %s window %+v\nper window: %v accepted, %v refused\n%s", m.name, r, r.window, all, allRefused, r.timeline())
			if w := r.maxWindow(); w > 21 {
				t.Errorf("%d requests in one second, over the ceiling + burst (21)", w)
			}
			if m.rule.Window == 0 {
				if r.window.len != 0 {
					t.Errorf("a strict limiter was taken for a window of %gs", r.window.len)
				}
				return
			}
			ok, refused := r.windowCounts(m.rule.Window, 40*time.Second, 70*time.Second)
			full := fmt.Sprint(ok) == fmt.Sprint(repeat(m.rule.WindowLimit, len(ok)))
			if m.control {
				if full {
					t.Errorf("the control filled every window (%v): it does not show what the learned window gains", ok)
				}
				return
			}
			if r.window.len != m.rule.Window.Seconds() || r.window.quota != m.rule.WindowLimit {
				t.Errorf("learned a window of %gs and %d, want %s and %d", r.window.len, r.window.quota, m.rule.Window, m.rule.WindowLimit)
			}
			if st := r.state; st.PacedBy != PacedByWindow || st.Window != m.rule.Window || st.WindowQuota != m.rule.WindowLimit {
				t.Errorf("the state says paced by %q, window %s of %d; want %q, %s of %d", st.PacedBy, st.Window, st.WindowQuota,
					PacedByWindow, m.rule.Window, m.rule.WindowLimit)
			}
			if !full || fmt.Sprint(refused) != fmt.Sprint(repeat(0, len(refused))) {
				t.Errorf("windows from 40 s on accepted %v and refused %v, want %d each and no refusal", ok, refused, m.rule.WindowLimit)
			}
		})
	}
}

// repeat is n copies of v.
func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}
