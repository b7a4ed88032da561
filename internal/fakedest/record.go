package fakedest

import (
	"net/http"
	"sort"
	"strings"
	"time"
)

// Request is one recorded request.
type Request struct {
	// Time is the arrival time: the kernel's receive time of the request's
	// bytes where it is known (KernelTime), else Config.Now when the
	// handler started.
	Time time.Time
	// KernelTime: Time is the kernel's receive time (Linux, real clock).
	// The kernel turns receive times on in the background the first time a
	// socket asks, so a process's first requests may be stamped by the
	// handler.
	KernelTime bool
	// Done is when the answer was written; zero while in flight or if the
	// request was abandoned (client hung up or server closed during Delay).
	Done time.Time

	Method   string
	Path     string
	RawQuery string

	// Status is the status answered; 0 while in flight or if abandoned.
	Status int

	// Limited: the rule's limiter refused the request (answered with
	// LimitStatus), as opposed to a forced Status. Set on arrival.
	Limited bool

	// RateLimit holds the rate-limit headers sent with the answer —
	// Retry-After and the X-RateLimit-* and RateLimit* fields, as sent
	// (a RawHeaders value under one of those canonical names included) —
	// nil when none. Set when the answer is written.
	RateLimit http.Header

	IfNoneMatch     string
	IfModifiedSince string
	UserAgent       string
	RemoteAddr      string
}

// Tally counts requests by how they were answered.
type Tally struct {
	// Requests is every request counted, answered or not.
	Requests int
	// Accepted were answered 2xx or 304: the goodput.
	Accepted int
	// Limited were refused by the rule's limiter (Request.Limited).
	Limited int
}

// LimitedShare is Limited / Requests (0 for no requests): the 429 share.
func (t Tally) LimitedShare() float64 {
	if t.Requests == 0 {
		return 0
	}
	return float64(t.Limited) / float64(t.Requests)
}

// Tally counts the recorded requests under prefix that arrived in
// [from, to); a zero from or to leaves that side open.
func (s *Server) Tally(prefix string, from, to time.Time) Tally {
	s.mu.Lock()
	defer s.mu.Unlock()
	var t Tally
	for _, r := range s.requests {
		if !strings.HasPrefix(r.Path, prefix) ||
			!from.IsZero() && r.Time.Before(from) || !to.IsZero() && !r.Time.Before(to) {
			continue
		}
		t.Requests++
		if r.Status >= 200 && r.Status < 300 || r.Status == http.StatusNotModified {
			t.Accepted++
		}
		if r.Limited {
			t.Limited++
		}
	}
	return t
}

// Requests returns a copy of every recorded request, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Request, len(s.requests))
	for i, r := range s.requests {
		out[i] = *r
	}
	return out
}

// Count is the number of recorded requests whose path starts with prefix
// ("" counts all).
func (s *Server) Count(prefix string) int {
	return len(s.Arrivals(prefix))
}

// CountStatus is the number of recorded requests under prefix answered with
// status.
func (s *Server) CountStatus(prefix string, status int) int {
	return len(s.Arrivals(prefix, status))
}

// Arrivals returns the arrival times of the recorded requests whose path
// starts with prefix, in arrival order; with statuses, only those answered
// with one of them.
func (s *Server) Arrivals(prefix string, statuses ...int) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Time
	for _, r := range s.requests {
		if !strings.HasPrefix(r.Path, prefix) {
			continue
		}
		if len(statuses) > 0 && !containsInt(statuses, r.Status) {
			continue
		}
		out = append(out, r.Time)
	}
	return out
}

// MaxInWindow is the largest number of requests under prefix (any status)
// that arrived within any sliding window of the given length. See the
// package function MaxInWindow.
func (s *Server) MaxInWindow(prefix string, window time.Duration) int {
	return MaxInWindow(s.Arrivals(prefix), window)
}

// RateSeries is the request rate under prefix (any status), in requests per
// second, per bucket of the given length from Origin. See the package
// function RateSeries.
func (s *Server) RateSeries(prefix string, bucket time.Duration) []float64 {
	return RateSeries(s.Arrivals(prefix), s.Origin(), bucket)
}

// MaxInWindow returns the largest number of times that fall within one
// half-open window [t, t+window), over every t. The times need not be sorted.
// A window ≤ 0 holds nothing.
func MaxInWindow(times []time.Time, window time.Duration) int {
	if window <= 0 || len(times) == 0 {
		return 0
	}
	sorted := append([]time.Time(nil), times...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Before(sorted[j]) })
	// The busiest window can always be slid to start at one of the times.
	best, lo := 0, 0
	for hi := range sorted {
		for sorted[hi].Sub(sorted[lo]) >= window {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// RateSeries returns, for each bucket [origin + i·bucket, origin + (i+1)·bucket),
// the number of times in it divided by the bucket's length in seconds, up to
// the bucket holding the latest time. Times before origin are ignored; a
// bucket ≤ 0 returns nil.
func RateSeries(times []time.Time, origin time.Time, bucket time.Duration) []float64 {
	if bucket <= 0 {
		return nil
	}
	var counts []int
	for _, t := range times {
		d := t.Sub(origin)
		if d < 0 {
			continue
		}
		i := int(d / bucket)
		for len(counts) <= i {
			counts = append(counts, 0)
		}
		counts[i]++
	}
	out := make([]float64, len(counts))
	for i, c := range counts {
		out[i] = float64(c) / bucket.Seconds()
	}
	return out
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}
