package fakedest

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultRetryAfter is the Retry-After sent with 429 and 503 answers when
// Rule.RetryAfter is zero.
const DefaultRetryAfter = time.Second

// NoRetryAfter, as Rule.RetryAfter, omits the Retry-After header (any negative
// value does the same).
const NoRetryAfter time.Duration = -1

// ErrInvalidRule is wrapped by errors about a bad Rule.
var ErrInvalidRule = errors.New("fakedest: invalid rule")

// Rule is the behaviour of the paths under one prefix. The zero Rule answers
// 200 with a short body, at any rate.
//
// A request is handled in this order: recorded; if Status is set, answered
// with it; else if RedirectTo is set, answered 302; else if the limiter
// (token bucket or fixed window) refuses it, answered with LimitStatus;
// else answered 304 if Validators is set and a conditional header matches;
// else 200 with the body. Delay is waited before any answer. Headers go
// with every answer the limiter decided (accepted or refused); RawHeaders
// with every answer.
type Rule struct {
	// Rate is the token bucket's refill rate, in requests per second.
	// Default (0): unlimited.
	Rate float64

	// Burst is the token bucket's size: requests allowed back to back.
	// Default: 1 when Rate is set.
	Burst int

	// Window, with WindowLimit, is a fixed-window limiter instead of the
	// token bucket: at most WindowLimit requests in each window of this
	// length, windows aligned as time.Time.Truncate aligns them (on the
	// second for 1 s, on the minute for 60 s) on Config.Now's clock. A
	// refused request gets Retry-After = the time to the window's end,
	// rounded up to whole seconds, unless RetryAfter is set. Default (0):
	// no window. Not with Rate.
	Window time.Duration

	// WindowLimit is the fixed window's quota; at least 1 with Window.
	WindowLimit int

	// Strict, with Rate, makes the limiter nginx's limit_req instead of a
	// token bucket: a leaky bucket counted in whole milliseconds that
	// refuses a request arriving earlier than 1/Rate after the last one it
	// accepted, beyond Burst requests of excess (nginx's burst with nodelay;
	// 0 by default here, not 1). A refusal changes nothing.
	Strict bool

	// Sliding, with Window and WindowLimit, makes the window a sliding log
	// instead of a fixed one: at most WindowLimit requests accepted in any
	// Window ending now. A refused request's Retry-After is the time until
	// the oldest of them leaves the window, unless RetryAfter is set.
	Sliding bool

	// Headers is the family of rate-limit headers sent with every answer
	// the limiter decides, describing the limiter's state after the request
	// (see HeaderStyle for exactly what is sent). Default None. Needs Rate
	// or Window.
	Headers HeaderStyle

	// LimitStatus is answered when the limiter refuses a request: 429 or
	// 503. Default: 429.
	LimitStatus int

	// Status, when set, is answered to every request under the prefix
	// without consulting the bucket (e.g. 503; or 429 with a long RetryAfter
	// to drive a platform into cooldown — see Blocked). Default: 0 (normal).
	Status int

	// RetryAfter is the Retry-After sent with every 429 and 503 (limited or
	// forced), rounded up to whole seconds. Default: DefaultRetryAfter (1 s).
	// NoRetryAfter (or any negative value) omits the header.
	RetryAfter time.Duration

	// RetryAfterDate sends Retry-After as an HTTP-date (now + RetryAfter)
	// instead of seconds.
	RetryAfterDate bool

	// Delay is waited before answering (any status); a client that hangs up
	// or a Close ends it early. Default: 0.
	Delay time.Duration

	// BodySize is the size of a 200 body in bytes. Default (0): a short line
	// naming the path and Version.
	BodySize int

	// Validators sends an ETag and a Last-Modified with 200 answers and
	// answers 304 to a request whose If-None-Match matches the ETag (or, with
	// no If-None-Match, whose If-Modified-Since is not before Last-Modified).
	Validators bool

	// Version is the content's version: changing it changes the body and
	// the ETag, as if the resource had been updated.
	Version int

	// LastModified is the Last-Modified sent when Validators is set.
	// Default: the server's creation time (whole seconds).
	LastModified time.Time

	// RedirectTo, when set, answers every request under the prefix with a
	// 302 to this URL (absolute or relative), without consulting the
	// limiter: for redirect chains, e.g. one ending at a private address
	// the SSRF guard must refuse. Not with Status.
	RedirectTo string

	// RawHeaders are added to every answer under the prefix as they are,
	// replacing a header the rule would send under the same name (compared
	// case-insensitively): names are written as given, not canonicalised,
	// and values are not checked, so they can carry
	// invalid UTF-8, NUL, megabyte values, an overflowing, negative or
	// fractional Retry-After, an HTTP-date in year 9999. net/http writes
	// each value's bytes unchanged, except CR and LF, which it sends as
	// spaces (no header injection). Names must be HTTP tokens.
	RawHeaders map[string][]string
}

// Blocked returns a Rule that answers 429 with the given Retry-After to every
// request: a platform that says "stop", for cooldown tests.
func Blocked(retryAfter time.Duration) Rule {
	return Rule{Status: http.StatusTooManyRequests, RetryAfter: retryAfter}
}

func (r Rule) validate(prefix string) error {
	switch {
	case math.IsNaN(r.Rate) || math.IsInf(r.Rate, 0) || r.Rate < 0:
		return fmt.Errorf("%w %q: Rate %v must be a finite number ≥ 0", ErrInvalidRule, prefix, r.Rate)
	case r.Burst < 0:
		return fmt.Errorf("%w %q: Burst %d must be ≥ 0", ErrInvalidRule, prefix, r.Burst)
	case r.LimitStatus != 0 && r.LimitStatus != http.StatusTooManyRequests && r.LimitStatus != http.StatusServiceUnavailable:
		return fmt.Errorf("%w %q: LimitStatus %d must be 429 or 503", ErrInvalidRule, prefix, r.LimitStatus)
	case r.Status != 0 && (r.Status < 200 || r.Status > 599):
		return fmt.Errorf("%w %q: Status %d must be a final HTTP status (200–599)", ErrInvalidRule, prefix, r.Status)
	case r.Delay < 0:
		return fmt.Errorf("%w %q: Delay %s must be ≥ 0", ErrInvalidRule, prefix, r.Delay)
	case r.BodySize < 0:
		return fmt.Errorf("%w %q: BodySize %d must be ≥ 0", ErrInvalidRule, prefix, r.BodySize)
	case r.Window < 0:
		return fmt.Errorf("%w %q: Window %s must be ≥ 0", ErrInvalidRule, prefix, r.Window)
	case r.Window > 0 && r.WindowLimit < 1:
		return fmt.Errorf("%w %q: WindowLimit %d must be ≥ 1 with Window", ErrInvalidRule, prefix, r.WindowLimit)
	case r.Strict && r.Rate == 0:
		return fmt.Errorf("%w %q: Strict needs a Rate", ErrInvalidRule, prefix)
	case r.Sliding && r.Window == 0:
		return fmt.Errorf("%w %q: Sliding needs a Window", ErrInvalidRule, prefix)
	case r.Window == 0 && r.WindowLimit != 0:
		return fmt.Errorf("%w %q: WindowLimit %d needs a Window", ErrInvalidRule, prefix, r.WindowLimit)
	case r.Window > 0 && r.Rate > 0:
		return fmt.Errorf("%w %q: Window and Rate are two limiters; set one", ErrInvalidRule, prefix)
	case r.Headers < None || r.Headers > IETFDraft:
		return fmt.Errorf("%w %q: Headers %d is not a HeaderStyle", ErrInvalidRule, prefix, int(r.Headers))
	case r.Headers != None && r.Rate == 0 && r.Window == 0:
		return fmt.Errorf("%w %q: Headers %s needs a limiter (Rate or Window)", ErrInvalidRule, prefix, r.Headers)
	case r.RedirectTo != "" && r.Status != 0:
		return fmt.Errorf("%w %q: RedirectTo and Status both answer every request; set one", ErrInvalidRule, prefix)
	}
	if r.RedirectTo != "" {
		if _, err := url.Parse(r.RedirectTo); err != nil {
			return fmt.Errorf("%w %q: RedirectTo: %v", ErrInvalidRule, prefix, err)
		}
	}
	for name := range r.RawHeaders {
		if !validHeaderName(name) {
			return fmt.Errorf("%w %q: RawHeaders name %q is not an HTTP token", ErrInvalidRule, prefix, name)
		}
	}
	return nil
}

func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// ruleState is an installed rule with its limiter.
type ruleState struct {
	rule  Rule
	limit *Limiter // nil when unlimited
}

func newRuleState(r Rule, created time.Time) *ruleState {
	if r.LastModified.IsZero() {
		r.LastModified = created
	}
	r.LastModified = r.LastModified.UTC().Truncate(time.Second)
	st := &ruleState{rule: r.withDefaults(), limit: newLimiter(r)}
	return st
}
