package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/pacer/riverpace"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/recorder"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sources"
)

// Pacer is what a fetch job needs from the shared pacer (*pacer.Pacer):
// riverpace's, since the fetch job takes its slots by the rules of every
// paced River job (riverpace.Middleware.Slot).
type Pacer = riverpace.Pacer

// FetchWorker is the River worker of fetch jobs: reserve the pacer (snooze
// if the wait is long, as it is while the platform cools down) → fetch →
// classify → report to the pacer → record the check and, when rate limited,
// the platform's cooldown.
type FetchWorker struct {
	river.WorkerDefaults[queue.FetchArgs]

	pool     *pgxpool.Pool
	recorder *recorder.Recorder
	waker    *queue.Waker
	pacer    Pacer
	pacing   *riverpace.Middleware // the slot rules every paced job follows
	fetcher  fetch.Fetcher
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
	Recorder *recorder.Recorder
	// Waker, if set (and stopped after the River client), wakes the jobs
	// snoozed for a hold (a Retry-After, a cooldown, a timed pause) when it
	// ends, in due order (queue.Waker), instead of at River's scheduler's
	// next run behind the jobs queued meanwhile. The Pacer says how long a
	// platform or key is held by a method HoldLeft(platform, key string)
	// time.Duration, as *pacer.Pacer does. Default nil: River's scheduler
	// brings them back.
	Waker *queue.Waker
	// MaxWait is the longest pacer wait a job sleeps through while holding its
	// worker slot; a longer one snoozes the job instead. Default
	// DefaultMaxWait.
	MaxWait time.Duration
	// MaxSleepers is how many jobs of one held platform sleep for their
	// slots at once in this process; more snooze unless their slot is within
	// riverpace.MinSnooze, leaving the workers to the other platforms
	// (riverpace.Config.MaxSleepers). Default 0: no limit; the worker sets
	// half its concurrency.
	MaxSleepers int
	// Clock times the fetch's duration when the fetcher does not. Default
	// (nil): the real clock. (The pacer sleeps on its own.)
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

// DefaultMaxWait is JobConfig.MaxWait's default: riverpace's.
const DefaultMaxWait = riverpace.DefaultMaxWait

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
	case cfg.MaxSleepers < 0:
		return nil, fmt.Errorf("worker: JobConfig.MaxSleepers must be ≥ 0, got %d", cfg.MaxSleepers)
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
	pacing, err := riverpace.New(riverpace.Config{Pacer: cfg.Pacer, Platform: riverpace.ArgsField("platform"),
		MaxWait: cfg.MaxWait, MaxSleepers: cfg.MaxSleepers, Rand: cfg.Rand, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return &FetchWorker{pool: cfg.Pool, recorder: cfg.Recorder, waker: cfg.Waker, pacer: cfg.Pacer, pacing: pacing, fetcher: cfg.Fetcher,
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
	if job.Attempt > 1 || args.URL == "" {
		// A retry, or a job rescued from a worker that died — whatever the
		// job carries: River completes jobs in batches after Work returns,
		// so the check may already be recorded (the source is then no
		// longer queued by this job): do not fetch it again. A job queued
		// by id alone (its URL carries credentials) loads the source here.
		src, err := sources.GetSource(ctx, w.pool, args.SourceID)
		if errors.Is(err, sources.ErrNotFound) {
			return nil // removed since it was queued
		}
		if err != nil {
			return err
		}
		if job.Attempt > 1 && (src.QueuedJobID == nil || *src.QueuedJobID != job.ID) {
			return nil
		}
		if !src.Enabled {
			return sources.Release(ctx, w.pool, src.ID)
		}
		if args.URL == "" {
			args = queue.FetchArgs{SourceID: src.ID, Platform: src.Platform, Key: src.Key, URL: src.URL,
				ETag: deref(src.ETag), LastModified: deref(src.LastModified)}
		}
	}

	res, r, err := w.slotAndFetch(ctx, job, args)
	if err != nil {
		return err
	}
	if !r.Outcome.Valid() {
		r = fetch.Result{Outcome: fetch.Failed, Reason: fmt.Sprintf("fetcher returned an unknown outcome %q", r.Outcome)}
	}

	// Report to the pacer first: the fleet learns of pressure as soon as
	// possible. A report never fails the job (while the database is
	// unreachable the pacer drops reports and counts them).
	// What the destination announced in its rate-limit headers goes with
	// every outcome (a 404 can carry a quota too).
	out := pacer.Feedback{Kind: pacer.Neutral, NoAnswer: r.Status == 0, Quota: r.RateLimit, Sent: r.Sent}
	switch r.Outcome {
	case fetch.OK, fetch.NotModified:
		out.Kind = pacer.Clean
	case fetch.RatePressure, fetch.RateLimited:
		out.Kind, out.RetryAfter = pacer.Pressure, min(max(r.RetryAfter, 0), pacer.MaxHold)
		if r.Status == http.StatusServiceUnavailable {
			out.Scope = pacer.ScopePlatform // the server is struggling, not one key's quota
		}
	}
	outcome := r.Outcome
	cause := sources.CauseStop // of a cooldown: the fetcher's RateLimited
	if outcome == fetch.RateLimited && r.RetryAfter > 0 {
		cause = sources.CauseRetryAfter
	}
	if outcome == fetch.RatePressure && r.Reason == "" {
		r.Reason = pressureReason(r)
	}
	// Every fetch is reported, answered or not: the report gives the
	// request's open-request lease back and moves the schedule for a late
	// write (a fetch without an answer counts for nothing else).
	rr, err := w.pacer.Report(ctx, args.Platform, res, out)
	if err != nil {
		w.logger.Warn("pacer report failed", "platform", args.Platform, "err", err)
	}
	if outcome == fetch.RatePressure && rr.AtMax {
		outcome, cause = fetch.RateLimited, sources.CauseSlowestPace
		r.Reason = fmt.Sprintf("%s at the slowest pace (ceiling ÷ %g, the maximum multiplier)", r.Reason, rr.MaxMultiplier)
	}
	w.metrics.fetched(args.Platform, outcome)

	check := sources.Check{
		Outcome: string(outcome), Status: r.Status, ETag: r.ETag, LastModified: r.LastModified,
		ContentHash: r.ContentHash, JobID: job.ID, Duration: r.Duration, Bytes: r.Bytes, Worker: w.worker,
		Multiplier: res.Multiplier,
	}
	if outcome != fetch.OK && outcome != fetch.NotModified {
		check.Error = r.Reason // every check that is not OK says why
	}
	w.logOutcome(args, outcome, r)
	// A key's stop is the key's: the pacer holds the key fleet-wide (its
	// Retry-After, at most a day) and the platform's other keys go on; a
	// platform's stop cools the whole platform down.
	keyStop := outcome == fetch.RateLimited && out.Kind == pacer.Pressure && out.ScopeFor(res) == pacer.ScopeKey
	if outcome != fetch.RateLimited || keyStop {
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
	until, count, err := control.CoolDown(ctx, tx, args.Platform, cause, r.RetryAfter, reason, w.rand())
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

// slotAndFetch takes the job's slot and fetches. When the fetch sent
// nothing because the process was paused past the slot's SendBy (between
// the slot and the write), the slot is given back and a new one taken, up
// to pacer.MaxLateSends times.
func (w *FetchWorker) slotAndFetch(ctx context.Context, job *river.Job[queue.FetchArgs], args queue.FetchArgs) (pacer.Reservation, fetch.Result, error) {
	for late := 0; ; late++ {
		res, err := w.pacing.SlotKey(ctx, job.JobRow, args.Platform, args.Key)
		if err != nil {
			var snooze *river.JobSnoozeError
			if errors.As(err, &snooze) {
				w.metrics.snoozed(args.Platform, snoozeReason(res))
				w.wakeAfterHold(args)
			}
			return res, fetch.Result{}, err
		}
		w.metrics.waited(args.Platform, res.Wait)
		sendBy := res.SendBy
		if late >= pacer.MaxLateSends {
			sendBy = time.Time{}
		}
		done := w.metrics.sending(args.Platform) // in flight until the answer (or its absence) is in
		r := w.fetcher.Fetch(ctx, fetch.Request{
			SourceID: args.SourceID, Platform: args.Platform, URL: args.URL,
			ETag: args.ETag, LastModified: args.LastModified, SendBy: sendBy,
		})
		done(r.Status, r.Duration)
		if ctx.Err() != nil {
			return res, r, interrupted(ctx, ctx.Err())
		}
		if !errors.Is(r.Err, fetch.ErrLate) {
			return res, r, nil
		}
		// Nothing was sent: give the slot back (an open-request lease with
		// it) and count it as the pacer counts a slot woken late for.
		if _, err := w.pacer.Report(ctx, args.Platform, res, pacer.Feedback{Kind: pacer.Neutral, NoAnswer: true}); err != nil {
			w.logger.Warn("pacer report failed", "platform", args.Platform, "err", err)
		}
		w.metrics.lateSend(args.Platform)
	}
}

// keyHolder is a Pacer that says how long a platform or its key is held
// (*pacer.Pacer).
type keyHolder interface {
	HoldLeft(platform, key string) time.Duration
}

// wakeAfterHold asks the Waker to wake the jobs of args' platform (or of
// its key, when the key's own hold is the longer) when the hold that
// snoozed this job ends.
func (w *FetchWorker) wakeAfterHold(args queue.FetchArgs) {
	h, ok := w.pacer.(keyHolder)
	if w.waker == nil || !ok {
		return
	}
	platform, both := h.HoldLeft(args.Platform, ""), h.HoldLeft(args.Platform, args.Key)
	key := ""
	if both > platform {
		key = args.Key
	}
	if both > 0 && both < pacer.MaxHold {
		w.waker.WakeAt(args.Platform, key, w.clock.Now().Add(both))
	}
}

// logOutcome logs what an operator must see: every failed fetch, once,
// and the start of a platform's rate limiting (pressure or a cooldown),
// once per episode: a clean response ends the episode.
func (w *FetchWorker) logOutcome(args queue.FetchArgs, outcome fetch.Outcome, r fetch.Result) {
	switch outcome {
	case fetch.Failed:
		w.logger.Warn("fetch failed", "source", args.SourceID, "platform", args.Platform,
			"url", redact.URL(args.URL), "status", r.Status, "reason", r.Reason)
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

// pressureReason is the reason of rate pressure a fetcher gave none for:
// its status and Retry-After.
func pressureReason(r fetch.Result) string {
	reason := "rate pressure"
	if r.Status != 0 {
		reason = fmt.Sprintf("HTTP %d", r.Status)
	}
	if r.RetryAfter > 0 {
		reason += fmt.Sprintf(", Retry-After %s", r.RetryAfter)
	}
	return reason
}

// snoozeReason says why a job denied a slot snoozes, for the metrics: an
// operator's pause, a long hold (a cooldown, a Retry-After), or the pacer's
// schedule.
func snoozeReason(res pacer.Reservation) string {
	switch {
	case res.Paused:
		return "paused"
	case res.Wait > time.Minute:
		return "hold"
	}
	return "pacer"
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
