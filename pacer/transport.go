package pacer

import (
	"context"
	"errors"
	"fmt"
	"github.com/fleetpace/fleetpace/clock"
	"net/http"
	"strings"
	"time"

	"github.com/fleetpace/fleetpace/ratelimit"
)

// Transport is an http.RoundTripper that paces every request it sends by
// the shared pacer: any number of clients in any number of processes
// sharing one PostgreSQL keep each destination under its platform's
// fleet-wide ceiling, back off together, and hold together when one of them
// is told Retry-After.
//
//	client := &http.Client{Transport: &pacer.Transport{Pacer: p}}
//
// Each request is mapped to a platform (by default its host name, which must
// be a platform: `fleetpace platforms set api.example.com --rate 10`). Before
// sending, the request waits for its slot (Acquire), for as long as its
// context allows; a request that cannot get a slot before its context's
// deadline (or within MaxWait) fails at once with a *WaitError wrapping
// ErrNoSlot, and is not sent. After the answer, the pacer is told what it
// said: 429 and 503 are rate pressure (the fleet slows down at once, and
// Retry-After, in either form, holds every process), other answers are
// clean, and the destination's rate-limit headers (ratelimit.Parse) pace the
// fleet by what it announces; a request that got no answer is neutral.
// Each hop of a redirect is a request of its own, paced by its own host.
//
// The zero value is not usable: Pacer is required. A Transport is safe for
// concurrent use.
type Transport struct {
	// Pacer is the shared pacer. Required.
	Pacer *Pacer

	// Base sends the requests. Default: http.DefaultTransport.
	Base http.RoundTripper

	// Platform maps a request to its platform; "" sends the request
	// unpaced. Default: PlatformByHost (the URL's host name, lower case).
	Platform func(*http.Request) string

	// Key, if set, maps a request to its key within its platform — which
	// account, token or tenant it speaks for (e.g. by the credential it
	// carries; never the secret itself) —: the request takes a slot of its
	// key and of its platform both (ReserveKey), and a 429 with a
	// Retry-After holds the key alone. Default: no key.
	Key func(*http.Request) string

	// MaxWait bounds how long a request waits for its slot, in addition to
	// its context's deadline (http.Client.Timeout sets one). Default
	// MaxHold: the context alone decides.
	MaxWait time.Duration

	// Classify says what an answer tells the pacer. Default ClassifyStatus:
	// 429 and 503 are Pressure, any other status Clean. The Retry-After and
	// quota headers are read whatever the kind.
	Classify func(*http.Response) Kind

	// CreatePlatform, if set, is called when a request's platform does not
	// exist, and the request then asks again, once; for example
	// func(ctx context.Context, name string) error {
	//	_, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: name, RatePerSec: 5})
	//	return err
	// }. Default: nil, and such a request fails with an error wrapping
	// ErrUnknownPlatform, unsent: a destination is never hit unpaced by
	// accident.
	CreatePlatform func(ctx context.Context, platform string) error
}

// PlatformByHost is Transport's default platform of a request: its URL's
// host name in lower case, without the port ("api.example.com",
// "127.0.0.1"). An IPv6 literal is not a valid platform name: map such
// requests with a function of your own.
func PlatformByHost(req *http.Request) string {
	return strings.ToLower(req.URL.Hostname())
}

// ClassifyStatus is Transport's default classification of an answer: 429
// (Too Many Requests) and 503 (Service Unavailable) are rate pressure, every
// other status is clean.
func ClassifyStatus(resp *http.Response) Kind {
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return Pressure
	}
	return Clean
}

// RoundTrip waits for the request's slot, sends it with Base and reports
// what the answer said. It returns a *WaitError (nothing sent) when no slot
// comes before the request's deadline, the context's error when the request
// is cancelled while it waits (nothing sent), and an error wrapping
// ErrUnknownPlatform for a platform that does not exist (nothing sent).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	platformOf := t.Platform
	if platformOf == nil {
		platformOf = PlatformByHost
	}
	platform := platformOf(req)
	if platform == "" {
		return base.RoundTrip(req)
	}
	if t.Pacer == nil {
		closeBody(req)
		return nil, errors.New("pacer: Transport.Pacer is required")
	}
	p := t.Pacer
	ctx := req.Context()
	maxWait := t.MaxWait
	if maxWait <= 0 {
		maxWait = MaxHold
	}
	key := ""
	if t.Key != nil {
		key = t.Key(req)
	}
	res, err := t.acquire(ctx, platform, key, maxWait)
	if errors.Is(err, ErrUnknownPlatform) && t.CreatePlatform != nil {
		if cerr := t.CreatePlatform(ctx, platform); cerr != nil {
			closeBody(req)
			return nil, fmt.Errorf("pacer: create platform %q: %w", platform, cerr)
		}
		res, err = t.acquire(ctx, platform, key, maxWait)
	}
	if errors.Is(err, ErrUnknownPlatform) {
		err = fmt.Errorf("%w (the platform of requests to %s; nothing was sent)", err, req.URL.Host)
	}
	if err != nil {
		closeBody(req)
		return nil, err
	}

	resp, err := base.RoundTrip(req)
	out := Feedback{Kind: Neutral, NoAnswer: err != nil}
	if err == nil {
		classify := t.Classify
		if classify == nil {
			classify = ClassifyStatus
		}
		out.Quota = ratelimit.Parse(resp.Header, p.clock.Now())
		out.Kind = classify(resp)
		if out.Kind == Pressure {
			out.RetryAfter = out.Quota.RetryAfter
		}
	}
	// The fleet learns of pressure before the caller sees the answer; the
	// report outlives a request cancelled meanwhile.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StatementTimeout)
	defer cancel()
	if _, rerr := p.Report(rctx, platform, res, out); rerr != nil {
		p.log.Warn("pacer: transport report failed", "platform", platform, "error", rerr)
	}
	return resp, err
}

// closeBody closes a request's body that will not be sent, as a
// RoundTripper must.
func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// acquire takes the request's slot within maxWait, asking again after a
// denial that ends within it (a key's callers wait behind a hold the one
// whose turn it is waits out, where a River job would snooze): a request's
// goroutine is cheap, a worker is not. A pause is not waited out.
func (t *Transport) acquire(ctx context.Context, platform, key string, maxWait time.Duration) (Reservation, error) {
	c := t.Pacer.clock
	start := c.Now()
	left := func() time.Duration {
		l := maxWait - c.Since(start)
		if d, ok := ctx.Deadline(); ok {
			l = min(l, time.Until(d))
		}
		return max(l, 0)
	}
	for {
		res, err := t.Pacer.AcquireKey(ctx, platform, key, left())
		var we *WaitError
		if !errors.As(err, &we) || we.Paused || we.Wait >= left() {
			return res, err
		}
		if err := clock.Sleep(ctx, c, max(we.Wait, time.Millisecond)); err != nil {
			return res, fmt.Errorf("pacer: acquire %s: %w", platform, err)
		}
	}
}
