package worker

import "testing"

// The budget is spent whole, the listeners first, and never below one
// connection for the pacer's pool and two for the main pool.
func TestSplitConns(t *testing.T) {
	t.Parallel()
	for _, pollOnly := range []bool{false, true} {
		for total := MinMaxConns(pollOnly); total <= 64; total++ {
			s := splitConns(total, pollOnly)
			if got := s.main + s.pacer + (connShares{}).listeners(pollOnly); got != total {
				t.Fatalf("poll-only %v, budget %d: %+v spends %d", pollOnly, total, s, got)
			}
			if s.pacer < 1 || s.pacer > 4 || s.main < 2 {
				t.Fatalf("poll-only %v, budget %d: %+v", pollOnly, total, s)
			}
		}
	}
	if got := splitConns(DefaultMaxConns, false); got != (connShares{main: 5, pacer: 4}) {
		t.Fatalf("default split = %+v, want main 5, pacer 4 (+ the pacer's listener)", got)
	}
	bad := Config{MaxConns: MinMaxConns(false) - 1}
	if err := bad.Validate(); err == nil {
		t.Fatal("a budget below the minimum validated")
	}
}
