// Package worker is the fleetpace runtime: a River client working fetch jobs
// through the shared pacer, a jittered scan loop that queues due sources, a
// heartbeat that tells the pacer the fleet size, and an HTTP server with
// health, readiness, metrics, status and River UI.
//
// Every connection follows one rule: one attempt, fail fast. When the
// database is unreachable the scan loop backs off on its jittered schedule,
// the pacer paces locally, /readyz answers 503, and work resumes by itself
// when the database is back: the queue is the durability boundary.
package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"golang.org/x/sync/errgroup"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
)

// DefaultHTTPAddr is where the CLI's worker serves its HTTP endpoints.
const DefaultHTTPAddr = "127.0.0.1:9464"

// Config configures a worker. The zero value of every field but DatabaseURL
// means its default.
type Config struct {
	// DatabaseURL is the PostgreSQL URL. Required.
	DatabaseURL string
	// ConnectTimeout bounds one connection attempt. Default 2 s.
	ConnectTimeout time.Duration

	// Concurrency is how many fetch jobs run at once in this process.
	// Default 10.
	Concurrency int
	// JobTimeout bounds one fetch job. Default 2 minutes.
	JobTimeout time.Duration
	// RescueAfter: a job running this long is considered abandoned by a dead
	// worker and run again. Default 5 minutes.
	RescueAfter time.Duration
	// SoftStop is how long running fetches may finish after SIGTERM before
	// they are cancelled (and run again later). Default 10 s.
	SoftStop time.Duration
	// MaxWait is the longest pacer wait a job sleeps through; longer waits
	// snooze the job. Default 5 s.
	MaxWait time.Duration

	// Poll configures the scan loop (base 1 s, max 30 s, jitter 0.5 by
	// default). Its StartupJitter also delays the River client's start.
	Poll poller.Config
	// Tick configures each scan tick.
	Tick scan.Config
	// DisableScan turns the scan loop off (for fleets scanned by cron).
	DisableScan bool

	// Heartbeat is how often this process refreshes its worker row and reads
	// the fleet size. Default 5 s.
	Heartbeat time.Duration
	// MinFleetSize is the smallest fleet size degraded pacing assumes.
	// Default 1.
	MinFleetSize int

	// Fetcher fetches sources. Default: fetch.NewHTTP(HTTP).
	Fetcher fetch.Fetcher
	// HTTP configures the built-in fetcher when Fetcher is nil.
	HTTP fetch.HTTPConfig

	// HTTPAddr is the address of the health/metrics/status server.
	// Default "" (no server); the CLI's default is DefaultHTTPAddr.
	HTTPAddr string

	// ID names this worker in heartbeats and River. Default hostname-pid-random.
	ID string
	// Logger. Default: discard.
	Logger *slog.Logger
	// Ready, if set, is called once the River client and the loops run.
	Ready func(addr net.Addr)
}

func (c *Config) setDefaults() {
	if c.Concurrency == 0 {
		c.Concurrency = 10
	}
	if c.SoftStop == 0 {
		c.SoftStop = 10 * time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 5 * time.Second
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(0x10000))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c *Config) validate() error {
	switch {
	case c.DatabaseURL == "":
		return errors.New("worker: Config.DatabaseURL is required")
	case c.Concurrency < 1:
		return fmt.Errorf("worker: Config.Concurrency must be ≥ 1, got %d", c.Concurrency)
	case c.SoftStop < 0:
		return fmt.Errorf("worker: Config.SoftStop must be ≥ 0, got %s", c.SoftStop)
	case c.Heartbeat < 0:
		return fmt.Errorf("worker: Config.Heartbeat must be ≥ 0, got %s", c.Heartbeat)
	}
	return c.Poll.Validate()
}

// Run runs a worker until ctx ends, then shuts down gracefully: no new jobs,
// running fetches get SoftStop to finish, then are cancelled and snoozed so
// they run again. It returns nil after a clean shutdown.
func Run(ctx context.Context, cfg Config) error {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	log := cfg.Logger
	rt, err := build(ctx, cfg)
	if err != nil {
		return err
	}
	defer rt.close()
	pool, pc, client, metrics := rt.pool, rt.pacer, rt.client, rt.metrics

	// The HTTP server runs from the start, so health checks answer during the
	// startup jitter too.
	var srv *server
	if cfg.HTTPAddr != "" {
		srv, err = startServer(ctx, cfg.HTTPAddr, pool, client, metrics, log)
		if err != nil {
			return err
		}
		defer srv.close()
	}

	// Startup jitter: a fleet restarted at once (a rollout, a database
	// restart) spreads its first fetches and scans over the window.
	poll := cfg.Poll
	window := poll.StartupJitter
	if window == 0 {
		window = cmp.Or(poll.Max, poller.DefaultMax)
	}
	if d := poller.StartupDelay(max(window, 0), rand.Float64()); d > 0 {
		log.Info("startup jitter", "sleep", d.Round(time.Millisecond))
		if err := poller.Sleep(ctx, d); err != nil {
			return nil // stopped before starting: nothing to shut down
		}
	}
	poll.StartupJitter = poller.NoStartupJitter

	// The client lives until we stop it: cancelling Start's context would be
	// a hard stop, and we want a soft one first.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("worker: start river: %w", err)
	}
	log.Info("worker started", "id", cfg.ID, "concurrency", cfg.Concurrency)

	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	g, gctx := errgroup.WithContext(loopCtx)
	g.Go(func() error { return heartbeat(gctx, pool, pc, cfg.ID, cfg.Heartbeat, log) })
	if !cfg.DisableScan {
		g.Go(func() error {
			return poller.Run(gctx, poll, func(ctx context.Context) (bool, error) {
				res, err := scan.Tick(ctx, pool, client, cfg.Tick)
				switch {
				case err != nil:
					metrics.tick("failed", nil, nil)
					return false, err
				case res.Skipped:
					metrics.tick("skipped", nil, nil)
					return false, nil
				}
				metrics.tick("ran", res.ByPlatform, res.CoolingDown)
				if res.Enqueued > 0 {
					log.Debug("scan", "enqueued", res.Enqueued, "by_platform", res.ByPlatform)
				}
				return res.Enqueued > 0, nil
			})
		})
	}
	if cfg.Ready != nil {
		var addr net.Addr
		if srv != nil {
			addr = srv.addr
		}
		cfg.Ready(addr)
	}

	<-ctx.Done()
	log.Info("stopping: no new jobs; running fetches may finish", "soft_stop", cfg.SoftStop)
	stopLoops()
	_ = g.Wait()

	softCtx, cancelSoft := context.WithTimeout(context.Background(), cfg.SoftStop)
	err = client.Stop(softCtx)
	cancelSoft()
	if err != nil {
		log.Warn("soft stop timed out; cancelling running fetches (they will run again)")
		hardCtx, cancelHard := context.WithTimeout(context.Background(), 10*time.Second)
		_ = client.StopAndCancel(hardCtx)
		cancelHard()
	}
	// Only now that no job runs: the last jobs' checks are written.
	rt.recorder.Stop()
	byeCtx, cancelBye := context.WithTimeout(context.Background(), 2*time.Second)
	_, _ = pool.Exec(byeCtx, deleteWorkerSQL, cfg.ID)
	cancelBye()
	log.Info("worker stopped")
	return nil
}

// runtime is what Run and Drain share: pools, pacer, recorder, fetcher, River
// client.
type runtime struct {
	pool     *pgxpool.Pool
	pacer    *pacer.Pacer
	recorder *sources.Recorder
	client   *queue.Client
	metrics  *Metrics
	closers  []func()
}

func (rt *runtime) close() {
	for i := len(rt.closers) - 1; i >= 0; i-- {
		rt.closers[i]()
	}
}

func build(ctx context.Context, cfg Config) (rt *runtime, err error) {
	rt = &runtime{}
	defer func() {
		if err != nil {
			rt.close()
		}
	}()
	rt.pool, err = dbconn.NewPool(ctx, dbconn.Config{URL: cfg.DatabaseURL, ConnectTimeout: cfg.ConnectTimeout, MaxConns: int32(cfg.Concurrency + 5)})
	if err != nil {
		return nil, err
	}
	rt.closers = append(rt.closers, rt.pool.Close)

	// Fetch jobs record their checks with group commit. The recorder stops
	// only when told (Run stops it after the River client; on every other
	// way out, close does, before the pool closes), so jobs still running
	// during a soft stop can record.
	rt.recorder, err = sources.NewRecorder(rt.pool, sources.RecorderConfig{Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	if err := rt.recorder.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	rt.closers = append(rt.closers, rt.recorder.Stop)

	// The pacer has a small pool of its own (never River's, never inside a
	// caller's transaction), with the same fail-fast connection rule.
	pacerPoolCfg, err := dbconn.PoolConfig(dbconn.Config{URL: cfg.DatabaseURL, ConnectTimeout: cfg.ConnectTimeout})
	if err != nil {
		return nil, err
	}
	rt.pacer, err = pacer.New(ctx, pacer.Config{PoolConfig: pacerPoolCfg, ConnectTimeout: cfg.ConnectTimeout, MinFleetSize: cfg.MinFleetSize, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	rt.closers = append(rt.closers, rt.pacer.Close)

	fetcher := cfg.Fetcher
	if fetcher == nil {
		h, err := fetch.NewHTTP(cfg.HTTP)
		if err != nil {
			return nil, err
		}
		rt.closers = append(rt.closers, h.CloseIdleConnections)
		fetcher = h
	}
	rt.metrics = NewMetrics(rt.pool, rt.pacer, rt.recorder, cfg.Logger)
	fw, err := NewFetchWorker(JobConfig{Pool: rt.pool, Pacer: rt.pacer, Fetcher: fetcher, Recorder: rt.recorder, MaxWait: cfg.MaxWait, Metrics: rt.metrics, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, fw)
	rt.client, err = queue.NewClient(rt.pool, queue.Config{
		Workers: workers, MaxWorkers: cfg.Concurrency, JobTimeout: cfg.JobTimeout, RescueAfter: cfg.RescueAfter,
		SoftStopTimeout: cfg.SoftStop, ID: cfg.ID, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return rt, nil
}

// Drain works fetch jobs until none is available, running or due within a
// second, then returns; maxDuration 0 means no limit. It runs no scan loop.
func Drain(ctx context.Context, cfg Config, maxDuration time.Duration) (*queue.DrainResult, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	rt, err := build(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer rt.close()
	return queue.Drain(ctx, rt.client, rt.pool, maxDuration)
}

const (
	heartbeatSQL = `
WITH up AS (
    INSERT INTO fleetpace_worker (id, hostname, pid) VALUES ($1, $2, $3)
    ON CONFLICT (id) DO UPDATE SET seen_at = now()
)
SELECT count(*) + 1 FROM fleetpace_worker
WHERE seen_at > now() - make_interval(secs => $4) AND id <> $1`
	pruneWorkersSQL = `DELETE FROM fleetpace_worker WHERE seen_at < now() - interval '1 hour'`
	deleteWorkerSQL = `DELETE FROM fleetpace_worker WHERE id = $1`
)

// heartbeat refreshes this worker's row and tells the pacer the fleet size.
// While the database is unreachable it keeps the last size and tries again on
// the next beat (one attempt per beat).
func heartbeat(ctx context.Context, pool *pgxpool.Pool, pc *pacer.Pacer, id string, every time.Duration, log *slog.Logger) error {
	host, _ := os.Hostname()
	t := time.NewTicker(every)
	defer t.Stop()
	beats := 0
	for {
		var n int
		err := pool.QueryRow(ctx, heartbeatSQL, id, host, os.Getpid(), status.LiveWindow.Seconds()).Scan(&n)
		switch {
		case err == nil:
			pc.SetFleetSize(n)
		case ctx.Err() == nil:
			log.Debug("heartbeat failed", "err", err)
		}
		if beats++; beats%100 == 1 && err == nil {
			_, _ = pool.Exec(ctx, pruneWorkersSQL)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
