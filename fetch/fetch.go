// Package fetch defines how fleetpace fetches a source and classifies what
// happened, and ships the built-in HTTP fetcher.
//
// A Fetcher turns a Request (a source's URL plus the validators kept from its
// previous fetch) into a Result whose Outcome drives everything downstream:
// the shared pacer's backoff, the platform cooldown and the source's failure
// count. Library users plug in their own Fetcher (an API client, a scraper) by
// implementing one method; HTTP is the built-in one, used by `fleetpace worker`.
package fetch

import (
	"context"
	"time"

	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/fleetpace/fleetpace/sendby"
)

// ErrLate is the error of a fetch that sent nothing because its request
// would have left after Request.SendBy (Result.Err wraps it; the Outcome is
// Failed, and the caller decides: the worker reserves a new slot). It is
// sendby.ErrLate.
var ErrLate = sendby.ErrLate

// Request is one fetch of one source.
type Request struct {
	// SourceID is the source's id, for logging and custom fetchers.
	SourceID int64
	// Platform is the source's platform name.
	Platform string
	// URL is what to fetch.
	URL string
	// ETag is the validator returned by the previous fetch ("" if none). The
	// HTTP fetcher sends it as If-None-Match.
	ETag string
	// LastModified is the Last-Modified value returned by the previous fetch
	// ("" if none). The HTTP fetcher sends it as If-Modified-Since.
	LastModified string
	// SendBy is the latest time the request may leave (zero: no bound):
	// the slot's pacer.Reservation.SendBy, so that a process paused after
	// its slot sends nothing rather than a request that would put more than
	// the ceiling into one of the destination's seconds. The HTTP fetcher
	// checks it as the request is written to its connection, the last
	// moment the process controls (on an HTTP/2 connection, as the
	// connection is given), and returns Failed with Err wrapping ErrLate
	// when it sent nothing.
	SendBy time.Time
}

// Outcome classifies a fetch. The worker reports it to the pacer and updates
// the source and the platform's cooldown from it; the store records it as
// it is (a check's outcome, a source's last outcome, the fetch history), and
// status, the dashboard and the command line read it back as an Outcome.
type Outcome string

const (
	// OK: the content was fetched (HTTP 2xx).
	OK Outcome = "ok"
	// NotModified: the content has not changed since the previous fetch
	// (HTTP 304 to a conditional request).
	NotModified Outcome = "not_modified"
	// RatePressure: the destination pushes back (HTTP 429 or 503). The shared
	// pacer backs off; the source's failure count is not raised.
	RatePressure Outcome = "rate_pressure"
	// RateLimited: the platform says stop. The worker puts the whole platform
	// into cooldown; the source's failure count is not raised. The HTTP
	// fetcher returns it for a 429/503 whose Retry-After exceeds
	// HTTPConfig.RateLimitedAfter; a custom fetcher returns it explicitly
	// (for example when an API reports its quota exhausted).
	RateLimited Outcome = "rate_limited"
	// Failed: anything else (other statuses, transport errors, refused
	// addresses, oversized bodies). Raises the source's failure count.
	Failed Outcome = "failed"
)

// Outcomes lists every outcome, in the order people read them.
var Outcomes = []Outcome{OK, NotModified, RatePressure, RateLimited, Failed}

// Valid reports whether o is one of the five outcomes. The worker uses it to
// reject a custom fetcher's malformed result.
func (o Outcome) Valid() bool {
	switch o {
	case OK, NotModified, RatePressure, RateLimited, Failed:
		return true
	}
	return false
}

// Result is what a fetch produced.
type Result struct {
	// Outcome classifies the fetch.
	Outcome Outcome
	// Status is the final HTTP status code, 0 when there was no response
	// (transport error, refused address) or the fetcher is not HTTP.
	Status int
	// ETag and LastModified are the validators to keep for the next fetch:
	// the response's for OK (empty when the response had none), the
	// response's or else the request's for NotModified, and the request's,
	// carried over, for every other outcome. The HTTP fetcher passes on only
	// values SanitizeValidator accepts (valid UTF-8, no control characters,
	// at most MaxValidatorLen bytes); an invalid one is treated as absent.
	ETag, LastModified string
	// ContentHash is the hex SHA-256 of the body for OK, empty otherwise.
	ContentHash string
	// Bytes is the body size for OK, 0 otherwise.
	Bytes int64
	// RetryAfter is how long the destination asked to be left alone
	// (Retry-After) with a 429 or 503, 0 if it did not say. The HTTP fetcher
	// caps it at ratelimit.MaxWait (24 h); a custom fetcher should too.
	RetryAfter time.Duration
	// RateLimit is what the response's headers said about the destination's
	// rate limit (Retry-After, quota, remaining, reset), for every response
	// whatever its status; zero when there was no response. Every duration
	// in it is capped at ratelimit.MaxWait.
	RateLimit ratelimit.Info
	// Sent is when the request was written (zero: unknown): the HTTP
	// fetcher's time of the write its send-by check let through, for the
	// pacer to move the schedule after a write that went late
	// (pacer.Feedback.Sent).
	Sent time.Time
	// Reason says in words what happened. Always set for Failed and
	// RateLimited (and by the HTTP fetcher for RatePressure), e.g. "HTTP
	// 404 Not Found", "HTTP 429 Too Many Requests, Retry-After 10s" or
	// "refused: 127.0.0.1 is a loopback address".
	Reason string
	// Err is the error behind a Failed outcome when there is one (transport,
	// SSRF guard, body, store, invalid URL), for errors.Is and errors.As —
	// errors.Is(res.Err, ErrRefusedAddress) tells a refused address. Nil for
	// a Failed status (HTTP 404) and for every other outcome.
	Err error
	// Duration is how long the fetch took (wall clock).
	Duration time.Duration
}

// Fetcher fetches one source. Implementations must be safe for concurrent
// use, must return promptly when ctx ends (a Failed result is fine: the
// worker checks ctx itself and retries an interrupted job) and never panic.
// Errors are results: a fetcher classifies them into an Outcome and a Reason
// rather than returning them.
//
// To signal "the platform says stop" — a quota exhausted, an account
// suspended for an hour — return Outcome RateLimited (optionally with
// RetryAfter): the worker cools the whole platform down.
type Fetcher interface {
	Fetch(ctx context.Context, req Request) Result
}

// FetcherFunc adapts a function to the Fetcher interface.
type FetcherFunc func(ctx context.Context, req Request) Result

// Fetch calls f(ctx, req).
func (f FetcherFunc) Fetch(ctx context.Context, req Request) Result { return f(ctx, req) }
