// Package pacetest drives and checks, from the destination's side, the
// multi-process tests of the pacer's adapters (pacer.Transport, the River
// middleware): child processes send to an internal/fakedest server, each
// with a User-Agent naming it (UserAgent), and these functions read the
// fleet's behaviour off the server's records — the largest 1-s window
// against the ceiling, and how long one Retry-After held every process.
package pacetest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// Get sends a child's request: a GET of url as userAgent, its body read
// and closed. The status and headers are what the child judges.
func Get(ctx context.Context, url, userAgent string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp, nil
}

// UserAgent is the User-Agent child i sends, which tells the destination
// who sent each request.
func UserAgent(i int) string { return fmt.Sprintf("pacetest-child-%d", i) }

// Poll calls cond until it is true, failing the test after timeout.
func Poll(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// Ceiling is what the destination saw of a fleet held to a ceiling.
type Ceiling struct {
	Requests  int
	MaxWindow int // the most requests in any 1-s window
	Bound     int // ceiling + burst
	Span      time.Duration
	PerChild  []int
}

func (c Ceiling) String() string {
	return fmt.Sprintf("%d requests over %s (%.1f/s), largest 1-s window %d (bound %d), per process %v",
		c.Requests, c.Span.Round(time.Millisecond), float64(c.Requests-1)/c.Span.Seconds(), c.MaxWindow, c.Bound, c.PerChild)
}

// MeasureCeiling reads the requests under prefix from n children.
func MeasureCeiling(dest *fakedest.Server, prefix string, n int, ratePerSec float64, burst int) Ceiling {
	var times []time.Time
	c := Ceiling{Bound: int(ratePerSec) + burst, PerChild: make([]int, n)}
	for _, r := range requests(dest, prefix) {
		times = append(times, r.Time)
		for i := range n {
			if r.UserAgent == UserAgent(i) {
				c.PerChild[i]++
			}
		}
	}
	c.Requests = len(times)
	c.MaxWindow = fakedest.MaxInWindow(times, time.Second)
	if len(times) > 1 {
		c.Span = times[len(times)-1].Sub(times[0])
	}
	return c
}

// CheckCeiling fails the test unless every child sent, no 1-s window held
// more than ceiling + burst, and the fleet still delivered at least 80 % of
// the ceiling (a fleet that is merely slow proves nothing; the margin is
// for a loaded machine).
func CheckCeiling(t testing.TB, c Ceiling, ratePerSec float64, burst int) {
	t.Helper()
	for i, k := range c.PerChild {
		if k == 0 {
			t.Fatalf("vacuous: process %d sent nothing (%s)", i, c)
		}
	}
	if c.MaxWindow > c.Bound {
		t.Fatalf("fleet-wide ceiling broken: %s", c)
	}
	maxSpan := time.Duration(float64(c.Requests-burst) / (0.8 * ratePerSec) * float64(time.Second))
	if c.Span > maxSpan {
		t.Fatalf("the fleet delivered under 80 %% of the ceiling: %s", c)
	}
}

// HoldAfter answers every request under prefix with 429 and
// `Retry-After: d` (whole seconds) until the first such answer, then lets
// requests through again; it returns when that answer was sent (its
// arrival time). Requests already on their way in the meantime are answered
// 429 too.
func HoldAfter(t testing.TB, dest *fakedest.Server, prefix string, d time.Duration) time.Time {
	t.Helper()
	if err := dest.SetRule(prefix, fakedest.Blocked(d)); err != nil {
		t.Fatal(err)
	}
	Poll(t, 30*time.Second, "the first 429", func() bool { return dest.CountStatus(prefix, http.StatusTooManyRequests) > 0 })
	if err := dest.SetRule(prefix, fakedest.Rule{}); err != nil {
		t.Fatal(err)
	}
	return dest.Arrivals(prefix, http.StatusTooManyRequests)[0]
}

// Hold is what the destination saw around a Retry-After.
type Hold struct {
	First429  time.Time
	Limited   int           // requests answered 429
	InFlight  int           // requests arriving within the reaction allowance after the first 429
	Held      time.Duration // from the first 429 to the next request after the allowance
	Before    []int         // per child: requests before the first 429
	After     []int         // per child: requests at least `hold` after it
	Violators []string      // requests inside the hold: "child-1 at +1.2s"
}

func (h Hold) String() string {
	return fmt.Sprintf("first 429 then nothing for %s (%d answered 429, %d more in flight within the allowance); per process before %v, after %v",
		h.Held.Round(time.Millisecond), h.Limited, h.InFlight, h.Before, h.After)
}

// MeasureHold reads the requests under prefix of n children around a 429
// first answered at first429: requests may still arrive within reaction of
// it (sent before the fleet could know), none after that until hold has
// passed.
func MeasureHold(dest *fakedest.Server, prefix string, n int, first429 time.Time, hold, reaction time.Duration) Hold {
	h := Hold{First429: first429, Before: make([]int, n), After: make([]int, n)}
	quietFrom, quietUntil := first429.Add(reaction), first429.Add(hold)
	for _, r := range requests(dest, prefix) {
		child := -1
		for i := range n {
			if r.UserAgent == UserAgent(i) {
				child = i
			}
		}
		if r.Status == http.StatusTooManyRequests {
			h.Limited++
		}
		switch {
		case r.Time.Before(first429):
			if child >= 0 {
				h.Before[child]++
			}
		case r.Time.Before(quietFrom):
			if r.Time.After(first429) {
				h.InFlight++
			}
		default:
			if h.Held == 0 {
				h.Held = r.Time.Sub(first429)
			}
			if r.Time.Before(quietUntil) {
				h.Violators = append(h.Violators, fmt.Sprintf("%s %s at +%s (arrived %s kernel %v; first 429 %s)", r.UserAgent, r.Path, r.Time.Sub(first429).Round(time.Microsecond), r.Time.Format("15:04:05.000000"), r.KernelTime, first429.Format("15:04:05.000000")))
			} else if child >= 0 {
				h.After[child]++
			}
		}
	}
	return h
}

// CheckHold fails the test unless every child sent before the 429 and
// after the hold, and none inside it.
func CheckHold(t testing.TB, h Hold) {
	t.Helper()
	for i := range h.Before {
		if h.Before[i] == 0 || h.After[i] == 0 {
			t.Fatalf("vacuous: process %d did not send both before the 429 and after the hold (%s)", i, h)
		}
	}
	if len(h.Violators) > 0 {
		t.Fatalf("the fleet was not held: %d requests inside the hold (%v); %s", len(h.Violators), h.Violators, h)
	}
}

// AllAfter reports whether each of n children has a request under prefix
// that arrived at or after at.
func AllAfter(dest *fakedest.Server, prefix string, n int, at time.Time) bool {
	seen := make([]bool, n)
	for _, r := range requests(dest, prefix) {
		for i := range n {
			if r.UserAgent == UserAgent(i) && !r.Time.Before(at) {
				seen[i] = true
			}
		}
	}
	for _, s := range seen {
		if !s {
			return false
		}
	}
	return true
}

// requests returns the recorded requests under prefix by arrival time.
func requests(dest *fakedest.Server, prefix string) []fakedest.Request {
	var out []fakedest.Request
	for _, r := range dest.Requests() {
		if len(r.Path) >= len(prefix) && r.Path[:len(prefix)] == prefix {
			out = append(out, r)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

// StartDest starts a fake destination with no rules, closed when the test
// ends (with the default transport's idle connections to it).
func StartDest(t testing.TB) *fakedest.Server {
	t.Helper()
	dest, err := fakedest.New(fakedest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dest.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dest.Close()
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	})
	return dest
}

// Fleet is a running group of child processes sending to Dest under
// Prefix, each as UserAgent(i).
type Fleet struct {
	Dest   *fakedest.Server
	Prefix string
	N      int
	// Stop stops the children and checks what they reported.
	Stop func(t testing.TB)
}

// Modes of a fleet: the adapter under test, or per-process limiters at the
// same rate (the negative control).
const (
	Paced = "paced"
	Naive = "naive"
)

// SkipShort skips a test of several processes on real time under
// `go test -short`: the fast tier keeps to what one process and the fake
// clock decide; the full suite runs these.
func SkipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("several processes on real time: the full suite runs it")
	}
}

// RunCeiling checks that a paced fleet keeps the destination under
// ceiling + burst in every 1-s window while delivering the ceiling, and
// that a naive one, started the same way, does not. It returns both
// measurements.
func RunCeiling(t *testing.T, ratePerSec float64, burst, requests int, start func(t *testing.T, mode string) Fleet) (paced, naive Ceiling) {
	t.Helper()
	SkipShort(t)
	run := func(t *testing.T, mode string) Ceiling {
		t.Helper()
		f := start(t, mode)
		Poll(t, time.Minute, fmt.Sprintf("%d requests", requests), func() bool { return f.Dest.Count(f.Prefix) >= requests })
		f.Stop(t)
		return MeasureCeiling(f.Dest, f.Prefix, f.N, ratePerSec, burst)
	}
	paced = run(t, Paced)
	CheckCeiling(t, paced, ratePerSec, burst)
	t.Logf("paced: %s", paced)
	t.Run("naive per-process limiter exceeds it", func(t *testing.T) {
		naive = run(t, Naive)
		if naive.MaxWindow <= naive.Bound {
			t.Fatalf("the negative control held the ceiling: %s", naive)
		}
		t.Logf("naive x/time/rate per process: %s", naive)
	})
	return paced, naive
}

// RunHold lets a paced fleet send, answers one request 429 with
// `Retry-After: hold`, and checks at the destination that no process sent
// from reaction after that answer until hold after it, and that every
// process sent before and after.
func RunHold(t *testing.T, hold, reaction time.Duration, start func(t *testing.T, mode string) Fleet) Hold {
	t.Helper()
	SkipShort(t)
	f := start(t, Paced)
	Poll(t, time.Minute, "every process sending", func() bool {
		return AllAfter(f.Dest, f.Prefix, f.N, time.Time{}) && f.Dest.Count(f.Prefix) >= 40
	})
	first := HoldAfter(t, f.Dest, f.Prefix, hold)
	Poll(t, time.Minute, "every process sending after the hold", func() bool {
		return AllAfter(f.Dest, f.Prefix, f.N, first.Add(hold+500*time.Millisecond))
	})
	f.Stop(t)
	h := MeasureHold(f.Dest, f.Prefix, f.N, first, hold, reaction)
	CheckHold(t, h)
	t.Logf("Retry-After: %s: %s", hold, h)
	return h
}
