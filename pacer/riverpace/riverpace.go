// Package riverpace paces River jobs by fleetpace's shared pacer: a River
// worker middleware that takes a slot on the job's platform before the job
// runs and tells the pacer afterwards what the job saw. Every process of
// every River client sharing one PostgreSQL then keeps each platform under
// one fleet-wide ceiling, backs off together when any job meets rate
// pressure, and holds together for a Retry-After.
//
//	mw, err := riverpace.New(riverpace.Config{
//		Pacer:          p, // pacer.New(ctx, pacer.Config{DatabaseURL: url})
//		StrictPlatform: riverpace.StrictByKind(map[string]string{"send_sms": "twilio"}),
//	})
//	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
//		Middleware: []rivertype.Middleware{mw},
//		…
//	})
//
// and in the worker, on a 429:
//
//	return riverpace.RateLimitedBy(ratelimit.Parse(resp.Header, time.Now()))
//
// What the middleware does with each job of a paced platform:
//
//   - Before Work, it takes a slot (pacer.Acquire) and sleeps until it. A job
//     whose slot is further away than Config.MaxWait (5 s) is snoozed
//     (river.JobSnooze) until about then, which in River v0.51 uses up no
//     attempt (the attempt count is set back; the "snoozes" metadata counts
//     it): holding a worker for a long wait would starve the client's other
//     jobs. A slot the fleet moves later while the job sleeps (a slow-down
//     seen by another process) is handled the same way.
//   - After Work, it reports the outcome: success is clean (it counts toward
//     the fleet-wide clean streak that relaxes the backoff); an error made by
//     RateLimited or RateLimitedBy is rate pressure (the fleet slows down at
//     once, Retry-After holds every process) and the job is snoozed until the
//     hold ends, using up no attempt; any other error is neutral (it says
//     nothing about rate) and goes back to River as it is. Quota headers a
//     job passes to Announce or RateLimitedBy pace the fleet by what the
//     destination announced.
//   - A job interrupted while it waits for its slot returns the context's
//     error (wrapped), so River's own rules apply: a client stopping puts it
//     back without using up an attempt; a job cancelled remotely is
//     cancelled.
//   - A job whose platform does not exist fails (an error wrapping
//     pacer.ErrUnknownPlatform; River retries it on its schedule) without
//     running: a job is never run unpaced by accident. Config.CreatePlatform
//     creates missing platforms instead.
//   - With Config.StrictPlatform, a job the mapping refuses (StrictByKind:
//     a kind not in the map; StrictArgsField: no platform field) fails
//     without running; with Config.Platform it would run unpaced.
//
// Jobs whose platform is "" run unpaced, so one middleware can be installed
// on the whole client. It composes with other middleware in either order.
package riverpace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/ratelimit"
)

// ErrInvalidConfig is wrapped by Config.Validate's errors.
var ErrInvalidConfig = errors.New("riverpace: invalid config")

// ErrRateLimited is wrapped by the errors RateLimited and RateLimitedBy
// make.
var ErrRateLimited = errors.New("riverpace: rate limited")

// DefaultMaxWait is Config.MaxWait's default: the fetch job's
// (worker.DefaultMaxWait).
const DefaultMaxWait = 5 * time.Second

// Config configures the middleware.
type Config struct {
	// Pacer is the shared pacer. Required.
	Pacer *pacer.Pacer

	// Platform maps a job to its platform; "" runs the job unpaced.
	// Required unless StrictPlatform is set. ByKind and ArgsField build
	// common ones.
	Platform func(job *rivertype.JobRow) string

	// StrictPlatform, instead of Platform, maps a job to its platform or
	// refuses it: a job it returns an error for fails with that error
	// (River retries it on its schedule) without running, so a kind
	// missing from a map by a typo, or arguments without the platform
	// field, never run unpaced. "" still runs a job unpaced, when the
	// mapping says so explicitly. StrictByKind and StrictArgsField build
	// common ones.
	StrictPlatform func(job *rivertype.JobRow) (string, error)

	// MaxWait is the longest wait for a slot a job sleeps through while
	// holding its worker; a longer one snoozes the job. Default
	// DefaultMaxWait (5 s).
	MaxWait time.Duration

	// CreatePlatform, if set, is called when a job's platform does not
	// exist; the job then asks for a slot again, once. The middleware does
	// not write platforms itself; for example, with package sources:
	//
	//	CreatePlatform: func(ctx context.Context, name string) error {
	//		_, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: name, RatePerSec: 5})
	//		return err
	//	},
	//
	// Default nil: such a job fails with an error wrapping
	// pacer.ErrUnknownPlatform, without running.
	CreatePlatform func(ctx context.Context, platform string) error

	// Rand draws uniform numbers in [0, 1) to spread snoozes by up to 10 %
	// (so jobs held together do not all come back at one instant). Default
	// math/rand/v2.
	Rand func() float64

	// Logger receives reports that failed. Default: discard.
	Logger *slog.Logger
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Pacer == nil:
		return fmt.Errorf("%w: riverpace.Config.Pacer is required", ErrInvalidConfig)
	case c.Platform == nil && c.StrictPlatform == nil:
		return fmt.Errorf("%w: riverpace.Config.Platform (or StrictPlatform) is required", ErrInvalidConfig)
	case c.Platform != nil && c.StrictPlatform != nil:
		return fmt.Errorf("%w: riverpace.Config.Platform and StrictPlatform are both set; set one", ErrInvalidConfig)
	case c.MaxWait < 0:
		return fmt.Errorf("%w: riverpace.Config.MaxWait must not be negative (got %s)", ErrInvalidConfig, c.MaxWait)
	}
	return nil
}

// Middleware is the River worker middleware (rivertype.WorkerMiddleware).
// Install it on a client (river.Config.Middleware) or on one worker (its
// Middleware method). It is safe for concurrent use.
type Middleware struct {
	river.MiddlewareDefaults
	cfg Config
}

var _ rivertype.WorkerMiddleware = (*Middleware)(nil)

// New validates cfg and returns the middleware.
func New(cfg Config) (*Middleware, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Middleware{cfg: cfg}, nil
}

// Work paces one job: slot, Work, report (see the package documentation).
func (m *Middleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	platform, err := m.platform(job)
	if err != nil {
		return err
	}
	if platform == "" {
		return doInner(ctx)
	}
	res, err := m.acquire(ctx, platform)
	var wait *pacer.WaitError
	switch {
	case errors.As(err, &wait):
		// Snoozing uses up no attempt.
		return river.JobSnooze(m.spread(wait.Wait))
	case errors.Is(err, pacer.ErrUnknownPlatform):
		return fmt.Errorf("riverpace: job %d (%s) is paced on platform %q, which does not exist: %w",
			job.ID, job.Kind, platform, err)
	case err != nil:
		return fmt.Errorf("riverpace: job %d (%s): %w", job.ID, job.Kind, err)
	}

	rep := &report{}
	err = doInner(context.WithValue(ctx, reportKey{}, rep))

	out := pacer.Outcome{Kind: pacer.Neutral, Quota: rep.quota}
	var limited *RateLimitedError
	switch {
	case err == nil:
		out.Kind = pacer.Clean
	case errors.As(err, &limited):
		out.Kind, out.RetryAfter = pacer.Pressure, limited.RetryAfter
		if limited.Quota.Announced() {
			out.Quota = limited.Quota
		}
	}
	// The report outlives a job cancelled meanwhile: pressure must reach the
	// fleet whatever happens to this job.
	rr, rerr := m.cfg.Pacer.Report(context.WithoutCancel(ctx), platform, res, out)
	if rerr != nil {
		m.cfg.Logger.Warn("riverpace: report failed", "platform", platform, "job_id", job.ID, "error", rerr)
	}
	if limited != nil {
		// Not a failure of the job: run it again once the hold ends.
		return river.JobSnooze(m.spread(max(limited.RetryAfter, rr.Hold)))
	}
	return err
}

// platform maps job to its platform by Config.Platform or StrictPlatform.
func (m *Middleware) platform(job *rivertype.JobRow) (string, error) {
	if m.cfg.StrictPlatform == nil {
		return m.cfg.Platform(job), nil
	}
	platform, err := m.cfg.StrictPlatform(job)
	if err != nil {
		return "", fmt.Errorf("riverpace: job %d (%s) not run: %w", job.ID, job.Kind, err)
	}
	return platform, nil
}

func (m *Middleware) acquire(ctx context.Context, platform string) (pacer.Reservation, error) {
	res, err := m.cfg.Pacer.Acquire(ctx, platform, m.cfg.MaxWait)
	if errors.Is(err, pacer.ErrUnknownPlatform) && m.cfg.CreatePlatform != nil {
		if cerr := m.cfg.CreatePlatform(ctx, platform); cerr != nil {
			return res, fmt.Errorf("create platform %q: %w", platform, cerr)
		}
		res, err = m.cfg.Pacer.Acquire(ctx, platform, m.cfg.MaxWait)
	}
	return res, err
}

// spread lengthens d by up to 10 %.
func (m *Middleware) spread(d time.Duration) time.Duration {
	d = min(max(d, 0), pacer.MaxHold)
	return d + time.Duration(m.cfg.Rand()*0.1*float64(d))
}

// RateLimitedError is the error a job returns to tell the pacer the
// destination pushed back (RateLimited, RateLimitedBy make it).
type RateLimitedError struct {
	// RetryAfter is how long the destination asked to wait (0: it did not
	// say). It holds every process of the fleet, at most pacer.MaxHold.
	RetryAfter time.Duration
	// Quota is what the destination's rate-limit headers announced.
	Quota ratelimit.Info
}

func (e *RateLimitedError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("%v (retry after %s)", ErrRateLimited, e.RetryAfter)
	}
	return ErrRateLimited.Error()
}

// Unwrap returns ErrRateLimited.
func (e *RateLimitedError) Unwrap() error { return ErrRateLimited }

// RateLimited makes the error a job returns when the destination answered
// with rate pressure (429, 503, a quota error), asking to wait retryAfter
// (0: it did not say). The middleware reports it as pressure and snoozes
// the job until the fleet's hold ends. It may be wrapped (fmt.Errorf %w).
func RateLimited(retryAfter time.Duration) error {
	return &RateLimitedError{RetryAfter: max(retryAfter, 0)}
}

// RateLimitedBy is RateLimited with what the destination's headers said
// (ratelimit.Parse): its Retry-After, and its quota, which paces the fleet.
func RateLimitedBy(info ratelimit.Info) error {
	return &RateLimitedError{RetryAfter: info.RetryAfter, Quota: info}
}

// report is what a job tells the middleware besides its error.
type report struct{ quota ratelimit.Info }

type reportKey struct{}

// Announce passes what a destination's rate-limit headers said on an
// answer that was not rate pressure (ratelimit.Parse) to the middleware,
// which reports it with the job's outcome: the fleet is then paced by the
// announced quota (a platform setting turns this off). Call it from Work
// with the context the job was given; the last call wins. Outside a paced
// job it does nothing.
func Announce(ctx context.Context, info ratelimit.Info) {
	if r, ok := ctx.Value(reportKey{}).(*report); ok {
		r.quota = info
	}
}

// ErrUnmapped is wrapped by the errors of StrictByKind and StrictArgsField:
// the job has no platform in the mapping.
var ErrUnmapped = errors.New("riverpace: no platform for the job")

// ByKind maps jobs to platforms by their kind; kinds not in the map run
// unpaced. StrictByKind refuses them instead.
func ByKind(platforms map[string]string) func(*rivertype.JobRow) string {
	return func(job *rivertype.JobRow) string { return platforms[job.Kind] }
}

// StrictByKind maps jobs to platforms by their kind, for
// Config.StrictPlatform: a kind mapped to "" runs unpaced, and a kind not
// in the map is refused with an error wrapping ErrUnmapped (the job fails
// without running).
func StrictByKind(platforms map[string]string) func(*rivertype.JobRow) (string, error) {
	return func(job *rivertype.JobRow) (string, error) {
		platform, ok := platforms[job.Kind]
		if !ok {
			return "", fmt.Errorf("%w: kind %q is not in the map of StrictByKind (map it to \"\" to run it unpaced)",
				ErrUnmapped, job.Kind)
		}
		return platform, nil
	}
}

// ArgsField maps a job to the platform named by a top-level string field of
// its arguments (their JSON key, e.g. "platform"); a job without the field
// runs unpaced. StrictArgsField refuses it instead.
func ArgsField(key string) func(*rivertype.JobRow) string {
	return func(job *rivertype.JobRow) string {
		s, _ := argsField(job, key)
		return s
	}
}

// StrictArgsField maps a job to the platform named by a top-level string
// field of its arguments, for Config.StrictPlatform: arguments without the
// field, or with one that is not a string, are refused with an error
// wrapping ErrUnmapped (the job fails without running); "" runs the job
// unpaced.
func StrictArgsField(key string) func(*rivertype.JobRow) (string, error) {
	return func(job *rivertype.JobRow) (string, error) {
		s, ok := argsField(job, key)
		if !ok {
			return "", fmt.Errorf("%w: its arguments have no string field %q (StrictArgsField)", ErrUnmapped, key)
		}
		return s, nil
	}
}

// argsField reads the top-level string field key of job's arguments.
func argsField(job *rivertype.JobRow, key string) (string, bool) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(job.EncodedArgs, &fields) != nil {
		return "", false
	}
	raw, ok := fields[key]
	if !ok {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}
