// Package queue builds fleetpace's River client and defines its one job kind:
// fetch a source. It also drains the queue for `fleetpace drain`.
//
// River is the durability boundary of fleetpace: a fetch that is not done is
// a job in river_job, retried or rescued by River, never lost.
package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// Name is the River queue fleetpace's fetch jobs go to.
const Name = "fleetpace_fetch"

// FetchArgs are the arguments of a fetch job: check one source. The scan
// tick fills in the URL and the validators of the previous fetch, read in
// the transaction that queues the job (a queued source is not queued again,
// so nothing else changes them meanwhile); the job then needs no read before
// it fetches. A job with an empty URL loads the source first.
type FetchArgs struct {
	SourceID     int64  `json:"source_id"`
	Platform     string `json:"platform"`
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

// Config configures a River client for fleetpace. The zero value is an
// insert-only client.
type Config struct {
	// Workers registers the job workers. Default: nil, an insert-only client
	// that works no jobs.
	Workers *river.Workers

	// MaxWorkers is how many fetch jobs run at once in this process.
	// Default: 10 (only used with Workers).
	MaxWorkers int

	// JobTimeout bounds one fetch job. Default: 2 minutes.
	JobTimeout time.Duration

	// RescueAfter is how long a running job may go without finishing before
	// River treats its worker as dead and makes it available again.
	// Default: 5 minutes (must exceed JobTimeout).
	RescueAfter time.Duration

	// SoftStopTimeout is how long running jobs may finish after a stop was
	// asked for before they are cancelled. Default: 10 s.
	SoftStopTimeout time.Duration

	// FetchPollInterval is how often an idle client looks for new jobs when no
	// notification arrives. Default: River's (1 s).
	FetchPollInterval time.Duration

	// ID names this client among the fleet. Default: River's.
	ID string

	// Logger receives River's logs. Default: discard.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.MaxWorkers == 0 {
		c.MaxWorkers = 10
	}
	if c.JobTimeout == 0 {
		c.JobTimeout = 2 * time.Minute
	}
	if c.RescueAfter == 0 {
		c.RescueAfter = 5 * time.Minute
	}
	if c.SoftStopTimeout == 0 {
		c.SoftStopTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate() error {
	switch {
	case c.MaxWorkers < 1:
		return fmt.Errorf("queue: MaxWorkers must be ≥ 1, got %d", c.MaxWorkers)
	case c.JobTimeout < 0:
		return fmt.Errorf("queue: JobTimeout must be ≥ 0, got %s", c.JobTimeout)
	case c.RescueAfter <= c.JobTimeout:
		return fmt.Errorf("queue: RescueAfter (%s) must exceed JobTimeout (%s)", c.RescueAfter, c.JobTimeout)
	case c.SoftStopTimeout < 0:
		return fmt.Errorf("queue: SoftStopTimeout must be ≥ 0, got %s", c.SoftStopTimeout)
	}
	return nil
}

// Client is the River client type fleetpace uses.
type Client = river.Client[pgx.Tx]

// NewClient builds a River client over pool.
func NewClient(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rc := &river.Config{
		ID:                   cfg.ID,
		Logger:               cfg.Logger,
		JobTimeout:           cfg.JobTimeout,
		RescueStuckJobsAfter: cfg.RescueAfter,
		FetchPollInterval:    cfg.FetchPollInterval,
		SkipUnknownJobCheck:  true,
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
func Pending(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, soon time.Duration) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, pendingSQL, Name, soon.Seconds()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("queue: count pending: %w", err)
	}
	return n, nil
}

// UnfinishedJobsSQL is a relation, for a FROM clause, of the ids of River jobs
// that have not finished (neither completed, discarded nor cancelled): for
// statements of other packages that must see River's job states in the same
// statement (the scan's reconciliation). River's tables are read by this
// package's SQL only.
const UnfinishedJobsSQL = `(SELECT id FROM river_job WHERE state NOT IN ('completed', 'discarded', 'cancelled'))`

const pendingSQL = `
SELECT count(*) FROM river_job
WHERE queue = $1
  AND (state IN ('available', 'running', 'pending')
       OR (state IN ('scheduled', 'retryable')
           AND scheduled_at <= now() + make_interval(secs => $2)))`

// ErrDrainTimeout is returned by Drain when MaxDuration passes first.
var ErrDrainTimeout = errors.New("queue: drain: max duration reached with jobs left")

// DrainResult reports a drain.
type DrainResult struct {
	Completed int // jobs that finished (completed, snoozed, failed) during the drain
	Left      int64
}

// Drain starts client (which must have workers), works until no fetch job is
// available, running or due within a second, then stops it. maxDuration 0
// means no limit.
func Drain(ctx context.Context, client *Client, pool *pgxpool.Pool, maxDuration time.Duration) (*DrainResult, error) {
	events, cancelSub := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobSnoozed, river.EventKindJobCancelled)
	defer cancelSub()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := client.Start(runCtx); err != nil {
		return nil, fmt.Errorf("queue: drain: start: %w", err)
	}
	stop := func() {
		stopCtx, c := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer c()
		_ = client.Stop(stopCtx)
	}

	var deadline <-chan time.Time
	if maxDuration > 0 {
		t := time.NewTimer(maxDuration)
		defer t.Stop()
		deadline = t.C
	}
	res := &DrainResult{}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	idleChecks := 0
	for {
		select {
		case <-ctx.Done():
			stop()
			return res, ctx.Err()
		case <-deadline:
			stop()
			res.Left, _ = Pending(context.WithoutCancel(ctx), pool, time.Second)
			return res, ErrDrainTimeout
		case <-events:
			res.Completed++
		case <-tick.C:
			n, err := Pending(ctx, pool, time.Second)
			if err != nil {
				stop()
				return res, err
			}
			if n > 0 {
				idleChecks = 0
				continue
			}
			// Two idle checks in a row: a job completing between the count
			// and the next insert cannot end the drain early.
			if idleChecks++; idleChecks >= 2 {
				stop()
				return res, nil
			}
		}
	}
}
