package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/recorder"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

// WorkerConfig configures the worker benchmark. The zero value means
// defaults.
type WorkerConfig struct {
	// DatabaseURL is the database to measure on. It gets the schema applied;
	// the benchmark works on its own queue and platform and deletes what it
	// created, but a scratch database is best. Default: a temporary embedded
	// cluster, removed afterwards.
	DatabaseURL string
	// Workers is River's MaxWorkers for both clients. Default 10 (the
	// worker's --concurrency default).
	Workers int
	// Jobs is how many jobs one run works. Default 20,000: a run of several
	// seconds (River completes jobs in batches every 50 ms, and a run of
	// 5,000 jobs, about a second, read ±5 % from that alone).
	Jobs int
	// Runs is how many times each side is measured (alternating). Default 3.
	Runs int
	// FetchCooldown is River's FetchCooldown for both clients: the shortest
	// time between two fetches of jobs. Default 1 ms (River's minimum).
	// River's own default (100 ms) caps both sides at Workers / 100 ms jobs/s,
	// which measures the throttle, not the cost of a job.
	FetchCooldown time.Duration
	// NoHistory records the checks without their history rows (the fetch
	// history off, as with a worker's --history-retention 0), to measure
	// what the history costs. Default: with history, as a worker records.
	NoHistory bool
	// RecorderSyncCommit records the checks with the server's
	// synchronous_commit (a worker's --recorder-sync-commit), to measure
	// what waiting for the disk costs. Default: off, as a worker.
	RecorderSyncCommit bool
	// Timeout bounds one run. Default 5 minutes.
	Timeout time.Duration
	// Progress receives one line per run. Default: none.
	Progress io.Writer
	// Logger receives River's and the pacer's logs. Default: discard.
	Logger *slog.Logger
}

// Defaults of WorkerConfig.
const (
	DefaultWorkerWorkers       = 10
	DefaultWorkerJobs          = 20000
	DefaultWorkerRuns          = 3
	DefaultWorkerFetchCooldown = river.FetchCooldownMin
)

func (c *WorkerConfig) setDefaults() {
	c.Workers = cmp.Or(c.Workers, DefaultWorkerWorkers)
	c.Jobs = cmp.Or(c.Jobs, DefaultWorkerJobs)
	c.Runs = cmp.Or(c.Runs, DefaultWorkerRuns)
	c.FetchCooldown = cmp.Or(c.FetchCooldown, DefaultWorkerFetchCooldown)
	c.Timeout = cmp.Or(c.Timeout, 5*time.Minute)
	c.Progress = cmp.Or(c.Progress, io.Discard)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig.
func (c WorkerConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Workers < 1:
		return fmt.Errorf("%w: bench.WorkerConfig.Workers must be ≥ 1, got %d", ErrInvalidConfig, c.Workers)
	case c.Jobs < 1:
		return fmt.Errorf("%w: bench.WorkerConfig.Jobs must be ≥ 1, got %d", ErrInvalidConfig, c.Jobs)
	case c.Runs < 1:
		return fmt.Errorf("%w: bench.WorkerConfig.Runs must be ≥ 1, got %d", ErrInvalidConfig, c.Runs)
	case c.FetchCooldown < river.FetchCooldownMin:
		return fmt.Errorf("%w: bench.WorkerConfig.FetchCooldown must be ≥ %s, got %s", ErrInvalidConfig, river.FetchCooldownMin, c.FetchCooldown)
	case c.Timeout < 0:
		return fmt.Errorf("%w: bench.WorkerConfig.Timeout must be ≥ 0, got %s", ErrInvalidConfig, c.Timeout)
	}
	return nil
}

// WorkerResult is the outcome of the worker benchmark: medians over Runs.
type WorkerResult struct {
	FleetpaceJobsPerSec float64 `json:"fleetpace_jobs_per_sec"`
	RiverJobsPerSec     float64 `json:"river_jobs_per_sec"`
	// Ratio is FleetpaceJobsPerSec / RiverJobsPerSec. Target ≥ WorkerTarget.
	Ratio         float64   `json:"ratio"`
	Workers       int       `json:"workers"`
	Jobs          int       `json:"jobs"`
	Runs          int       `json:"runs"`
	FetchCooldown string    `json:"fetch_cooldown"`
	FleetpaceRuns []float64 `json:"fleetpace_runs_jobs_per_sec"`
	RiverRuns     []float64 `json:"river_runs_jobs_per_sec"`
	// Detail is every run, in the order they ran (the sides alternate).
	Detail   []WorkerRun `json:"runs_detail"`
	Database string      `json:"database"`
	// Load is the machine's load average (1, 5, 15 min) at the end.
	Load string `json:"load_average"`
	// Reservations is how many slots the fetch jobs asked for, and
	// ReservationStatements how many of those took a statement (the rest
	// came from blocks).
	Reservations          uint64 `json:"reservations"`
	ReservationStatements uint64 `json:"reservation_statements"`

	// History says whether the checks were recorded with their history
	// rows; HistoryBytesPerMillion is then the history table's size, its
	// indexes included, per million checks: measured only when the table
	// was fresh (empty, never written) at the start, as it is in the
	// throwaway embedded cluster; 0 otherwise.
	History                bool    `json:"history"`
	RecorderAsyncCommit    bool    `json:"recorder_async_commit"`
	HistoryRows            int64   `json:"history_rows"`
	HistoryBytesPerMillion float64 `json:"history_bytes_per_million_checks"`
}

// WorkerRun is one run of one side.
type WorkerRun struct {
	Side       string  `json:"side"` // "fleetpace" or "river"
	Run        int     `json:"run"`
	JobsPerSec float64 `json:"jobs_per_sec"`
	// Snoozes counts jobs that snoozed (a pacer slot too far away) and
	// came back to complete: the run waits for every job to complete.
	Snoozes int `json:"snoozes"`
	// Load is the machine's load average (1, 5, 15 min) when it ended.
	Load string `json:"load_average"`
}

// loadAverage reads the machine's load average ("1.02 0.87 0.64"), or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// WorkerTarget is the ratio the worker benchmark should reach, with the
// fetch history on, on the embedded default and on a durable database.
const WorkerTarget = 0.9

// benchQueue keeps the benchmark's jobs away from a live fleet's queue.
const benchQueue = "fleetpace_bench"

// noopArgs is the bare River job.
type noopArgs struct{}

func (noopArgs) Kind() string { return "fleetpace_bench_noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// Worker measures jobs/s of fleetpace's fetch job as the scan tick queues it
// (the URL in the job; pacer reserve, report, and the check recorded) with a
// no-op fetcher and an effectively unlimited platform, against bare River jobs
// whose worker does nothing, with the same River settings and worker count.
// Each run inserts Jobs jobs, starts a client, and times until every job has
// completed; runs alternate sides and the medians are reported.
func Worker(ctx context.Context, cfg WorkerConfig) (*WorkerResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	url := cfg.DatabaseURL
	desc := "embedded (temporary)"
	if url == "" {
		c, err := pgembed.Start(ctx, pgembed.Config{Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer c.Close(context.WithoutCancel(ctx)) //nolint:errcheck // best effort
		url = c.URL("postgres")
	} else {
		desc = redact.DescribeDatabase(url)
	}

	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: url, MaxConns: int32(cfg.Workers + 5)})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer pool.Close()
	if _, err := fleetpace.Apply(ctx, pool, nil); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	pc, err := pacer.New(ctx, pacer.Config{DatabaseURL: url, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer pc.Close() // (also closed before the cleanup below: its last reports land first)

	var freshRows, freshSize int64
	if err := pool.QueryRow(ctx, workerHistorySizeSQL, "").Scan(&freshRows, &freshSize); err != nil {
		return nil, fmt.Errorf("bench: history size: %w", err)
	}
	fresh := freshRows == 0 && freshSize <= freshHistorySize
	platform, srcs, err := workerSetup(ctx, pool, cfg.Jobs)
	if err != nil {
		return nil, err
	}
	defer func() {
		pc.Close()
		workerCleanup(context.WithoutCancel(ctx), pool, platform)
	}()

	// Group commit of the checks, as `fleetpace worker` records them: a
	// small pool of its own.
	recPoolCfg, err := dbconn.PoolConfig(dbconn.Config{URL: url, MaxConns: 2})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	recorder.ConfigurePool(recPoolCfg, !cfg.RecorderSyncCommit)
	recPool, err := pgxpool.NewWithConfig(ctx, recPoolCfg)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer recPool.Close()
	host, _ := os.Hostname()
	rec, err := recorder.New(recPool, recorder.Config{Logger: cfg.Logger, NoHistory: cfg.NoHistory,
		Worker: fmt.Sprintf("%s-%d-bench", host, os.Getpid())})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if err := rec.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer rec.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // every run waits for its checks (Flush)

	fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: pc, Recorder: rec, Logger: cfg.Logger,
		Fetcher: fetch.FetcherFunc(func(context.Context, fetch.Request) fetch.Result {
			// What a feed's fetch reports: its size and time go to the history.
			return fetch.Result{Outcome: fetch.OK, Status: 200, Bytes: 48_213, Duration: 183 * time.Millisecond}
		})})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	fpWorkers := river.NewWorkers()
	river.AddWorker(fpWorkers, fw)
	rvWorkers := river.NewWorkers()
	river.AddWorker(rvWorkers, noopWorker{})

	fpArgs := make([]river.InsertManyParams, len(srcs))
	for i, src := range srcs {
		fpArgs[i] = river.InsertManyParams{Args: queue.FetchArgs{SourceID: src.id, Platform: platform, URL: src.url},
			InsertOpts: &river.InsertOpts{Queue: benchQueue}}
	}
	rvArgs := make([]river.InsertManyParams, cfg.Jobs)
	for i := range rvArgs {
		rvArgs[i] = river.InsertManyParams{Args: noopArgs{}, InsertOpts: &river.InsertOpts{Queue: benchQueue}}
	}

	res := &WorkerResult{Workers: cfg.Workers, Jobs: cfg.Jobs, Runs: cfg.Runs,
		FetchCooldown: cfg.FetchCooldown.String(), Database: desc, History: !cfg.NoHistory,
		RecorderAsyncCommit: !cfg.RecorderSyncCommit}
	for i := range cfg.Runs {
		// Alternate which side goes first, so neither always meets a
		// freshly vacuumed (or a bloated) river_job table.
		order := []bool{true, false}
		if i%2 == 1 {
			order = []bool{false, true}
		}
		for _, fp := range order {
			workers, args, name := rvWorkers, rvArgs, "river"
			var flush func(context.Context) error
			if fp {
				workers, args, name = fpWorkers, fpArgs, "fleetpace"
				// The checks are written behind the jobs: the clock stops
				// once the last one has landed, and every one must have.
				flush = func(ctx context.Context) error {
					if err := rec.Flush(ctx); err != nil {
						return err
					}
					var left int
					if err := pool.QueryRow(ctx, workerQueuedSQL, platform).Scan(&left); err != nil {
						return err
					}
					if left > 0 {
						return fmt.Errorf("%d checks not recorded", left)
					}
					return nil
				}
				if _, err := pool.Exec(ctx, workerRequeueSQL, platform); err != nil {
					return nil, fmt.Errorf("bench: %w", err)
				}
			}
			run, err := workerRun(ctx, pool, cfg, workers, args, flush)
			if err != nil {
				return nil, fmt.Errorf("bench: %s run %d: %w", name, i+1, err)
			}
			run.Side, run.Run = name, i+1
			res.Detail = append(res.Detail, run)
			if fp {
				res.FleetpaceRuns = append(res.FleetpaceRuns, run.JobsPerSec)
			} else {
				res.RiverRuns = append(res.RiverRuns, run.JobsPerSec)
			}
			fmt.Fprintf(cfg.Progress, "run %d/%d %-9s %8.0f jobs/s  (%d snoozed and came back; load %s)\n",
				i+1, cfg.Runs, name, run.JobsPerSec, run.Snoozes, run.Load)
		}
	}
	if !cfg.NoHistory {
		var size int64
		if err := pool.QueryRow(ctx, workerHistorySizeSQL, platform).Scan(&res.HistoryRows, &size); err != nil {
			return nil, fmt.Errorf("bench: history size: %w", err)
		}
		if res.HistoryRows > 0 && fresh {
			res.HistoryBytesPerMillion = float64(size) / float64(res.HistoryRows) * 1e6
		}
	}
	res.Load = loadAverage()
	st := pc.Stats()
	res.Reservations, res.ReservationStatements = st.Reservations, st.Reservations-st.FromBlock-st.Degraded+st.Refills
	res.FleetpaceJobsPerSec = workerMedian(res.FleetpaceRuns)
	res.RiverJobsPerSec = workerMedian(res.RiverRuns)
	if res.RiverJobsPerSec > 0 {
		res.Ratio = res.FleetpaceJobsPerSec / res.RiverJobsPerSec
	}
	return res, nil
}

// workerRun inserts the jobs, starts a client, and measures jobs/s from the
// client's start until the last job completed and flush (if not nil)
// returned. A job that snoozes comes back and is waited for; one that fails
// or is cancelled ends the run with an error.
func workerRun(ctx context.Context, pool *pgxpool.Pool, cfg WorkerConfig, workers *river.Workers, args []river.InsertManyParams,
	flush func(context.Context) error) (WorkerRun, error) {
	var run WorkerRun
	if _, err := pool.Exec(ctx, workerClearJobsSQL, benchQueue); err != nil {
		return run, err
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Logger:              cfg.Logger,
		Workers:             workers,
		Queues:              map[string]river.QueueConfig{benchQueue: {MaxWorkers: cfg.Workers}},
		FetchCooldown:       cfg.FetchCooldown,
		FetchPollInterval:   max(cfg.FetchCooldown, 50*time.Millisecond),
		SkipUnknownJobCheck: true,
	})
	if err != nil {
		return run, err
	}
	// Insert in batches: one statement per job would time the insert.
	for lo := 0; lo < len(args); lo += 1000 {
		if _, err := client.InsertMany(ctx, args[lo:min(lo+1000, len(args))]); err != nil {
			return run, err
		}
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: 2*len(args) + 16,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobSnoozed, river.EventKindJobCancelled},
	})
	defer cancel()

	runCtx, stop := context.WithTimeout(ctx, cfg.Timeout)
	defer stop()
	start := time.Now()
	if err := client.Start(runCtx); err != nil {
		return run, err
	}
	defer func() {
		sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer c()
		_ = client.Stop(sctx)
	}()
	done := 0
	for done < len(args) {
		select {
		case <-runCtx.Done():
			return run, fmt.Errorf("%d of %d jobs completed (%d snoozes) before: %w", done, len(args), run.Snoozes, runCtx.Err())
		case ev := <-events:
			switch ev.Kind {
			case river.EventKindJobCompleted:
				done++
			case river.EventKindJobSnoozed:
				run.Snoozes++ // it comes back
			default:
				msg := string(ev.Kind)
				if ev.Job != nil && len(ev.Job.Errors) > 0 {
					msg += ": " + ev.Job.Errors[len(ev.Job.Errors)-1].Error
				}
				return run, errors.New("a job did not complete: " + msg)
			}
		}
	}
	if flush != nil {
		if err := flush(runCtx); err != nil {
			return run, err
		}
	}
	run.JobsPerSec = float64(done) / time.Since(start).Seconds()
	run.Load = loadAverage()
	return run, nil
}

// workerSetup creates a platform no fleet waits on (1e9/s, burst 1e6) and
// one source per job. The sources are queued and due in the far future, so
// a live scanner on the same database leaves them alone.
func workerSetup(ctx context.Context, pool *pgxpool.Pool, n int) (string, []benchSource, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "bench-" + hex.EncodeToString(b[:])
	if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: name, RatePerSec: 1e9, Burst: 1_000_000}); err != nil {
		return "", nil, fmt.Errorf("bench: %w", err)
	}
	rows, err := pool.Query(ctx, workerSourcesSQL, name, n)
	if err != nil {
		return "", nil, fmt.Errorf("bench: sources: %w", err)
	}
	srcs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (benchSource, error) {
		var s benchSource
		return s, row.Scan(&s.id, &s.url)
	})
	if err != nil {
		return "", nil, fmt.Errorf("bench: sources: %w", err)
	}
	return name, srcs, nil
}

type benchSource struct {
	id  int64
	url string
}

func workerCleanup(ctx context.Context, pool *pgxpool.Pool, platform string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, _ = pool.Exec(ctx, workerClearJobsSQL, benchQueue)
	_, _ = pool.Exec(ctx, workerCleanupSQL, platform)
	// After it: the source table's statement triggers log the checks and
	// the deletion for the next scan tick, which a database the benchmark
	// borrows may never run (73,706 rows once, after many invocations).
	_, _ = pool.Exec(ctx, workerDueLogSQL, platform)
}

const (
	workerSourcesSQL = `
INSERT INTO fleetpace_source (platform, url, check_interval, due_at, queued_at)
SELECT $1, 'https://bench.invalid/' || g, interval '365 days', now() + interval '365 days', now()
FROM generate_series(1, $2) g
RETURNING id, url`
	workerClearJobsSQL = `DELETE FROM river_job WHERE queue = $1`
	workerDueLogSQL    = `DELETE FROM fleetpace_due_change WHERE platform = $1`
	workerRequeueSQL   = `UPDATE fleetpace_source SET queued_at = now() WHERE platform = $1`
	workerQueuedSQL    = `SELECT count(*) FROM fleetpace_source WHERE platform = $1 AND queued_at IS NOT NULL`
	// workerHistorySizeSQL counts the benchmark's history rows and sizes the
	// history table with its indexes (VACUUM is not run: the size is what
	// the rows take as written). Meaningful on a database where the
	// benchmark's rows are (nearly) all of the table.
	workerHistorySizeSQL = `
SELECT (SELECT count(*) FROM fleetpace_check WHERE $1 = '' OR platform = $1),
       pg_total_relation_size('fleetpace_check')`
	// freshHistorySize is the size of a history table never written: no
	// heap page, one metapage per index (its two, its TOAST table's one).
	freshHistorySize = 3 * 8192
	workerCleanupSQL = `
WITH s AS (DELETE FROM fleetpace_source WHERE platform = $1),
     h AS (DELETE FROM fleetpace_check WHERE platform = $1),
     c AS (DELETE FROM fleetpace_cooldown WHERE platform = $1),
     p AS (DELETE FROM fleetpace_pace WHERE platform = $1)
DELETE FROM fleetpace_platform WHERE name = $1`
)

func workerMedian(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// WriteText writes the result for humans.
func (r *WorkerResult) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	commit := "the server's synchronous_commit"
	if r.RecorderAsyncCommit {
		commit = "synchronous_commit off"
	}
	fmt.Fprintf(tw, "worker benchmark: %d jobs × %d runs, %d workers, River FetchCooldown %s, database %s, checks recorded with %s\n",
		r.Jobs, r.Runs, r.Workers, r.FetchCooldown, r.Database, commit)
	fmt.Fprintf(tw, "\tmedian jobs/s\truns\n")
	fmt.Fprintf(tw, "fleetpace fetch job (no-op fetcher)\t%.0f\t%s\n", r.FleetpaceJobsPerSec, joinFloats(r.FleetpaceRuns, 0))
	fmt.Fprintf(tw, "bare River job (no-op worker)\t%.0f\t%s\n", r.RiverJobsPerSec, joinFloats(r.RiverRuns, 0))
	verdict := "meets"
	if r.Ratio < WorkerTarget {
		verdict = "below"
	}
	fmt.Fprintf(tw, "ratio\t%.2f\t(%s the %.1f target)\n", r.Ratio, verdict, WorkerTarget)
	fmt.Fprintf(tw, "load average\t%s\t(1, 5, 15 min, at the end; each run's in the progress lines and the JSON)\n", r.Load)
	fmt.Fprintf(tw, "pacer\t%d reservations, %d statements\t(the rest from blocks)\n", r.Reservations, r.ReservationStatements)
	switch {
	case r.History && r.HistoryBytesPerMillion > 0:
		fmt.Fprintf(tw, "fetch history\t%d rows, %.0f MB per million checks (table and indexes)\n", r.HistoryRows, r.HistoryBytesPerMillion/1e6)
	case r.History:
		fmt.Fprintf(tw, "fetch history\t%d rows (its size per million checks is measured on a fresh database only)\n", r.HistoryRows)
	default:
		fmt.Fprintf(tw, "fetch history\toff\n")
	}
	return tw.Flush()
}

// WriteJSON writes the result as one JSON object.
func (r *WorkerResult) WriteJSON(w io.Writer) error { return writeJSON(w, r) }
