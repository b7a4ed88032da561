// Package worker is the fleetpace runtime: a River client working fetch jobs
// through the shared pacer, a jittered scan loop that queues due sources, a
// heartbeat that tells the pacer the fleet size, and an HTTP server with
// health, readiness, metrics, status, River UI and the dashboard.
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
	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/recorder"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/status"
)

// Run runs a worker until ctx ends, then shuts down gracefully: no new jobs,
// running fetches get SoftStop to finish, then are cancelled and snoozed so
// they run again. A clean shutdown returns nil, a soft stop that ran out
// included; otherwise Run returns every error of the shutdown, joined: the
// loops', River's stop, the last checks' writing (bounded) and the removal
// of the worker's row.
func Run(ctx context.Context, cfg Config) (err error) {
	if err := cfg.validateRun(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	rt, err := build(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rt.close()) }()
	pool, client := rt.pool, rt.client
	var fatal error

	// The HTTP server runs from the start, so health checks answer during the
	// startup jitter too.
	if cfg.HTTPAddr != "" {
		srv, serr := startServer(ctx, cfg, pool, client, rt.pacer, rt.metrics, log)
		if serr != nil {
			return serr
		}
		defer func() { err = errors.Join(err, srv.close()) }()
		rt.addr = srv.addr
	}

	// Startup jitter: a fleet restarted at once (a rollout, a database
	// restart) spreads its first fetches and scans over the window. The
	// scan loop then starts at once.
	poll := cfg.Poll
	if _, err := poll.StartupSleep(ctx); err != nil {
		return nil // stopped before starting: nothing to shut down
	}
	poll.StartupJitter = poller.NoStartupJitter

	if started, err := startClient(ctx, cfg, client, log); !started {
		return err // nil: stopped before the database came back
	}
	log.Info("worker started", "id", cfg.ID, "concurrency", cfg.Concurrency)

	loopCtx, stopLoops := context.WithCancel(ctx)
	defer stopLoops()
	g, gctx := errgroup.WithContext(loopCtx)
	g.Go(func() error { return heartbeat(gctx, cfg, pool, rt.pacer, rt.metrics) })
	if !cfg.DisableScan {
		g.Go(func() error { return poller.Run(gctx, poll, rt.scanCycle(cfg)) })
	}
	if cfg.Ready != nil {
		cfg.Ready(rt.addr)
	}

	select {
	case <-ctx.Done():
	case fatal = <-rt.fatal:
		log.Error("stopping", "error", fatal)
	}
	stopLoops()
	loopErr := g.Wait()
	log.Info("stopping: no new jobs; running fetches may finish", "soft_stop", cfg.SoftStop)
	stopErr := stopClient(client, cfg.SoftStop, log)
	// Only now that no job runs: the last jobs' checks are written.
	recCtx, cancelRec := context.WithTimeout(context.WithoutCancel(ctx), recorderStopTimeout)
	recErr := rt.recorder.Stop(recCtx)
	cancelRec()
	byeCtx, cancelBye := context.WithTimeout(context.WithoutCancel(ctx), leaveTimeout)
	byeErr := fleet.Leave(byeCtx, pool, cfg.ID)
	cancelBye()
	log.Info("worker stopped")
	return errors.Join(fatal, loopErr, stopErr, recErr, byeErr)
}

// startClient starts River. A database unreachable while River starts
// (down when the worker starts, or gone between its first connection and
// River's) is waited out as any outage is: River starts again on the scan
// loop's backoff schedule, jittered, a warning each time, until the
// database is back (started) or ctx ends (not started, nil). Any other
// error is returned. The client lives until it is stopped: cancelling
// Start's context would be a hard stop, and the worker wants a soft one
// first.
func startClient(ctx context.Context, cfg Config, client *queue.Client, log *slog.Logger) (started bool, err error) {
	sched := poller.NewSchedule(cmp.Or(cfg.Poll.Base, poller.DefaultBase), cmp.Or(cfg.Poll.Max, poller.DefaultMax))
	ratio := cmp.Or(cfg.Poll.JitterRatio, poller.DefaultJitterRatio)
	for {
		err := client.Start(context.WithoutCancel(ctx))
		if err == nil {
			return true, nil
		}
		if !dbconn.IsUnavailable(err) {
			return false, fmt.Errorf("worker: start river: %w", err)
		}
		d := poller.Jitter(sched.Next(false), ratio, rand.Float64())
		log.Warn("worker: the database is unavailable; River starts when it is back", "retry_in", d.Round(time.Millisecond), "error", err)
		t := cfg.Clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, nil
		case <-t.Chan():
		}
	}
}

// stopClient stops River softly within soft, then, if jobs still run,
// cancels them (they are snoozed and run again later). Running out of the
// soft stop is not an error; failing the hard stop is.
func stopClient(client *queue.Client, soft time.Duration, log *slog.Logger) error {
	softCtx, cancelSoft := context.WithTimeout(context.Background(), soft)
	err := client.Stop(softCtx)
	cancelSoft()
	if err == nil {
		return nil
	}
	log.Warn("soft stop timed out; cancelling running fetches (they will run again)")
	hardCtx, cancelHard := context.WithTimeout(context.Background(), hardStopTimeout)
	defer cancelHard()
	if err := client.StopAndCancel(hardCtx); err != nil {
		return fmt.Errorf("worker: stop river: %w", err)
	}
	return nil
}

// runtime is what Run and Drain share: pools, pacer, recorder, fetcher, River
// client.
type runtime struct {
	pool     *pgxpool.Pool
	pacer    *pacer.Pacer
	recorder *recorder.Recorder
	client   *queue.Client
	metrics  *Metrics
	addr     net.Addr // the HTTP server's, if any
	closers  []func() error
	fatal    chan error // an error the worker must stop on (a pooler found late)
}

// close releases everything build made, last first, and returns their
// errors.
func (rt *runtime) close() error {
	var errs []error
	for i := len(rt.closers) - 1; i >= 0; i-- {
		errs = append(errs, rt.closers[i]())
	}
	return errors.Join(errs...)
}

// closer adapts a close function without an error.
func closer(f func()) func() error { return func() error { f(); return nil } }

func build(ctx context.Context, cfg Config) (rt *runtime, err error) {
	rt = &runtime{fatal: make(chan error, 1)}
	defer func() {
		if err != nil {
			err = errors.Join(err, rt.close())
		}
	}()
	conn, err := rt.connections(ctx, cfg)
	if err != nil {
		return nil, err
	}
	pollOnly := cfg.PollOnly || conn.Pooler == dbconn.PoolerTransaction
	shares := splitConns(cfg.MaxConns, pollOnly)
	mainCfg := conn
	mainCfg.MaxConns, mainCfg.IdleTimeout, mainCfg.ApplicationName = int32(shares.main), ConnIdleTimeout, AppName("worker")
	rt.pool, err = dbconn.NewPool(ctx, mainCfg)
	if err != nil {
		return nil, err
	}
	rt.closers = append(rt.closers, closer(rt.pool.Close))

	// Fetch jobs record their checks with group commit, through a small
	// pool of their own, committed without waiting for the disk unless
	// RecorderSyncCommit (recorder.ConfigurePool). The recorder
	// stops only when told (Run stops it after the River client; on every
	// other way out, close does, before the pools close), so jobs still
	// running during a soft stop can record.
	recPoolCfg, err := recorderPoolConfig(conn, cfg.RecorderSyncCommit)
	if err != nil {
		return nil, err
	}
	recPool, err := pgxpool.NewWithConfig(ctx, recPoolCfg)
	if err != nil {
		return nil, fmt.Errorf("worker: recorder pool: %w", err)
	}
	rt.closers = append(rt.closers, closer(recPool.Close))
	rt.recorder, err = recorder.New(recPool, recorder.Config{Logger: cfg.Logger, Worker: cfg.ID,
		NoHistory: cfg.Tick.HistoryRetention == scan.NoHistory, Clock: cfg.Clock})
	if err != nil {
		return nil, err
	}
	if err := rt.recorder.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	rt.closers = append(rt.closers, func() error {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recorderStopTimeout)
		defer cancel()
		return rt.recorder.Stop(stopCtx)
	})

	// The pacer has a small pool of its own (never River's, never inside a
	// caller's transaction), with the same fail-fast connection rule.
	pacerCfg := conn
	pacerCfg.IdleTimeout, pacerCfg.ApplicationName = ConnIdleTimeout, AppName("pacer")
	pacerPoolCfg, err := dbconn.PoolConfig(pacerCfg)
	if err != nil {
		return nil, err
	}
	rt.pacer, err = pacer.New(ctx, pacer.Config{PoolConfig: pacerPoolCfg, MaxConns: int32(shares.pacer), PollOnly: pollOnly,
		LeaseTTL: cfg.leaseTTL(), ListenIdle: cfg.ListenIdle,
		ConnectTimeout: cfg.ConnectTimeout, Latch: PacerLatch, MinFleetSize: cfg.MinFleetSize, Logger: cfg.Logger, Clock: cfg.Clock})
	if err != nil {
		return nil, err
	}
	rt.closers = append(rt.closers, closer(rt.pacer.Close))
	// Listen for other processes' slow-downs before taking any work, so the
	// fleet's first moments are paced together too; without it the first
	// reservations start the listener and catch up.
	lctx, cancel := context.WithTimeout(ctx, 2*cmp.Or(cfg.ConnectTimeout, dbconn.DefaultConnectTimeout))
	if err := rt.pacer.Listen(lctx); err != nil {
		cfg.Logger.Warn("pacer: not listening for slow-downs yet", "err", err)
	}
	cancel()

	fetcher := cfg.Fetcher
	if fetcher == nil {
		h, err := fetch.NewHTTP(cfg.HTTP)
		if err != nil {
			return nil, err
		}
		rt.closers = append(rt.closers, closer(h.CloseIdleConnections))
		fetcher = h
	}
	state := status.NewCache(rt.pool, cfg.MetricsMaxAge, cfg.Clock)
	state.TopKeys = cfg.TopKeys
	rt.metrics = NewMetrics(state, rt.pacer, rt.recorder, cfg.Logger)
	var jobPacer Pacer = rt.pacer
	if cfg.WrapPacer != nil {
		jobPacer = cfg.WrapPacer(rt.pacer)
	}
	waker := queue.NewWaker(rt.pool, cfg.Clock, cfg.Logger)
	rt.closers = append(rt.closers, closer(waker.Stop))
	fw, err := NewFetchWorker(JobConfig{Pool: rt.pool, Pacer: jobPacer, Fetcher: fetcher, Recorder: rt.recorder, Waker: waker, MaxWait: cfg.MaxWait,
		MaxSleepers: max(1, cmp.Or(cfg.Concurrency, DefaultConcurrency)/2),
		Clock:       cfg.Clock, Metrics: rt.metrics, Logger: cfg.Logger, Worker: cfg.ID, NoHistory: cfg.Tick.HistoryRetention == scan.NoHistory})
	if err != nil {
		return nil, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, fw)
	qcfg := cfg.queueConfig(workers)
	qcfg.Middleware = rt.metrics.RiverMiddleware()
	rt.client, err = queue.NewClient(rt.pool, qcfg)
	if err != nil {
		return nil, err
	}
	return rt, nil
}

// connections is the configuration every pool of the worker starts from,
// with Config.Pooler decided ("auto": by one connection now; see
// Config.Pooler).
func (rt *runtime) connections(ctx context.Context, cfg Config) (dbconn.Config, error) {
	pooler := dbconn.Pooler(cmp.Or(cfg.Pooler, string(dbconn.PoolerAuto)))
	conn := dbconn.Config{URL: cfg.DatabaseURL, ConnectTimeout: cfg.ConnectTimeout, Pooler: pooler,
		OnPooler: func(err error) {
			select {
			case rt.fatal <- fmt.Errorf("worker: %w", err):
			default:
			}
		}}
	if pooler != dbconn.PoolerAuto {
		return conn, nil
	}
	resolved, err := dbconn.ResolvePooler(ctx, conn)
	switch {
	case errors.Is(err, dbconn.ErrInvalidConfig), errors.Is(err, redact.ErrInvalidDatabaseURL):
		return conn, err
	case err != nil:
		cfg.Logger.Warn("could not tell whether the database URL leads to a connection pooler; "+
			"checking each new connection until one reaches PostgreSQL", "err", err)
	case resolved.Pooler == dbconn.PoolerTransaction:
		cfg.Logger.Info("the database URL leads to a connection pooler: pooler-safe mode (statements as unnamed "+
			"prepared statements, no LISTEN, no startup parameters of fleetpace's own)", "pooler", "transaction")
	}
	return resolved, nil
}

// connShares is how a worker's connection budget is spent.
type connShares struct {
	main  int // the main pool
	pacer int // the pacer's pool
}

// listeners is how many connections LISTEN: the pacer's listener, none
// with pollOnly (River never LISTENs in a worker).
func (connShares) listeners(pollOnly bool) int {
	if pollOnly {
		return 0
	}
	return 1
}

// splitConns divides a budget of total connections: the listeners first,
// half of the rest (1 to 4) to the pacer's pool — every job reserves, and
// with the database a round trip away a fast platform's reservations
// overlap — and the rest, at least 2, to the main pool.
func splitConns(total int, pollOnly bool) connShares {
	rest := total - connShares{}.listeners(pollOnly)
	p := min(max(rest/2, 1), 4, rest-2)
	return connShares{main: rest - p, pacer: p}
}

// AppName is the application_name of a worker's connections of one
// purpose ("worker": the main pool; "pacer": the pacer's pool and
// listener), with the process id, so pg_stat_activity
// tells processes and purposes apart. A database URL that sets
// application_name wins.
func AppName(purpose string) string {
	return fmt.Sprintf("fleetpace-%s %d", purpose, os.Getpid())
}

// maxTicksPerCycle bounds the ticks one cycle of the scan loop runs back to
// back while they come back saturated.
const maxTicksPerCycle = 20

// scanCycle is one cycle of the scan loop: a tick, counted in the metrics,
// and at once another while the last one was saturated (a tick queues at
// most --limit sources, and each platform at most --per-platform-cap: a
// platform whose rate × look-ahead is more than that would otherwise get
// one cap per cycle, below its ceiling at a high rate), up to
// maxTicksPerCycle.
func (rt *runtime) scanCycle(cfg Config) poller.Cycle {
	return func(ctx context.Context) (bool, error) {
		found := false
		for range maxTicksPerCycle {
			res, err := scan.Tick(ctx, rt.pool, rt.client, cfg.Tick)
			switch {
			case err != nil:
				rt.metrics.tick("failed", nil, nil)
				return found, err
			case res.Skipped:
				rt.metrics.tick("skipped", nil, nil)
				return found, nil
			}
			rt.metrics.tick("ran", res.ByPlatform, res.CoolingDown)
			found = found || res.Enqueued > 0
			if res.Enqueued > 0 || res.Pruned > 0 {
				cfg.Logger.Debug("scan", "enqueued", res.Enqueued, "by_platform", res.ByPlatform,
					"paused", res.Paused, "history_pruned", res.Pruned, "saturated", res.Saturated)
			}
			if !res.Saturated || ctx.Err() != nil {
				break
			}
		}
		return found, nil
	}
}

// Drain works fetch jobs until none is available, running or due within a
// second, or until maxDuration has passed (0: no limit; the result then
// says TimedOut), then returns. It runs no scan loop. Its error joins the
// drain's and those of releasing what it built.
func Drain(ctx context.Context, cfg Config, maxDuration time.Duration) (res *queue.DrainResult, err error) {
	if err := cfg.validateRun(); err != nil {
		return nil, err
	}
	dcfg := queue.DrainConfig{MaxDuration: maxDuration, Clock: cfg.Clock}
	if err := dcfg.Validate(); err != nil {
		return nil, invalid{err}
	}
	cfg = cfg.withDefaults()
	rt, err := build(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, rt.close()) }()
	return queue.Drain(ctx, rt.client, rt.pool, dcfg)
}

// heartbeat refreshes this worker's row (with its fetches in flight, which
// status sums fleet-wide) and tells the pacer the fleet size,
// every cfg.Heartbeat on cfg.Clock. While the database is unreachable it
// keeps the last size and tries again on the next beat (one attempt per
// beat). Every 100th successful beat prunes the rows of long-gone workers.
func heartbeat(ctx context.Context, cfg Config, pool *pgxpool.Pool, pc *pacer.Pacer, m *Metrics) error {
	self := fleet.Self(cfg.ID)
	t := cfg.Clock.NewTicker(cfg.Heartbeat)
	defer t.Stop()
	for beats := 0; ; {
		self.InFlight = m.InFlight()
		n, err := fleet.Beat(ctx, pool, self)
		switch {
		case err == nil:
			pc.SetFleetSize(n)
			if beats++; beats%100 == 1 {
				if err := fleet.Prune(ctx, pool); err != nil && ctx.Err() == nil {
					cfg.Logger.Debug("pruning gone workers failed", "err", err)
				}
			}
		case ctx.Err() == nil:
			cfg.Logger.Debug("heartbeat failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.Chan():
		}
	}
}

// recorderPoolConfig is the recorder's pool: 2 connections of conn,
// committing with synchronous_commit off unless sync.
func recorderPoolConfig(conn dbconn.Config, sync bool) (*pgxpool.Config, error) {
	conn.MaxConns = 2
	pc, err := dbconn.PoolConfig(conn)
	if err != nil {
		return nil, err
	}
	recorder.ConfigurePool(pc, !sync)
	return pc, nil
}
