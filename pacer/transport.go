package pacer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/fleetpace/fleetpace/sendby"
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

	// Base sends the requests. Default: a clone of http.DefaultTransport
	// whose connections check each request's send-by time as it is written
	// (sendby): a request that would leave after its slot's
	// Reservation.SendBy sends nothing, and the Transport takes a new slot
	// for it (MaxLateSends). To keep that check with a transport of your
	// own, make its DialContext sendby.Dial(yours); without it the slot is
	// checked when the caller wakes for it (Sleep).
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
		base = defaultBase()
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
	var (
		res  Reservation
		resp *http.Response
		err  error
		sent time.Time // when the request was written (sendby)
	)
	for late := 0; ; late++ {
		res, err = t.slot(ctx, req, platform, key, maxWait)
		if err != nil {
			closeBody(req)
			return nil, err
		}
		by := res.SendBy
		if late >= MaxLateSends {
			by = time.Time{}
		}
		sctx, gate, cancel := sendby.Arm(ctx, by, p.clock)
		resp, err = base.RoundTrip(req.WithContext(sctx))
		sent = gate.Sent()
		if err == nil {
			resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
			break
		}
		cancel()
		if !gate.Refused() {
			break
		}
		// Nothing was sent: give the slot back (an open-request lease with
		// it) and take a new one, if the request can be sent again.
		p.late.Add(1)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StatementTimeout)
		if _, rerr := p.Report(rctx, platform, res, Feedback{Kind: Neutral, NoAnswer: true}); rerr != nil {
			p.log.Warn("pacer: transport report failed", "platform", platform, "error", rerr)
		}
		rcancel()
		again, rerr := rewound(req)
		if rerr != nil {
			return nil, fmt.Errorf("pacer: %s: %w (%w)", platform, sendby.ErrLate, rerr)
		}
		req = again
	}
	out := Feedback{Kind: Neutral, NoAnswer: err != nil, Sent: sent}
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

// MaxLateSends is how many slots in a row a request gives up because it
// would have left after the slot's send-by time; the next is sent all the
// same (a machine that is late every time must still make progress), as
// Wait and Acquire use a third slot they woke late for. The worker's
// fetch job and Transport follow it.
const MaxLateSends = 2

// slot takes the request's slot, creating its platform once if
// CreatePlatform allows.
func (t *Transport) slot(ctx context.Context, req *http.Request, platform, key string, maxWait time.Duration) (Reservation, error) {
	res, err := t.acquire(ctx, platform, key, maxWait)
	if errors.Is(err, ErrUnknownPlatform) && t.CreatePlatform != nil {
		if cerr := t.CreatePlatform(ctx, platform); cerr != nil {
			return res, fmt.Errorf("pacer: create platform %q: %w", platform, cerr)
		}
		res, err = t.acquire(ctx, platform, key, maxWait)
	}
	if errors.Is(err, ErrUnknownPlatform) {
		err = fmt.Errorf("%w (the platform of requests to %s; nothing was sent)", err, req.URL.Host)
	}
	return res, err
}

// defaultBase is Transport's default Base: http.DefaultTransport's
// settings, with connections that check a request's send-by time as it is
// written.
var defaultBase = sync.OnceValue(func() *http.Transport {
	b := http.DefaultTransport.(*http.Transport).Clone()
	b.DialContext = sendby.Dial(b.DialContext)
	return b
})

// rewound is req ready to be sent again after a write that sent nothing:
// the same request when it has no body, a copy with a new body from
// GetBody, or an error when its body cannot be read again.
func rewound(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	if req.GetBody == nil {
		_ = req.Body.Close()
		return nil, errors.New("its body cannot be read again (no GetBody): nothing was sent")
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	again := req.Clone(req.Context())
	again.Body = body
	return again, nil
}

// cancelBody cancels its request's send-by context when the caller closes
// the body: cancelling it earlier would cut the answer short.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
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
