package fakedest

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// Limiter is a Rule's limiter on its own, without HTTP: what a destination
// under the rule decides for a request arriving at a given time, and the
// rate-limit headers and Retry-After it answers with. The Server decides
// every request through one; a simulation on a fake clock (package pacer's
// tests) uses one directly. Not safe for concurrent use.
type Limiter struct {
	rule Rule
	lim  limiter
}

// Decision is a Limiter's answer to one request.
type Decision struct {
	// OK: accepted. Refused requests are answered with the rule's
	// LimitStatus (429 by default).
	OK bool
	// Status is the status the destination answers: 200 or LimitStatus.
	Status int
	// Header holds the rate-limit headers of the answer (the rule's Headers
	// style) and, when refused, Retry-After; nil when there are none.
	Header http.Header
}

// NewLimiter returns r's limiter, or nil if r limits nothing (no Rate, no
// Window). r must be valid (as Server.SetRule checks).
func NewLimiter(r Rule) *Limiter { return newLimiter(r) }

func newLimiter(r Rule) *Limiter {
	var lim limiter
	switch {
	case r.Rate > 0 && r.Strict:
		lim = newStrict(r.Rate, r.Burst)
	case r.Rate > 0:
		lim = newBucket(r.Rate, r.Burst)
	case r.Window > 0 && r.Sliding:
		lim = &slidingLog{size: r.Window, limit: r.WindowLimit}
	case r.Window > 0:
		lim = &window{size: r.Window, limit: r.WindowLimit}
	default:
		return nil
	}
	return &Limiter{rule: r.withDefaults(), lim: lim}
}

// withDefaults fills the answer's defaults: LimitStatus 429, RetryAfter
// DefaultRetryAfter (a window's refusal: the time to its end instead,
// unless set).
func (r Rule) withDefaults() Rule {
	if r.LimitStatus == 0 {
		r.LimitStatus = http.StatusTooManyRequests
	}
	return r
}

// Admit decides a request arriving at now.
func (l *Limiter) Admit(now time.Time) Decision {
	ok, q := l.lim.admit(now)
	d := Decision{OK: ok, Status: http.StatusOK}
	h := http.Header{}
	if l.rule.Headers != None {
		q.setHeaders(h, l.rule.Headers, now)
	}
	if !ok {
		d.Status = l.rule.LimitStatus
		retryAfter := l.rule.RetryAfter
		if retryAfter == 0 {
			retryAfter = DefaultRetryAfter
			if l.rule.Window > 0 {
				retryAfter = q.reset
			}
		}
		setRetryAfter(h, l.rule, retryAfter, now)
	}
	if len(h) > 0 {
		d.Header = h
	}
	return d
}

// setRetryAfter sends d as Retry-After in r's form, rounded up to whole
// seconds (none if d < 0 or r.RetryAfter < 0).
func setRetryAfter(h http.Header, r Rule, d time.Duration, now time.Time) {
	if r.RetryAfter < 0 || d < 0 {
		return
	}
	if r.RetryAfterDate {
		h.Set("Retry-After", now.Add(d).UTC().Format(http.TimeFormat))
		return
	}
	secs := int64((d + time.Second - 1) / time.Second)
	h.Set("Retry-After", strconv.FormatInt(secs, 10))
}

// strict is nginx's limit_req (ngx_http_limit_req_lookup): excess in
// thousandths of a request, time in whole milliseconds; a request is
// accepted when excess − rate·elapsed + 1 (not below 0) is at most burst,
// and then becomes the new excess; a refused one changes nothing.
type strict struct {
	rate   float64 // requests per second
	burst  int
	excess int64 // thousandths of a request
	last   int64 // milliseconds; 0: nothing accepted yet
}

func newStrict(rate float64, burst int) *strict { return &strict{rate: rate, burst: burst} }

func (s *strict) admit(now time.Time) (bool, quota) {
	ms := now.UnixMilli()
	excess := int64(0)
	if s.last != 0 {
		elapsed := ms - s.last
		if elapsed < 0 {
			elapsed = 0
		}
		excess = s.excess - int64(s.rate*1000)*elapsed/1000 + 1000
		if excess < 0 {
			excess = 0
		}
	}
	ok := excess <= int64(s.burst)*1000
	if ok {
		s.excess = excess
		if s.last == 0 || ms != s.last {
			s.last = ms
		}
	}
	// The next request is accepted once the excess has drained to burst.
	wait := time.Duration(float64(max(s.excess+1000-int64(s.burst)*1000, 0)) / (s.rate * 1000) * float64(time.Second))
	w := max(1, int(math.Ceil(float64(s.burst+1)/s.rate)))
	return ok, quota{
		limit:     s.burst + 1,
		remaining: max(int((int64(s.burst)*1000-s.excess)/1000), 0),
		reset:     wait,
		q:         int(math.Floor(s.rate*float64(w) + 1e-9)),
		w:         w,
	}
}

// slidingLog accepts at most limit requests in any window of size ending
// now.
type slidingLog struct {
	size  time.Duration
	limit int
	log   []time.Time // accepted requests within the last window, oldest first
}

func (s *slidingLog) admit(now time.Time) (bool, quota) {
	i := 0
	for i < len(s.log) && !s.log[i].After(now.Add(-s.size)) {
		i++
	}
	s.log = s.log[i:]
	ok := len(s.log) < s.limit
	if ok {
		s.log = append(s.log, now)
	}
	var reset time.Duration
	if len(s.log) > 0 {
		reset = s.log[0].Add(s.size).Sub(now)
	}
	return ok, quota{
		limit:     s.limit,
		remaining: s.limit - len(s.log),
		reset:     reset,
		q:         s.limit,
		w:         max(1, int(math.Ceil(s.size.Seconds()))),
	}
}
