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
//   - Before Work, it takes a slot (pacer.Acquire) and sleeps until it
//     (Middleware.Slot: the same rules for every paced job, fleetpace's own
//     fetch job included). A job whose slot is further away than
//     Config.MaxWait (5 s) is snoozed (river.JobSnooze) until about then —
//     at least MinSnooze, spread by up to 10 %; a wait longer than River's
//     scheduler lag (SchedulerLag) to within the lag of its end —, a key's
//     caller behind others of its key that would wait past MaxWait too
//     (pacer.AcquireKey), which in River v0.51 uses
//     up no attempt (the attempt count is set back; the "snoozes" metadata
//     counts it): holding a worker for a long wait would starve the
//     client's other jobs. With Config.MaxSleepers, at most that many jobs
//     of a held platform sleep at once in the process; the rest snooze
//     unless their slot is within MinSnooze, so a platform held for a few
//     seconds does not take every worker. A slot the fleet moves later while the job sleeps
//     (a slow-down seen by another process) is handled the same way, and so
//     is a slot the job woke up too late for, the third time in a row (see
//     pacer.Acquire).
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
	"sync"
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

// DefaultMaxWait is Config.MaxWait's default.
const DefaultMaxWait = 5 * time.Second

// MinSnooze is the shortest a job denied a slot snoozes. A denial always
// means "later", but the wait it names can be 0 or less (the slot's time
// rounded, or passed while the answer travelled): snoozed for that, the job
// would be back at once, spinning through River as fast as it can be
// fetched.
const MinSnooze = time.Second

// Pacer is what the middleware needs of a pacer: *pacer.Pacer, or any pacer
// that takes slots the same way (pacer.AcquireFrom) and takes reports.
type Pacer interface {
	Acquire(ctx context.Context, platform string, maxWait time.Duration) (pacer.Reservation, error)
	Report(ctx context.Context, platform string, res pacer.Reservation, out pacer.Feedback) (pacer.ReportResult, error)
}

// KeyPacer is a Pacer that also takes slots of a platform's keys
// (*pacer.Pacer is one): Config.Key needs it.
type KeyPacer interface {
	Pacer
	AcquireKey(ctx context.Context, platform, key string, maxWait time.Duration) (pacer.Reservation, error)
}

// Config configures the middleware.
type Config struct {
	// Pacer is the shared pacer (*pacer.Pacer). Required.
	Pacer Pacer

	// Platform maps a job to its platform; "" runs the job unpaced.
	// Required unless StrictPlatform is set. ByKind and ArgsField build
	// common ones.
	Platform func(job *rivertype.JobRow) string

	// Key, if set, maps a job to its key within its platform (an account,
	// a token's name, a tenant — never the secret itself; "": none): the
	// job takes a slot of its key and of its platform both, and a 429 with
	// a Retry-After holds the key alone (pacer.Feedback.Scope). The Pacer
	// must be a KeyPacer. ArgsField builds one from a job's arguments.
	Key func(job *rivertype.JobRow) string

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

	// MaxSleepers, if above 0, is how many jobs of one platform (of one
	// key, for jobs with a key) a process lets sleep for slots at once
	// while the platform is held (a Retry-After under MaxWait, a cooldown,
	// a pause) or backlogged (a reservation was lately denied for a slot
	// beyond MaxWait); the Pacer says so with a method HeldFor(platform)
	// time.Duration, as *pacer.Pacer does. A job that comes while that
	// many sleep takes a slot only within MinSnooze (a snooze could not
	// bring it back sooner) and otherwise snoozes, giving its worker to the
	// other platforms. Without it, jobs of a platform held for a few
	// seconds take every worker one after the other while they sleep
	// through the hold, and the other platforms stop. (A platform that is
	// neither is left alone: its jobs sleeping a few seconds for their
	// slots is the pace, and snoozing them would leave gaps.) Set it to
	// about half of the River client's MaxWorkers. Default 0: no limit.
	MaxSleepers int

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
	case c.MaxSleepers < 0:
		return fmt.Errorf("%w: riverpace.Config.MaxSleepers must not be negative (got %d)", ErrInvalidConfig, c.MaxSleepers)
	}
	if _, ok := c.Pacer.(KeyPacer); c.Key != nil && !ok {
		return fmt.Errorf("%w: riverpace.Config.Key needs a Pacer that takes keys (%T does not)", ErrInvalidConfig, c.Pacer)
	}
	return nil
}

// Middleware is the River worker middleware (rivertype.WorkerMiddleware).
// Install it on a client (river.Config.Middleware) or on one worker (its
// Middleware method). It is safe for concurrent use.
type Middleware struct {
	river.MiddlewareDefaults
	cfg Config

	mu       sync.Mutex
	sleepers map[sleeperKey]int // jobs in acquire (Config.MaxSleepers)
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
	key := ""
	if m.cfg.Key != nil {
		key = m.cfg.Key(job)
	}
	res, err := m.SlotKey(ctx, job, platform, key)
	if err != nil {
		return err
	}

	rep := &report{}
	err = doInner(context.WithValue(ctx, reportKey{}, rep))

	// An error says nothing of the destination (it may be the job's own):
	// it counts for nothing.
	out := pacer.Feedback{Kind: pacer.Neutral, NoAnswer: err != nil, Quota: rep.quota}
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

// Slot takes a slot on platform for job and sleeps until it: what the
// middleware does before every paced job, for a worker that reports to the
// pacer itself (fleetpace's fetch job does). It returns the reservation, or
// the error Work should return: a snooze when the slot is further away than
// Config.MaxWait (using up no attempt), an error wrapping
// pacer.ErrUnknownPlatform when the platform does not exist (River retries
// the job on its schedule; Config.CreatePlatform is tried first), the
// context's error (wrapped) when the job was interrupted. A denied
// reservation comes back with the snooze (its Wait and Paused say why).
func (m *Middleware) Slot(ctx context.Context, job *rivertype.JobRow, platform string) (pacer.Reservation, error) {
	return m.SlotKey(ctx, job, platform, "")
}

// SlotKey is Slot for a job of platform's key (the Pacer must be a
// KeyPacer for a key other than "").
func (m *Middleware) SlotKey(ctx context.Context, job *rivertype.JobRow, platform, key string) (pacer.Reservation, error) {
	res, err := m.acquire(ctx, platform, key)
	var wait *pacer.WaitError
	switch {
	case errors.As(err, &wait):
		// Snoozing uses up no attempt.
		return res, river.JobSnooze(m.spread(wait.Wait))
	case errors.Is(err, pacer.ErrUnknownPlatform):
		return res, fmt.Errorf("riverpace: job %d (%s) is paced on platform %q, which does not exist: %w",
			job.ID, job.Kind, platform, err)
	case err != nil:
		return res, fmt.Errorf("riverpace: job %d (%s): %w", job.ID, job.Kind, err)
	}
	return res, nil
}

func (m *Middleware) acquire(ctx context.Context, platform, key string) (pacer.Reservation, error) {
	acquire := m.cfg.Pacer.Acquire
	if key != "" {
		kp, ok := m.cfg.Pacer.(KeyPacer)
		if !ok {
			return pacer.Reservation{}, fmt.Errorf("riverpace: a job of key %q, and the pacer (%T) takes no keys", key, m.cfg.Pacer)
		}
		acquire = func(ctx context.Context, platform string, maxWait time.Duration) (pacer.Reservation, error) {
			return kp.AcquireKey(ctx, platform, key, maxWait)
		}
	}
	maxWait, done := m.sleep(sleeperKey{platform, key})
	defer done()
	res, err := acquire(ctx, platform, maxWait)
	if errors.Is(err, pacer.ErrUnknownPlatform) && m.cfg.CreatePlatform != nil {
		if cerr := m.cfg.CreatePlatform(ctx, platform); cerr != nil {
			return res, fmt.Errorf("create platform %q: %w", platform, cerr)
		}
		res, err = acquire(ctx, platform, maxWait)
	}
	return res, err
}

// holder is a Pacer that knows how long a platform is held or backlogged
// (*pacer.Pacer): Config.MaxSleepers acts only then.
type holder interface {
	HeldFor(platform string) time.Duration
}

// sleeperKey is what Config.MaxSleepers counts by: a platform, or a key of
// a platform (a key's jobs wait for the key's slots, which its limit
// spaces further apart than the platform's: counted with the platform's,
// they would snooze to make room for jobs of other keys).
type sleeperKey struct{ platform, key string }

// sleep is the longest a job of platform (and key) may sleep for its slot
// now: MaxWait, or MinSnooze while the platform is held and MaxSleepers
// of its jobs already sleep in this process. Call done when the job no longer sleeps.
func (m *Middleware) sleep(k sleeperKey) (maxWait time.Duration, done func()) {
	if m.cfg.MaxSleepers <= 0 {
		return m.cfg.MaxWait, func() {}
	}
	if h, ok := m.cfg.Pacer.(holder); !ok || h.HeldFor(k.platform) <= 0 {
		return m.cfg.MaxWait, func() {}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sleepers[k] >= m.cfg.MaxSleepers {
		return min(m.cfg.MaxWait, MinSnooze), func() {}
	}
	if m.sleepers == nil {
		m.sleepers = map[sleeperKey]int{}
	}
	m.sleepers[k]++
	return m.cfg.MaxWait, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.sleepers[k]--; m.sleepers[k] == 0 {
			delete(m.sleepers, k)
		}
	}
}

// SchedulerLag is how late River may bring back a job snoozed for longer
// than its scheduler's interval (5 s): such a job is set aside and made
// available again only at the scheduler's next run; a shorter snooze is
// available at once, due at its time.
const SchedulerLag = 5 * time.Second

// spread is how long a job snoozes for a wait d, d at least MinSnooze and
// at most pacer.MaxHold. Up to SchedulerLag it is d lengthened by up to
// 10 % (Config.Rand; a draw outside [0, 1), NaN included, counts as 0), so
// that jobs held together do not all come back at one instant. A longer
// wait is snoozed to within SchedulerLag of its end, spread over that
// span: River's lag then brings the job back by the end at the latest (not
// 5 s after it, with the whole fleet's jobs), and the rest of the wait it
// waits for a slot, or snoozes briefly again.
func (m *Middleware) spread(d time.Duration) time.Duration {
	d = min(max(d, MinSnooze), pacer.MaxHold)
	u := m.cfg.Rand()
	if !(u >= 0 && u < 1) {
		u = 0
	}
	if d <= SchedulerLag {
		return d + time.Duration(u*0.1*float64(d))
	}
	return d - SchedulerLag + time.Duration(u*float64(min(d/10, SchedulerLag)))
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
