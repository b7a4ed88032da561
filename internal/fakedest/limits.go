package fakedest

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"golang.org/x/time/rate"
)

// HeaderStyle is the family of rate-limit headers a limited rule sends with
// every response its limiter decides (Rule.Headers). Real APIs differ in
// the details; these are what the fake sends, chosen to be read back
// exactly by package ratelimit.
//
// For a token bucket (Rule.Rate, Rule.Burst), "limit" is the bucket's
// capacity (Burst), "remaining" the whole tokens left after this request
// (0 on a limited answer) and "reset" the time until the bucket is full
// again, (Burst − tokens) / Rate. Its policy, for the IETF styles, states
// the long-run rate as q requests per w seconds with w a whole number of
// seconds, as the draft requires: w = max(1, ⌈Burst/Rate⌉) and
// q = ⌊Rate·w⌋ (rounded down: never more than the bucket allows), e.g.
// 8/s burst 1 → q=8;w=1, 5/s burst 10 → q=10;w=2, 0.5/s → q=1;w=2.
//
// For a fixed window (Rule.Window, Rule.WindowLimit), limit is WindowLimit,
// remaining what is left in this window after this request, reset the time
// to the window's end, and the policy q=WindowLimit;w=⌈Window⌉ seconds.
type HeaderStyle int

const (
	// None sends no rate-limit headers (Retry-After still goes with 429s).
	None HeaderStyle = iota
	// XRateLimit sends X-RateLimit-Limit (limit), X-RateLimit-Remaining
	// and X-RateLimit-Reset as delta seconds with up to three decimals,
	// rounded up to the millisecond ("0.125"; "0" when nothing is to wait).
	XRateLimit
	// XRateLimitEpoch is XRateLimit with X-RateLimit-Reset as the Unix time
	// of the reset in whole seconds, rounded up (GitHub's form).
	XRateLimitEpoch
	// IETF sends the current draft's structured fields:
	// `RateLimit-Policy: "default";q=Q;w=W` and
	// `RateLimit: "default";r=R;t=T`, T the reset in whole seconds rounded
	// up. Read back, Limit is the policy's q (not the bucket's capacity).
	IETF
	// IETFDraft sends the older draft's fields: `RateLimit-Limit: Q, Q;w=W`,
	// `RateLimit-Remaining: R` and `RateLimit-Reset: T` (whole seconds,
	// rounded up). Read back, Limit is the policy's q.
	IETFDraft
)

var headerStyleNames = [...]string{"none", "x-ratelimit", "x-ratelimit-epoch", "ietf", "ietf-draft"}

// String names the style ("none", "x-ratelimit", "x-ratelimit-epoch",
// "ietf", "ietf-draft").
func (s HeaderStyle) String() string {
	if s < 0 || int(s) >= len(headerStyleNames) {
		return fmt.Sprintf("HeaderStyle(%d)", int(s))
	}
	return headerStyleNames[s]
}

// quota is what a limiter says about itself after deciding a request.
type quota struct {
	limit     int           // X-RateLimit-Limit: capacity or WindowLimit
	remaining int           // whole requests left
	reset     time.Duration // until full (bucket) or the window's end
	q, w      int           // policy: q requests per w seconds
}

// limiter decides requests under one rule: a token bucket or a fixed window.
// Callers serialize calls (Server.mu).
type limiter interface {
	admit(now time.Time) (ok bool, q quota)
}

// bucket is a token bucket on golang.org/x/time/rate, driven by Config.Now.
type bucket struct {
	lim   *rate.Limiter
	rate  float64
	burst int
}

func newBucket(r float64, burst int) *bucket {
	if burst == 0 {
		burst = 1
	}
	return &bucket{lim: rate.NewLimiter(rate.Limit(r), burst), rate: r, burst: burst}
}

func (b *bucket) admit(now time.Time) (bool, quota) {
	ok := b.lim.AllowN(now, 1)
	tokens := max(b.lim.TokensAt(now), 0)
	w := max(1, int(math.Ceil(float64(b.burst)/b.rate)))
	return ok, quota{
		limit:     b.burst,
		remaining: int(math.Floor(tokens)),
		reset:     time.Duration((float64(b.burst) - tokens) / b.rate * float64(time.Second)),
		q:         int(math.Floor(b.rate*float64(w) + 1e-9)), // absorb float error in rate·w
		w:         w,
	}
}

// window is a fixed-window counter: at most limit requests per aligned
// window of length size.
type window struct {
	size  time.Duration
	limit int
	start time.Time // of the current window
	count int       // requests admitted in it
}

func (f *window) admit(now time.Time) (bool, quota) {
	if start := now.Truncate(f.size); !start.Equal(f.start) {
		f.start, f.count = start, 0
	}
	ok := f.count < f.limit
	if ok {
		f.count++
	}
	return ok, quota{
		limit:     f.limit,
		remaining: f.limit - f.count,
		reset:     f.start.Add(f.size).Sub(now),
		q:         f.limit,
		w:         max(1, int(math.Ceil(f.size.Seconds()))),
	}
}

// setHeaders writes q in style s into h; now dates the epoch form.
func (q quota) setHeaders(h http.Header, s HeaderStyle, now time.Time) {
	ceilSecs := strconv.FormatInt(int64(math.Ceil(q.reset.Seconds())), 10)
	policy := strconv.Itoa(q.q) + ";w=" + strconv.Itoa(q.w)
	switch s {
	case XRateLimit, XRateLimitEpoch:
		h.Set("X-RateLimit-Limit", strconv.Itoa(q.limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(q.remaining))
		if s == XRateLimit {
			ms := (q.reset + time.Millisecond - 1) / time.Millisecond
			h.Set("X-RateLimit-Reset", strconv.FormatFloat(float64(ms)/1000, 'f', -1, 64))
		} else {
			at := now.Add(q.reset)
			secs := at.Unix()
			if at.Nanosecond() > 0 {
				secs++
			}
			h.Set("X-RateLimit-Reset", strconv.FormatInt(secs, 10))
		}
	case IETF:
		h.Set("RateLimit-Policy", `"default";q=`+strconv.Itoa(q.q)+";w="+strconv.Itoa(q.w))
		h.Set("RateLimit", `"default";r=`+strconv.Itoa(q.remaining)+";t="+ceilSecs)
	case IETFDraft:
		h.Set("RateLimit-Limit", strconv.Itoa(q.q)+", "+policy)
		h.Set("RateLimit-Remaining", strconv.Itoa(q.remaining))
		h.Set("RateLimit-Reset", ceilSecs)
	}
}

// rateLimitHeaders lists what setHeaders and setRetryAfter may write, for
// the record.
var rateLimitHeaders = []string{
	"Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
	"RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
}

// sentRateLimitHeaders copies the rate-limit headers of h (nil if none).
func sentRateLimitHeaders(h http.Header) http.Header {
	var out http.Header
	for _, k := range rateLimitHeaders {
		k = http.CanonicalHeaderKey(k)
		if vs, ok := h[k]; ok {
			if out == nil {
				out = http.Header{}
			}
			out[k] = append([]string(nil), vs...)
		}
	}
	return out
}
