package pacer

import (
	"math"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
)

// A process's own Retry-After holds it from the instant it is received,
// before its report reaches the database. An event it learns of meanwhile
// (another process's late write moving the schedule, or its slow-down:
// no hold in force in the row yet) must not end that hold: only an
// operator's ClearHold (a re-spacing that gives every slot back, with no
// hold) does, and HoldLeft then says so too. An event of either kind once cleared it, and the process
// sent inside its own Retry-After.
func TestOwnHoldOutlivesOtherEvents(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "api", rate: 20, burst: 1})
	clk := clocktest.New()
	p := fakePacer(t, url, clk, nil)
	at := float64(clk.Now().UnixNano()) / 1e9
	for _, tc := range []struct {
		name  string
		ev    event
		clear bool
	}{
		{"another process's overrun", event{at: at, interval: 0.05, shift: 0.01, horizon: math.Inf(1)}, false},
		{"another process's slow-down", event{at: at, interval: 0.1, shift: 0.05, horizon: at + 1}, false},
		{"an operator's ClearHold", event{at: at, interval: 0.05, shift: math.Inf(1), horizon: at}, true},
	} {
		p.holdLocally("api", 2*time.Second)
		p.mu.Lock()
		tc.ev.seq = p.state("api").last.seq + 1
		p.mu.Unlock()
		p.applyEvent("api", tc.ev)
		held := p.heldLocally("api")
		if left := p.HoldLeft("api", ""); tc.clear && (held != 0 || left != 0) {
			t.Errorf("after %s: held %s more (HoldLeft %s), want the hold ended", tc.name, held, left)
		}
		if !tc.clear && held != 2*time.Second {
			t.Errorf("after %s: held %s more, want the 2 s of its own Retry-After", tc.name, held)
		}
	}
}
