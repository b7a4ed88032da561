package bench

import (
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// The figures of one cell, from a destination record built by hand.
func TestAdaptAnalyze(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const d = 40 * time.Second
	m := Model{Name: "strict-40", Share: 0.4, Burst: 1}
	c := cell{model: m, schedule: SeedSchedule, platform: "strict-40.seed"}
	var reqs []fakedest.Request
	add := func(at time.Duration, status int, ra string) {
		r := fakedest.Request{Time: start.Add(at), Status: status, Limited: status == http.StatusTooManyRequests}
		if ra != "" {
			r.RateLimit = http.Header{"Retry-After": {ra}}
		}
		reqs = append(reqs, r)
	}
	// 8/s allowed (40 % of 20). First half: 10/s with a 429 at 5 s whose
	// Retry-After (1 s) is ignored by 4 requests; second half: 6 ok per
	// second and one 429 per second.
	for k := 0; k < 200; k++ {
		at := time.Duration(k) * 100 * time.Millisecond
		switch {
		case at == 5*time.Second:
			add(at, http.StatusTooManyRequests, "1")
		default:
			add(at, http.StatusOK, "")
		}
	}
	for s := 20; s < 40; s++ {
		for k := 0; k < 6; k++ {
			add(time.Duration(s)*time.Second+time.Duration(k)*150*time.Millisecond, http.StatusOK, "")
		}
		add(time.Duration(s)*time.Second+950*time.Millisecond, http.StatusTooManyRequests, "")
	}
	row := analyze(c, reqs, start, d, 20)
	if want := 6.0 / 8; math.Abs(row.Goodput-want) > 0.01 {
		t.Errorf("goodput %.3f, want %.3f", row.Goodput, want)
	}
	if want := 1.0 / 7; math.Abs(row.LimitedShare-want) > 0.001 {
		t.Errorf("429 share %.3f, want %.3f", row.LimitedShare, want)
	}
	if row.OldSpacing != 9 {
		t.Errorf("requests within the first 429's Retry-After: %v, want 9 (100 ms apart for 1 s)", row.OldSpacing)
	}
	if row.MaxWindow != 10 || row.Bound != 21 {
		t.Errorf("largest 1-s window %d (bound %d), want 10 (21)", row.MaxWindow, row.Bound)
	}
	if row.Settle != -1 {
		t.Errorf("settle %v: a 429 share of 1/7 in every span of the second half never settles", row.Settle)
	}
	if row.Met() {
		t.Errorf("row %+v meets the targets", row)
	}
}

// A drop model: when the 429s after the drop stopped.
func TestAdaptAnalyzeDrop(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const d = 90 * time.Second
	m := Model{Name: "drop-80-30", Share: 0.8, Burst: 1, Drop: true, DropShare: 0.3}
	var reqs []fakedest.Request
	for k := 0; k < 900; k++ {
		at := time.Duration(k) * 100 * time.Millisecond
		status := http.StatusOK
		// 429s from the drop (30 s) until 33.5 s.
		if at >= 30*time.Second && at < 33500*time.Millisecond && k%2 == 0 {
			status = http.StatusTooManyRequests
		}
		reqs = append(reqs, fakedest.Request{Time: start.Add(at), Status: status, Limited: status == http.StatusTooManyRequests})
	}
	row := analyze(cell{model: m, schedule: DefaultSchedule(), platform: "drop.default"}, reqs, start, d, 20)
	if math.Abs(row.DropStop-3.4) > 0.05 {
		t.Errorf("429s stopped %.2f s after the drop, want 3.4", row.DropStop)
	}
}
