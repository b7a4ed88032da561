// Package queue builds fleetpace's River client and defines its one job kind:
// fetch a source. It also drains the queue for `fleetpace drain`.
//
// River is the durability boundary of fleetpace: a fetch that is not done is
// a job in river_job, retried or rescued by River, never lost.
package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/clock"
)

// Name is the River queue fleetpace's fetch jobs go to.
const Name = "fleetpace_fetch"

// FetchArgs are the arguments of a fetch job: check one source. The scan
// tick fills in the URL and the validators of the previous fetch, read in
// the transaction that queues the job (a queued source is not queued again,
// so nothing else changes them meanwhile); the job then needs no read before
// it fetches. A job with an empty URL loads the source first: the scan
// queues a source whose URL carries credentials that way, so that job args,
// which River UI shows, hold no secret.
type FetchArgs struct {
	SourceID     int64  `json:"source_id"`
	Platform     string `json:"platform"`
	Key          string `json:"key,omitempty"` // the source's key: its platform may limit each key
	URL          string `json:"url,omitempty"`
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"last_modified,omitempty"`
}

// Kind is the River job kind of a fetch.
func (FetchArgs) Kind() string { return "fleetpace_fetch" }

// InsertOpts puts fetch jobs on fleetpace's queue.
func (FetchArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{Queue: Name, MaxAttempts: DefaultMaxAttempts}
}

// DefaultMaxAttempts is how often a fetch job runs before River discards it.
// Snoozes (pacer waits, cooldowns) do not count as attempts.
const DefaultMaxAttempts = 5

// Defaults of Config.
const (
	DefaultMaxWorkers      = 10
	DefaultJobTimeout      = 2 * time.Minute
	DefaultRescueAfter     = 5 * time.Minute
	DefaultSoftStopTimeout = 10 * time.Second
)

// Bounds of Config: beyond them a setting is a mistake (a job timeout of
// 1 ns fails every job; River refuses more than river.QueueNumWorkersMax
// workers).
const (
	MinJobTimeout      = time.Second
	MaxJobTimeout      = 24 * time.Hour
	MaxRescueAfter     = 2 * MaxJobTimeout
	MaxSoftStopTimeout = time.Hour
)

// ErrInvalidConfig is wrapped by every error of Config.Validate and
// DrainConfig.Validate.
var ErrInvalidConfig = errors.New("invalid config")

// Config configures a River client for fleetpace. The zero value is an
// insert-only client.
type Config struct {
	// Workers registers the job workers. Default: nil, an insert-only client
	// that works no jobs.
	Workers *river.Workers

	// MaxWorkers is how many fetch jobs run at once in this process.
	// Default: DefaultMaxWorkers (only used with Workers).
	MaxWorkers int

	// JobTimeout bounds one fetch job. Default: DefaultJobTimeout.
	JobTimeout time.Duration

	// RescueAfter is how long a running job may go without finishing before
	// River treats its worker as dead and makes it available again.
	// Default: DefaultRescueAfter (must exceed JobTimeout).
	RescueAfter time.Duration

	// SoftStopTimeout is how long running jobs may finish after a stop was
	// asked for before they are cancelled. Default: DefaultSoftStopTimeout.
	SoftStopTimeout time.Duration

	// FetchPollInterval is how often an idle client looks for new jobs when no
	// notification arrives. Default: River's (1 s).
	FetchPollInterval time.Duration

	// PollOnly runs River without LISTEN/NOTIFY: no connection is held for
	// notifications; an idle client finds new jobs at its next poll
	// (FetchPollInterval) and leadership changes by polling too. For
	// PgBouncer in transaction mode, which cannot hold a LISTEN. Default
	// false: River keeps one connection LISTENing.
	PollOnly bool

	// ID names this client among the fleet. Default: River's.
	ID string

	// Middleware is installed on the client (river.Config.Middleware):
	// the worker's job metrics. Default: none.
	Middleware []rivertype.Middleware

	// Logger receives River's logs. Default: discard.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	c.MaxWorkers = cmp.Or(c.MaxWorkers, DefaultMaxWorkers)
	c.JobTimeout = cmp.Or(c.JobTimeout, DefaultJobTimeout)
	c.RescueAfter = cmp.Or(c.RescueAfter, DefaultRescueAfter)
	c.SoftStopTimeout = cmp.Or(c.SoftStopTimeout, DefaultSoftStopTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.MaxWorkers < 1 || c.MaxWorkers > river.QueueNumWorkersMax:
		return fmt.Errorf("%w: queue.Config.MaxWorkers must be in [1, %d], got %d", ErrInvalidConfig, river.QueueNumWorkersMax, c.MaxWorkers)
	case c.JobTimeout < MinJobTimeout || c.JobTimeout > MaxJobTimeout:
		return fmt.Errorf("%w: queue.Config.JobTimeout must be in [%s, %s], got %s", ErrInvalidConfig, MinJobTimeout, MaxJobTimeout, c.JobTimeout)
	case c.RescueAfter <= c.JobTimeout:
		return fmt.Errorf("%w: queue.Config.RescueAfter (%s) must exceed queue.Config.JobTimeout (%s)", ErrInvalidConfig, c.RescueAfter, c.JobTimeout)
	case c.RescueAfter > MaxRescueAfter:
		return fmt.Errorf("%w: queue.Config.RescueAfter must be at most %s, got %s", ErrInvalidConfig, MaxRescueAfter, c.RescueAfter)
	case c.SoftStopTimeout < 0 || c.SoftStopTimeout > MaxSoftStopTimeout:
		return fmt.Errorf("%w: queue.Config.SoftStopTimeout must be in [0, %s], got %s", ErrInvalidConfig, MaxSoftStopTimeout, c.SoftStopTimeout)
	}
	return nil
}

// Client is the River client type fleetpace uses.
type Client = river.Client[pgx.Tx]

// NewClient builds a River client over pool.
func NewClient(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	rc := &river.Config{
		ID:                   cfg.ID,
		Logger:               cfg.Logger,
		JobTimeout:           cfg.JobTimeout,
		RescueStuckJobsAfter: cfg.RescueAfter,
		FetchPollInterval:    cfg.FetchPollInterval,
		PollOnly:             cfg.PollOnly,
		SkipUnknownJobCheck:  true,
		Middleware:           cfg.Middleware,
	}
	if cfg.Workers != nil {
		rc.Workers = cfg.Workers
		rc.Queues = map[string]river.QueueConfig{Name: {MaxWorkers: cfg.MaxWorkers}}
		rc.SoftStopTimeout = cfg.SoftStopTimeout
	}
	client, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return nil, fmt.Errorf("queue: river client: %w", err)
	}
	return client, nil
}

// InsertFetches inserts one fetch job per source in tx and returns the job IDs
// in the order of srcs.
func InsertFetches(ctx context.Context, client *Client, tx pgx.Tx, srcs []FetchArgs) ([]int64, error) {
	if len(srcs) == 0 {
		return nil, nil
	}
	params := make([]river.InsertManyParams, len(srcs))
	for i, s := range srcs {
		params[i] = river.InsertManyParams{Args: s}
	}
	res, err := client.InsertManyTx(ctx, tx, params)
	if err != nil {
		return nil, fmt.Errorf("queue: insert jobs: %w", err)
	}
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	return ids, nil
}

// Pending counts fetch jobs that are available or running now, plus those
// scheduled (retries, snoozes) to become available within soon.
func Pending(ctx context.Context, pool *pgxpool.Pool, soon time.Duration) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, pendingSQL, Name, soon.Seconds()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("queue: count pending: %w", err)
	}
	return n, nil
}

// DB is what the functions on fetch jobs need: a pool, a connection or a
// transaction (then their change takes effect at its commit).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// JobCount is how many unfinished River jobs of one kind are in one state.
type JobCount struct {
	Kind  string `json:"kind"`
	State string `json:"state"` // available, running, scheduled (snoozed or retried later), retryable, pending
	Jobs  int64  `json:"jobs"`
}

// CountJobs counts the unfinished River jobs (every queue's) by kind and
// state: an index range of the unfinished states, so it costs the jobs
// waiting or running, not the finished ones River keeps.
func CountJobs(ctx context.Context, db Querier) ([]JobCount, error) {
	rows, err := db.Query(ctx, countJobsSQL)
	if err != nil {
		return nil, fmt.Errorf("queue: count jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (JobCount, error) {
		var c JobCount
		err := row.Scan(&c.Kind, &c.State, &c.Jobs)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("queue: count jobs: %w", err)
	}
	return out, nil
}

// Querier is what CountJobs needs: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// WakeFetches makes the fetch jobs of platform that are snoozed (River's
// scheduled state: a pause, a hold, a cooldown, a long pacer wait) available
// now, and wakes the clients of the fleet to fetch them, so they run at once
// instead of at their snooze's end: after a platform is resumed or its
// cooldown cleared. It returns how many it woke. A snooze uses up no
// attempt, nor does waking. Jobs not yet due for another reason (a retry
// after an error, state retryable) keep their backoff.
func WakeFetches(ctx context.Context, db DB, platform string) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, wakeFetchesSQL, Name, FetchArgs{}.Kind(), platform).Scan(&n, new(bool)); err != nil {
		return 0, fmt.Errorf("queue: wake fetches of %s: %w", platform, err)
	}
	return n, nil
}

// WakeJobs is WakeFetches for the fetch jobs with the given ids: those
// snoozed are made available now (their pacer still decides when they
// fetch). It returns how many it woke.
func WakeJobs(ctx context.Context, db DB, ids []int64) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, wakeJobsSQL, Name, FetchArgs{}.Kind(), ids).Scan(&n, new(bool)); err != nil {
		return 0, fmt.Errorf("queue: wake fetch jobs: %w", err)
	}
	return n, nil
}

// CancelFetches deletes the fetch jobs of platform that are not running
// (available, scheduled, retryable, pending): when the platform is deleted.
// A running job finishes (and is cancelled by its pacer reservation when the
// platform is gone). It returns how many it deleted.
func CancelFetches(ctx context.Context, db DB, platform string) (int64, error) {
	tag, err := db.Exec(ctx, cancelFetchesSQL, Name, FetchArgs{}.Kind(), platform)
	if err != nil {
		return 0, fmt.Errorf("queue: cancel fetches of %s: %w", platform, err)
	}
	return tag.RowsAffected(), nil
}

// DrainConfig configures Drain. The zero value means defaults.
type DrainConfig struct {
	// MaxDuration bounds the drain: when it has passed, the drain stops
	// with jobs left (DrainResult.TimedOut). Default 0: no bound.
	MaxDuration time.Duration
	// Clock times the drain's bound and its idle checks (every 250 ms).
	// Default (nil): the real clock.
	Clock clock.Clock
}

// Validate reports an invalid field, wrapping ErrInvalidConfig.
func (c DrainConfig) Validate() error {
	if c.MaxDuration < 0 {
		return fmt.Errorf("%w: queue.DrainConfig.MaxDuration must be ≥ 0 (0: no bound), got %s", ErrInvalidConfig, c.MaxDuration)
	}
	return nil
}

// DrainResult reports a drain.
type DrainResult struct {
	Completed int   // jobs that finished (completed, snoozed, failed) during the drain
	TimedOut  bool  // MaxDuration passed with jobs left
	Left      int64 // jobs pending when it timed out
}

// drainCheckEvery is how often Drain counts the pending jobs.
const drainCheckEvery = 250 * time.Millisecond

// Drain starts client (which must have workers), works until no fetch job is
// available, running or due within a second, or until cfg.MaxDuration has
// passed, then stops it. It returns the errors of counting the jobs and of
// stopping the client (bounded by 30 s), joined; running out of
// MaxDuration is not an error (DrainResult.TimedOut).
func Drain(ctx context.Context, client *Client, pool *pgxpool.Pool, cfg DrainConfig) (*DrainResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	clk := clock.Or(cfg.Clock)
	events, cancelSub := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobSnoozed, river.EventKindJobCancelled)
	defer cancelSub()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := client.Start(runCtx); err != nil {
		return nil, fmt.Errorf("queue: drain: start: %w", err)
	}
	stop := func() error {
		stopCtx, c := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer c()
		if err := client.Stop(stopCtx); err != nil {
			return fmt.Errorf("queue: drain: stop: %w", err)
		}
		return nil
	}

	var deadline <-chan time.Time
	if cfg.MaxDuration > 0 {
		t := clk.NewTimer(cfg.MaxDuration)
		defer t.Stop()
		deadline = t.Chan()
	}
	res := &DrainResult{}
	tick := clk.NewTicker(drainCheckEvery)
	defer tick.Stop()
	idleChecks := 0
	for {
		select {
		case <-ctx.Done():
			return res, errors.Join(ctx.Err(), stop())
		case <-deadline:
			stopErr := stop()
			left, err := Pending(context.WithoutCancel(ctx), pool, time.Second)
			res.TimedOut, res.Left = true, left
			return res, errors.Join(stopErr, err)
		case <-events:
			res.Completed++
		case <-tick.Chan():
			n, err := Pending(ctx, pool, time.Second)
			if err != nil {
				return res, errors.Join(err, stop())
			}
			if n > 0 {
				idleChecks = 0
				continue
			}
			// Two idle checks in a row: a job completing between the count
			// and the next insert cannot end the drain early.
			if idleChecks++; idleChecks >= 2 {
				return res, stop()
			}
		}
	}
}
