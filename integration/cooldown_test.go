package integration

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// Platform A starts answering 429 with Retry-After: 600 mid-run. A enters
// cooldown fleet-wide and receives no further request, beyond those already
// granted when the first 429 arrived; platform B keeps its rate.
//
// The bound on those extra requests: a request reaches the destination only
// after a granted pacer reservation, and the 429's report sets the pacer's
// hold to now + 600 s (every later reservation is denied and the job
// snoozes) before the cooldown row is written (later jobs snooze before
// reserving). So every extra request was granted before the first 429 was
// answered, and was held by a running job: at most workers × concurrency − 1
// of them, all arriving within --max-pacer-wait (the longest a granted job
// sleeps) plus a second of slack after the first 429.
func TestCooldown(t *testing.T) {
	t.Parallel()
	const (
		rate        = 5.0
		workers     = 2
		concurrency = 5
		maxWait     = 2 * time.Second
	)
	url := newURL(t)
	d := newDest(t, nil)
	for _, p := range []string{"a", "b"} {
		platformWithSources(t, url, p, d.URL(), 100, "--rate", "5", "--burst", "1")
	}
	db := pool(t, url)
	var ws []*proc
	for _, name := range []string{"w1", "w2"} {
		ws = append(ws, startWorker(t, url, name, "--concurrency", "5", "--max-pacer-wait", maxWait.String()))
	}
	waitArrivals(t, d, "/a/", 10, 30*time.Second)
	if err := d.SetRule("/a/", fakedest.Blocked(600*time.Second)); err != nil {
		t.Fatal(err)
	}
	blockedAt := time.Now()
	firstBlocked := waitArrivals(t, d, "/a/", d.Count("/a/")+1, 10*time.Second)
	// Observe 12 s past A's first answer after the block, by the
	// destination's clock (B keeps arriving throughout).
	end := waitUntil(t, d, "/b/", firstBlocked.Add(12*time.Second), 30*time.Second)

	reqs := d.Requests()
	var first429 time.Time
	var aAfter []time.Time
	for _, r := range reqs {
		if r.Path[:3] != "/a/" {
			continue
		}
		if first429.IsZero() && r.Status == http.StatusTooManyRequests {
			first429 = r.Time
		}
		if !first429.IsZero() && r.Time.After(first429) {
			aAfter = append(aAfter, r.Time)
		}
	}
	if first429.IsZero() {
		t.Fatalf("platform A never got a 429")
	}
	var cooldownLeft float64
	var reason string
	err := db.QueryRow(context.Background(),
		`SELECT extract(epoch FROM until - now()), reason FROM fleetpace_cooldown WHERE platform = 'a'`).Scan(&cooldownLeft, &reason)
	if err != nil {
		t.Fatalf("no cooldown row for platform a: %v", err)
	}
	bTimes := d.Arrivals("/b/")
	bBefore := float64(arrivalsBetween(bTimes, blockedAt.Add(-3*time.Second), blockedAt)) / 3
	steadyFrom := first429.Add(maxWait + time.Second)
	bAfter := float64(arrivalsBetween(bTimes, steadyFrom, end)) / end.Sub(steadyFrom).Seconds()
	lastExtra := time.Duration(0)
	if len(aAfter) > 0 {
		lastExtra = aAfter[len(aAfter)-1].Sub(first429)
	}
	t.Logf("cooldown: A blocked; %d request(s) to A after its first 429 (bound %d), the last %s after it; none in the following %s; cooldown %.0f s left (%q)",
		len(aAfter), workers*concurrency-1, lastExtra.Round(time.Millisecond), end.Sub(first429.Add(lastExtra)).Round(time.Second), cooldownLeft, reason)
	t.Logf("cooldown: B at %.1f/s before A was blocked, %.1f/s after A cooled down (rate %.0f/s)", bBefore, bAfter, rate)

	if len(aAfter) > workers*concurrency-1 {
		t.Errorf("A received %d requests after its first 429; at most %d were already granted", len(aAfter), workers*concurrency-1)
	}
	if lastExtra > maxWait+time.Second {
		t.Errorf("A received a request %s after its first 429: it was not in flight then", lastExtra)
	}
	if end.Sub(first429) < 10*time.Second {
		t.Fatalf("observed only %s after the first 429", end.Sub(first429))
	}
	// Retry-After 600 s, platform cooldown 15 min: max of the two, ±10 %.
	if cooldownLeft < 0.9*900-60 {
		t.Errorf("cooldown ends in %.0f s; want about 15 min (max(cooldown, Retry-After) ± 10 %%)", cooldownLeft)
	}
	if bAfter < 0.9*rate {
		t.Errorf("B ran at %.1f/s while A cooled down; want ≥ 0.9 × %.0f/s", bAfter, rate)
	}
	stopAll(ws)
}

// Two platforms with a backlog each share the workers' slots: each runs at
// its own rate, neither waits for the other's backlog.
//
// Without the tick's interleaving (jobs queued in plain fair order across
// platforms), every job of the platform with the lower ids comes first in
// River's queue; those jobs sleep on the pacer while holding their worker
// slots, and the other platform runs at 0/s until that backlog is done.
func TestPlatformsShareWorkerSlots(t *testing.T) {
	t.Parallel()
	const rate = 5.0
	url := newURL(t)
	d := newDest(t, nil)
	for _, p := range []string{"a", "b"} {
		platformWithSources(t, url, p, d.URL(), 100, "--rate", "5", "--burst", "1")
	}
	for _, name := range []string{"w1", "w2"} {
		startWorker(t, url, name, "--concurrency", "5", "--max-pacer-wait", "2s")
	}
	first := waitArrivals(t, d, "", 1, 30*time.Second)
	waitUntil(t, d, "", first.Add(8*time.Second), 30*time.Second)
	for _, p := range []string{"/a/", "/b/"} {
		got := float64(arrivalsBetween(d.Arrivals(p), first.Add(time.Second), first.Add(8*time.Second))) / 7
		t.Logf("platform %s: %.1f/s (rate %.0f/s)", p, got, rate)
		if got < 0.8*rate {
			t.Errorf("platform %s ran at %.1f/s with a backlog; want ≥ 0.8 × %.0f/s", p, got, rate)
		}
	}
}
