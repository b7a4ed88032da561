package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
)

// Pacer is what a fetch job needs from the shared pacer (*pacer.Pacer).
type Pacer interface {
	Reserve(ctx context.Context, platform string, maxWait time.Duration) (pacer.Reservation, error)
	Sleep(ctx context.Context, res *pacer.Reservation) error
	Report(ctx context.Context, platform string, res pacer.Reservation, out pacer.Outcome) (pacer.ReportResult, error)
}

// FetchWorker is the River worker of fetch jobs: reserve the pacer (snooze
// if the wait is long, as it is while the platform cools down) → fetch →
// classify → report to the pacer → record the check and, when rate limited,
// the platform's cooldown.
type FetchWorker struct {
	river.WorkerDefaults[queue.FetchArgs]

	pool     *pgxpool.Pool
	recorder *sources.Recorder
	pacer    Pacer
	fetcher  fetch.Fetcher
	maxWait  time.Duration
	clock    clock.Clock
	rand     func() float64
	metrics  *Metrics
	logger   *slog.Logger
	worker   string
	record   func(context.Context, sources.DBTX, []sources.CheckRecord) error // with or without history
	pushback episodes                                                         // platforms in a rate-limiting episode, logged once each
}

// episodes remembers which platforms are pushing back (rate pressure or
// rate limited since their last clean response) and the escalation of the
// last cooldown logged, so that an episode and each cooldown in it are
// logged once, not once per job.
type episodes struct {
	mu       sync.Mutex
	on       map[string]bool
	cooldown map[string]int
}

// begin marks platform as pushing back and reports whether that is news.
func (e *episodes) begin(platform string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.on[platform] {
		return false
	}
	if e.on == nil {
		e.on = map[string]bool{}
	}
	e.on[platform] = true
	return true
}

// coolingDown notes that platform cools down at escalation count and
// reports whether that is news (a first cooldown in the episode, or an
// escalated one; not an active cooldown extended by a later answer).
func (e *episodes) coolingDown(platform string, count int) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cooldown[platform] == count {
		return false
	}
	if e.cooldown == nil {
		e.cooldown = map[string]int{}
	}
	e.cooldown[platform] = count
	return true
}

// end ends platform's episode (a clean response) and reports whether one
// was going on.
func (e *episodes) end(platform string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	was := e.on[platform]
	delete(e.on, platform)
	delete(e.cooldown, platform)
	return was
}

// JobConfig configures a FetchWorker.
type JobConfig struct {
	Pool    *pgxpool.Pool // required
	Pacer   Pacer         // required
	Fetcher fetch.Fetcher // required
	// Recorder, if set (and started), writes checks behind the jobs with
	// group commit (Recorder.Submit): a job does not wait for its check, and
	// concurrent jobs of the process share one statement. Default nil: each
	// job records its check with a statement of its own before it ends.
	Recorder *sources.Recorder
	// MaxWait is the longest pacer wait a job sleeps through while holding its
	// worker slot; a longer one snoozes the job instead. Default 5 s.
	MaxWait time.Duration
	// Clock is what a job sleeps on until its pacer slot, and times its
	// lateness with. Default (nil): the real clock.
	Clock clock.Clock
	// Rand draws uniform numbers in [0, 1) for cooldown and snooze jitter.
	// Default math/rand/v2.
	Rand func() float64
	// Metrics, if set, counts fetches and pacer waits.
	Metrics *Metrics
	// Logger receives a warning per failed fetch (source, URL without its
	// credentials, reason) and one per platform per episode of rate
	// limiting. Default: discard.
	Logger *slog.Logger
	// Worker names this process in the history of the checks it records
	// without a Recorder (a Recorder stamps its own). Default: "".
	Worker string
	// NoHistory records checks without their history rows when a job
	// records them itself (a Recorder has a setting of its own). Default:
	// with history.
	NoHistory bool
}

// DefaultMaxWait is JobConfig.MaxWait's default.
const DefaultMaxWait = 5 * time.Second

// NewFetchWorker builds the fetch job worker.
func NewFetchWorker(cfg JobConfig) (*FetchWorker, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("worker: JobConfig.Pool is required")
	case cfg.Pacer == nil:
		return nil, errors.New("worker: JobConfig.Pacer is required")
	case cfg.Fetcher == nil:
		return nil, errors.New("worker: JobConfig.Fetcher is required")
	case cfg.MaxWait < 0:
		return nil, fmt.Errorf("worker: JobConfig.MaxWait must be ≥ 0, got %s", cfg.MaxWait)
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.Rand == nil {
		cfg.Rand = defaultRand
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	record := sources.RecordChecks
	if cfg.NoHistory {
		record = sources.RecordChecksWithoutHistory
	}
	return &FetchWorker{pool: cfg.Pool, recorder: cfg.Recorder, pacer: cfg.Pacer, fetcher: cfg.Fetcher, maxWait: cfg.MaxWait,
		clock: clock.Or(cfg.Clock), rand: cfg.Rand, metrics: cfg.Metrics, logger: cfg.Logger, worker: cfg.Worker, record: record}, nil
}

// Work runs one fetch job: reserve → fetch → report → record. Nothing comes
// before the reservation: the tick put the URL and validators into the job,
// and a platform's cooldown is also a hold of its pacer row, so the
// reservation itself says "wait until the cooldown ends". At a high rate the
// reservation usually comes from a block (no round trip), a clean report is
// batched (none), and with a Recorder the check is written behind the job,
// in one statement with the checks of other jobs; so a job can cost no round
// trip of its own at all. Rate pressure is reported at once, and a rate-limited
// check is written with its cooldown in one transaction before the job ends.
func (w *FetchWorker) Work(ctx context.Context, job *river.Job[queue.FetchArgs]) error {
	args := job.Args
	if job.Attempt > 1 && args.URL != "" {
		// A retry, or a job rescued from a worker that died. River completes
		// jobs in batches after Work returns, so the check may already be
		// recorded (the source is then no longer queued by this job): do not
		// fetch it again.
		src, err := sources.GetSource(ctx, w.pool, args.SourceID)
		if errors.Is(err, sources.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if src.QueuedJobID == nil || *src.QueuedJobID != job.ID {
			return nil
		}
	}
	if args.URL == "" {
		// Queued without the source's details (by hand, or by an older
		// fleetpace): load them.
		src, err := sources.GetSource(ctx, w.pool, args.SourceID)
		if errors.Is(err, sources.ErrNotFound) {
			return nil // removed since it was queued
		}
		if err != nil {
			return err
		}
		if !src.Enabled {
			return sources.Release(ctx, w.pool, src.ID)
		}
		args = queue.FetchArgs{SourceID: src.ID, Platform: src.Platform, URL: src.URL,
			ETag: deref(src.ETag), LastModified: deref(src.LastModified)}
	}

	res, err := w.reserve(ctx, args.Platform)
	if err != nil {
		return err
	}

	r := w.fetcher.Fetch(ctx, fetch.Request{
		SourceID: args.SourceID, Platform: args.Platform, URL: args.URL,
		ETag: args.ETag, LastModified: args.LastModified,
	})
	if ctx.Err() != nil {
		return interrupted(ctx, ctx.Err())
	}
	if !r.Outcome.Valid() {
		r = fetch.Result{Outcome: fetch.Failed, Reason: fmt.Sprintf("fetcher returned an unknown outcome %q", r.Outcome)}
	}

	// Report to the pacer first: the fleet learns of pressure as soon as
	// possible. A report never fails the job (while the database is
	// unreachable the pacer drops reports and counts them).
	// What the destination announced in its rate-limit headers goes with
	// every outcome (a 404 can carry a quota too).
	out := pacer.Outcome{Kind: pacer.Neutral, Quota: r.RateLimit}
	switch r.Outcome {
	case fetch.OK, fetch.NotModified:
		out.Kind = pacer.Clean
	case fetch.RatePressure, fetch.RateLimited:
		out.Kind, out.RetryAfter = pacer.Pressure, min(max(r.RetryAfter, 0), pacer.MaxHold)
	}
	outcome := r.Outcome
	if out.Kind != pacer.Neutral || out.Quota.Announced() {
		rr, err := w.pacer.Report(ctx, args.Platform, res, out)
		if err != nil {
			w.logger.Warn("pacer report failed", "platform", args.Platform, "err", err)
		}
		if outcome == fetch.RatePressure && rr.AtMax {
			outcome = fetch.RateLimited
			if r.Reason == "" {
				r.Reason = fmt.Sprintf("HTTP %d while the backoff multiplier is at its maximum (%g)", r.Status, rr.MaxMultiplier)
			}
		}
	}
	w.metrics.fetched(args.Platform, string(outcome))

	check := sources.Check{
		Outcome: string(outcome), Status: r.Status, ETag: r.ETag, LastModified: r.LastModified,
		ContentHash: r.ContentHash, JobID: job.ID, Duration: r.Duration, Bytes: r.Bytes, Worker: w.worker,
		Multiplier: res.Multiplier,
	}
	if outcome == fetch.Failed || outcome == fetch.RateLimited {
		check.Error = r.Reason
	}
	w.logOutcome(args, outcome, r)
	if outcome != fetch.RateLimited {
		// Without a Recorder: one autocommit statement, then River completes
		// the job in its batched completer; should the process die in
		// between, the job is rescued and the source fetched once more. With
		// one: written behind the job, shared with other jobs' checks; should
		// the process die before that statement, the source stays queued for
		// a completed job until the tick's reconciliation releases it, and it
		// is fetched once more. At least once, either way.
		if w.recorder != nil {
			return w.recorder.Submit(ctx, args.SourceID, check)
		}
		// A check the database refuses is recorded as a failed check (the
		// job is not retried to fetch it again).
		err := w.record(ctx, w.pool, []sources.CheckRecord{{SourceID: args.SourceID, Check: check}})
		if errors.Is(err, sources.ErrCheckRefused) {
			w.logger.Warn("the database refused a check", "source", args.SourceID, "err", err)
			return nil
		}
		return w.historyLost(err)
	}
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := w.historyLost(w.record(ctx, tx, []sources.CheckRecord{{SourceID: args.SourceID, Check: check}})); err != nil {
		return err
	}
	reason := r.Reason
	if reason == "" {
		reason = "rate limited"
	}
	until, count, err := sources.SetCooldown(ctx, tx, args.Platform, r.RetryAfter, reason, w.rand())
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	if w.pushback.coolingDown(args.Platform, count) {
		w.logger.Warn("platform cooling down", "platform", args.Platform, "until", until, "escalation", count, "reason", reason)
	}
	return nil
}

// lateAttempts is how many slots in a row a job may wake up too late for
// before it snoozes (lateSnooze) instead of reserving again.
const (
	lateAttempts = 5
	lateSnooze   = time.Second
)

// historyLost logs a check recorded without its history row and returns
// nil for it (the job is done: retrying would fetch again); other errors
// are returned as they are.
func (w *FetchWorker) historyLost(err error) error {
	if errors.Is(err, sources.ErrHistoryNotRecorded) {
		w.logger.Warn("fetch history not recorded (the check is)", "err", err)
		return nil
	}
	return err
}

// logOutcome logs what an operator must see: every failed fetch, once,
// and the start of a platform's rate limiting (pressure or a cooldown),
// once per episode: a clean response ends the episode.
func (w *FetchWorker) logOutcome(args queue.FetchArgs, outcome fetch.Outcome, r fetch.Result) {
	switch outcome {
	case fetch.Failed:
		w.logger.Warn("fetch failed", "source", args.SourceID, "platform", args.Platform,
			"url", sources.RedactURL(args.URL), "status", r.Status, "reason", r.Reason)
	case fetch.RatePressure, fetch.RateLimited:
		if w.pushback.begin(args.Platform) {
			w.logger.Warn("platform is rate limiting", "platform", args.Platform, "status", r.Status,
				"retry_after", r.RetryAfter, "outcome", string(outcome), "reason", r.Reason)
		}
	case fetch.OK, fetch.NotModified:
		if w.pushback.end(args.Platform) {
			w.logger.Info("platform answers normally again", "platform", args.Platform)
		}
	}
}

// reserve takes a pacer slot and sleeps until it. It returns a snooze error
// (for River) when the wait is longer than the job should hold its worker
// slot — as it is during a hold, a pause, or after a slow-down re-spaced the
// slot beyond the max wait (the slot is then given back and the reservation
// made again, denied) — and gives up every slot it woke up too late for: a
// late request would land among the next slots' requests, and the
// destination would see more than its rate + burst in a second. After
// lateAttempts late slots in a row the job snoozes: a machine too loaded to
// wake up on time leaves the slots to the rest of the fleet for a moment.
func (w *FetchWorker) reserve(ctx context.Context, platform string) (pacer.Reservation, error) {
	for late := 0; ; {
		res, err := w.pacer.Reserve(ctx, platform, w.maxWait)
		if errors.Is(err, pacer.ErrUnknownPlatform) {
			return res, river.JobCancel(err) // the platform was deleted, and its sources with it
		}
		if err != nil {
			return res, err
		}
		if !res.Granted && res.Degraded && !res.Paused && res.Wait <= w.maxWait {
			// The database is unreachable: the pacer paces locally and books
			// a slot only a little ahead (or, for a platform it has not
			// seen, asks to come back after its latch). Ask again then,
			// holding the worker slot: a snooze would need the database.
			if err := clock.Sleep(ctx, w.clock, res.Wait); err != nil {
				return res, interrupted(ctx, err)
			}
			continue
		}
		if !res.Granted {
			// Snooze past the wait (a long one is a cooldown, a hold or a
			// pause), spread by up to 10 % so the fleet does not come back at
			// one instant. Snoozing uses up no attempt.
			reason := "pacer"
			switch {
			case res.Paused:
				reason = "paused"
			case res.Wait > time.Minute:
				reason = "hold"
			}
			w.metrics.snoozed(platform, reason)
			return res, river.JobSnooze(snoozeFor(res.Wait, w.rand()))
		}
		w.metrics.waited(platform, res.Wait)
		err = w.pacer.Sleep(ctx, &res)
		switch {
		case err == nil:
			return res, nil
		case errors.Is(err, pacer.ErrLate) && late+1 >= lateAttempts:
			w.metrics.snoozed(platform, "late")
			return res, river.JobSnooze(lateSnooze)
		case errors.Is(err, pacer.ErrLate):
			late++
			w.metrics.snoozed(platform, "late")
			w.logger.Debug("late for a pacer slot; reserving again", "platform", platform, "late", res.Late)
		case errors.Is(err, pacer.ErrGivenBack):
			w.metrics.snoozed(platform, "respaced")
		default:
			return res, interrupted(ctx, err)
		}
	}
}

// MinSnooze is the shortest a job denied a pacer slot snoozes. A denial
// always means "later", but the wait it names can be 0 or negative (the
// slot's time rounded, or passed while the answer travelled): snoozed for
// that, the job would be back at once, spinning through River as fast as it
// can be fetched.
const MinSnooze = time.Second

// snoozeFor is how long a job denied a slot snoozes: the wait, at least
// MinSnooze and at most pacer.MaxHold, spread by up to 10 % with u, a
// uniform draw in [0, 1) (clamped there).
func snoozeFor(wait time.Duration, u float64) time.Duration {
	d := min(max(wait, MinSnooze), pacer.MaxHold)
	if !(u >= 0 && u < 1) { // NaN too
		u = 0
	}
	return d + time.Duration(u*0.1*float64(d))
}

// interrupted turns a cancelled fetch into a snooze, so a job stopped by a
// shutdown runs again soon without using up an attempt; a job that ran out
// of its timeout is an ordinary error (retried with backoff).
func interrupted(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), context.Canceled) || errors.Is(err, context.Canceled) {
		return river.JobSnooze(time.Second)
	}
	return err
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
