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
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"golang.org/x/sync/errgroup"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/recorder"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
)

// DefaultHTTPAddr is where the CLI's worker serves its HTTP endpoints.
const DefaultHTTPAddr = "127.0.0.1:9464"

// Defaults of Config (its other durations are queue's: queue.DefaultJobTimeout
// and queue.DefaultRescueAfter).
const (
	DefaultConcurrency  = queue.DefaultMaxWorkers
	DefaultSoftStop     = queue.DefaultSoftStopTimeout
	DefaultHeartbeat    = 5 * time.Second
	DefaultMinFleetSize = 1
	DefaultMaxConns     = 10
)

// PacerLatch is the worker's pacer.Config.Latch: after a failed attempt to
// reach the database, the pacer paces locally and tries again this long
// later; after it reaches the database, it also honours its local share
// for this long (other workers may still pace locally until their own
// latch has passed). So the fleet paces at full speed again within about
// 2 × PacerLatch of the database answering — a failover to a standby
// included — instead of 2 × the library's 5-s default. The attempts it
// costs during an outage are one a second per worker, as River's own
// fetch poll makes on the main pool.
const PacerLatch = time.Second

// ConnIdleTimeout is how long a worker keeps an idle pool connection: once
// a busy spell is over, its connections close within it (checked every
// 1.5 × ConnIdleTimeout), and an idle worker keeps only what its periodic
// queries use every second or so.
const ConnIdleTimeout = 5 * time.Second

// MinMaxConns returns the smallest Config.MaxConns: one for the pacer's
// listener (none with PollOnly), one for the pacer's pool and two for the
// main pool.
func MinMaxConns(pollOnly bool) int {
	return connShares{}.listeners(pollOnly) + 3
}

// Bounds of Config. A heartbeat must come well within fleet.LiveWindow, or
// the worker counts as dead between two; more often than MinHeartbeat is a
// write per worker for nothing. Degraded pacing divides by the fleet size.
const (
	MinHeartbeat = 500 * time.Millisecond
	MaxHeartbeat = fleet.LiveWindow / 2
	MaxFleetSize = 100_000
	MaxPacerWait = time.Hour
)

// Bounds of the shutdown steps after River's stop.
const (
	hardStopTimeout     = 10 * time.Second // River's StopAndCancel after the soft stop ran out
	recorderStopTimeout = 10 * time.Second // the last checks' statements
	leaveTimeout        = 2 * time.Second  // deleting the worker's row
)

// ErrInvalidConfig is wrapped by every error of Config.Validate, including
// those of the configurations it holds (queue's, poller's, scan's,
// fetch's), which wrap their own package's sentinel too.
var ErrInvalidConfig = errors.New("invalid config")

// Config configures a worker. The zero value of every field but DatabaseURL
// means its default.
type Config struct {
	// DatabaseURL is the PostgreSQL URL. Required.
	DatabaseURL string
	// ConnectTimeout bounds one connection attempt. Default 2 s.
	ConnectTimeout time.Duration

	// Concurrency is how many fetch jobs run at once in this process.
	// Default DefaultConcurrency.
	Concurrency int
	// JobTimeout bounds one fetch job. Default queue.DefaultJobTimeout.
	JobTimeout time.Duration
	// RescueAfter: a job running this long is considered abandoned by a dead
	// worker and run again. Default queue.DefaultRescueAfter.
	RescueAfter time.Duration
	// SoftStop is how long running fetches may finish after SIGTERM before
	// they are cancelled (and run again later). Default DefaultSoftStop.
	SoftStop time.Duration
	// MaxWait is the longest pacer wait a job sleeps through; longer waits
	// snooze the job. Default DefaultMaxWait.
	MaxWait time.Duration
	// LeaseTTL is how long a fetch's slot counts as an open request of a
	// platform (or key) that caps them (max_in_flight) when the fetch is
	// never reported — this process was killed: its capacity is back after
	// this long (pacer.Config.LeaseTTL). Default: MaxWait + the fetch's
	// timeout (HTTP.Timeout) + LeaseMargin, the longest a slot can stay
	// open while this process lives.
	LeaseTTL time.Duration

	// MaxConns is the most PostgreSQL connections this process holds, all
	// of them: the pacer's listener (none with PollOnly), the pacer's pool
	// (half of the rest, 1 to 4) and the main pool (the rest: River's
	// fetches, completions and maintenance, the check recorder, the scan
	// tick, the heartbeat, the HTTP endpoints). Jobs hold no connection
	// while they fetch, so the budget does not grow with Concurrency. Pool
	// connections idle for ConnIdleTimeout are closed. River runs without
	// LISTEN (queue.Config.PollOnly) whatever PollOnly says: the scan queues
	// work ahead of the workers, so River's notifier would only shorten the
	// pickup of jobs queued while a worker idles (≤ 1 s, River's poll) and a
	// leader's succession (≤ 5 s), for a connection held by every worker at
	// all times. Default DefaultMaxConns; at least MinMaxConns(PollOnly).
	MaxConns int
	// PollOnly turns the pacer's LISTEN off too, for PgBouncer in
	// transaction mode: the pacer learns of a fleet's slow-down at its next
	// reservation instead of within milliseconds (pacer.Config.PollOnly).
	// It saves a connection.
	PollOnly bool
	// Pooler says whether DatabaseURL leads to a connection pooler in
	// transaction mode (PgBouncer's pool_mode = transaction): "transaction"
	// sends statements as unnamed prepared statements described once
	// (pgx's cache_describe, unless the URL sets default_query_exec_mode),
	// implies PollOnly and sends none of the startup parameters a pooler
	// refuses (the pacer's and the recorder's session settings: speed
	// only); "none" changes nothing. Default ("") "auto": one connection
	// at start-up tells (a pooler makes up the backend process id it
	// reports, which pg_backend_pid() contradicts); if the database is
	// unreachable then, every new connection is checked until one goes to
	// PostgreSQL, and one that goes through a pooler stops the worker with
	// an error naming "transaction".
	Pooler string

	// RecorderAsyncCommit records checks with synchronous_commit off: a
	// batch's commit waits neither for the disk nor for a synchronous
	// standby. A check lost with its commit (a crash or failover within a
	// fraction of a second) is fetched again a minute later, its history row
	// lost (recorder.ConfigurePool). Default false: the server's
	// synchronous_commit applies.
	RecorderAsyncCommit bool

	// Poll configures the scan loop (base 1 s, max 30 s, jitter 0.5 by
	// default). Its StartupJitter also delays the River client's start, on
	// its Clock (default: Config.Clock) with its Rand.
	Poll poller.Config
	// Tick configures each scan tick.
	Tick scan.Config
	// DisableScan turns the scan loop off (for fleets scanned by cron).
	DisableScan bool

	// Heartbeat is how often this process refreshes its worker row and reads
	// the fleet size. Default DefaultHeartbeat.
	Heartbeat time.Duration
	// MinFleetSize is the smallest fleet size degraded pacing assumes.
	// Default DefaultMinFleetSize.
	MinFleetSize int

	// Fetcher fetches sources. Default: fetch.NewHTTP(HTTP).
	Fetcher fetch.Fetcher
	// WrapPacer, if set, is given the shared pacer and returns the Pacer
	// the fetch jobs use instead: one that paces some platforms on its own
	// and passes the others through (the benchmarks' baselines that keep no
	// shared state). Default nil: the shared pacer.
	WrapPacer func(Pacer) Pacer
	// HTTP configures the built-in fetcher when Fetcher is nil (its Clock
	// defaults to Config.Clock).
	HTTP fetch.HTTPConfig

	// HTTPAddr is the address of the health/metrics/status server.
	// Default "" (no server); the CLI's default is DefaultHTTPAddr.
	HTTPAddr string
	// AdminToken turns the dashboard's actions on (pause, resume, clear a
	// cooldown, reset a platform's pace, check now, change rate and burst,
	// disable and enable a source), behind
	// a sign-in with it, which River UI then needs too, and beyond loopback
	// every page and /status (dashboard.Config.AdminToken). Beyond loopback
	// it must be at least dashboard.MinTokenBytes long. Default "": the
	// dashboard is read-only.
	AdminToken string
	// AllowedHosts are the host names the server answers to besides the
	// loopback names and the address it listens on
	// (dashboard.Config.AllowedHosts); /healthz, /readyz and /metrics
	// answer any. Default: none.
	AllowedHosts []string
	// PublicRead keeps the pages and /status readable without sign-in
	// beyond loopback with an AdminToken (dashboard.Config.PublicRead).
	PublicRead bool
	// TrustProxyHeaders trusts a TLS-terminating proxy's X-Forwarded-Proto
	// and X-Forwarded-For (dashboard.Config.TrustProxyHeaders).
	TrustProxyHeaders bool
	// MetricsMaxAge is how old the fleet-wide figures of /metrics and
	// /status may be (see status.Cache). Default status.DefaultMaxAge.
	MetricsMaxAge time.Duration
	// TopKeys is how many keys per platform /metrics and /status name (the
	// keys under the most pressure: held, slowed, open requests), which
	// bounds the per-key series. 0: sources.DefaultTopKeys; negative: none.
	TopKeys int

	// Clock is what the worker sleeps and times on: the startup jitter and
	// the scan loop (unless Poll.Clock is set), the heartbeat, the jobs'
	// pacer waits, a drain's checks, the metrics' refresh. Default (nil):
	// the real clock.
	Clock clock.Clock
	// ID names this worker in heartbeats and River. Default hostname-pid-random.
	ID string
	// Logger. Default: discard.
	Logger *slog.Logger
	// Ready, if set, is called once the River client and the loops run.
	Ready func(addr net.Addr)
}

func (c Config) withDefaults() Config {
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.SoftStop = cmp.Or(c.SoftStop, DefaultSoftStop)
	c.Heartbeat = cmp.Or(c.Heartbeat, DefaultHeartbeat)
	c.MinFleetSize = cmp.Or(c.MinFleetSize, DefaultMinFleetSize)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	c.Clock = clock.Or(c.Clock)
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%04x", host, os.Getpid(), rand.IntN(0x10000))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Poll.Clock == nil {
		c.Poll.Clock = c.Clock
	}
	if c.Poll.Logger == nil {
		c.Poll.Logger = c.Logger
	}
	if c.HTTP.Clock == nil {
		c.HTTP.Clock = c.Clock
	}
	return c
}

// LeaseMargin is what the default LeaseTTL adds to the longest a slot can
// stay open (its wait and its fetch): the report's round trip, a loaded
// machine. MinLeaseTTL and MaxLeaseTTL bound a LeaseTTL given.
const (
	LeaseMargin = 5 * time.Second
	MinLeaseTTL = time.Second
	MaxLeaseTTL = time.Hour
)

// leaseTTL is LeaseTTL or its default.
func (c Config) leaseTTL() time.Duration {
	if c.LeaseTTL > 0 {
		return c.LeaseTTL
	}
	return cmp.Or(c.MaxWait, DefaultMaxWait) + cmp.Or(c.HTTP.Timeout, fetch.DefaultTimeout) + LeaseMargin
}

// queueConfig is the River client's configuration.
func (c Config) queueConfig(workers *river.Workers) queue.Config {
	return queue.Config{
		Workers: workers, MaxWorkers: c.Concurrency, JobTimeout: c.JobTimeout, RescueAfter: c.RescueAfter,
		SoftStopTimeout: c.SoftStop, ID: c.ID, Logger: c.Logger, PollOnly: true,
	}
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig. It
// does not check DatabaseURL, so a command line can validate its flags
// before it resolves the database (Run and Drain require it).
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: worker.Config."+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Concurrency < 0:
		return bad("Concurrency must be ≥ 1 (0: default), got %d", c.Concurrency)
	case c.SoftStop < 0:
		return bad("SoftStop must be ≥ 0, got %s", c.SoftStop)
	case c.MaxWait < 0 || c.MaxWait > MaxPacerWait:
		return bad("MaxWait must be in [0, %s], got %s", MaxPacerWait, c.MaxWait)
	case c.LeaseTTL < 0 || (c.LeaseTTL > 0 && c.LeaseTTL < MinLeaseTTL) || c.LeaseTTL > MaxLeaseTTL:
		return bad("LeaseTTL must be in [%s, %s] (0: default), got %s", MinLeaseTTL, MaxLeaseTTL, c.LeaseTTL)
	case c.Heartbeat < 0 || (c.Heartbeat > 0 && c.Heartbeat < MinHeartbeat) || c.Heartbeat > MaxHeartbeat:
		return bad("Heartbeat must be in [%s, %s] (0: default), got %s", MinHeartbeat, MaxHeartbeat, c.Heartbeat)
	case c.MinFleetSize < 0 || c.MinFleetSize > MaxFleetSize:
		return bad("MinFleetSize must be in [1, %d] (0: default), got %d", MaxFleetSize, c.MinFleetSize)
	case c.TopKeys > sources.MaxTopKeys:
		return bad("TopKeys must be at most %d, got %d", sources.MaxTopKeys, c.TopKeys)
	case c.MetricsMaxAge < 0:
		return bad("MetricsMaxAge must be > 0 (0: default), got %s", c.MetricsMaxAge)
	case c.Pooler != "" && c.Pooler != string(dbconn.PoolerAuto) && c.Pooler != string(dbconn.PoolerNone) && c.Pooler != string(dbconn.PoolerTransaction):
		return bad("Pooler must be one of auto, none, transaction (\"\": auto), got %q", c.Pooler)
	case c.MaxConns != 0 && c.MaxConns < MinMaxConns(c.PollOnly):
		return bad("MaxConns must be ≥ %d (0: default), got %d", MinMaxConns(c.PollOnly), c.MaxConns)
	}
	if err := validateHTTPAddr(c.HTTPAddr); err != nil {
		return bad("HTTPAddr %s, got %q", err, c.HTTPAddr)
	}
	if err := dashboard.CheckAdminToken(c.AdminToken, dashboard.ListenHost(c.HTTPAddr)); c.HTTPAddr != "" && err != nil {
		return bad("AdminToken %v", err)
	}
	for _, h := range c.AllowedHosts {
		if err := dashboard.CheckAllowedHost(h); err != nil {
			return bad("AllowedHosts %v", err)
		}
	}
	c = c.withDefaults()
	for _, err := range []error{c.queueConfig(nil).Validate(), c.Poll.Validate(), c.Tick.Validate(), c.httpValidate()} {
		if err != nil {
			return invalid{err}
		}
	}
	return nil
}

// validateHTTPAddr checks a listen address: "" (no server) or host:port,
// the host empty (every interface), an IP address or a name, the port
// numeric in [0, 65535] (0: any free port).
func validateHTTPAddr(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("must be host:port (e.g. 127.0.0.1:9464, :9464)")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 || strings.TrimLeft(port, "0123456789") != "" {
		return errors.New("must have a port in [0, 65535]")
	}
	if strings.ContainsAny(host, " /\\@?#") {
		return errors.New("must have a host name or an IP address")
	}
	return nil
}

func (c Config) httpValidate() error {
	if c.Fetcher != nil {
		return nil
	}
	return c.HTTP.Validate()
}

// validateRun is Validate plus DatabaseURL.
func (c Config) validateRun() error {
	if c.DatabaseURL == "" {
		return fmt.Errorf("%w: worker.Config.DatabaseURL is required", ErrInvalidConfig)
	}
	return c.Validate()
}

// invalid is an invalid configuration of a package the worker configures:
// an error of that package's and an ErrInvalidConfig of this one.
type invalid struct{ err error }

func (e invalid) Error() string   { return e.err.Error() }
func (e invalid) Unwrap() []error { return []error{e.err, ErrInvalidConfig} }

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

	// The client lives until we stop it: cancelling Start's context would be
	// a hard stop, and we want a soft one first.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("worker: start river: %w", err)
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
	// pool of their own, durable as the server says unless
	// RecorderAsyncCommit (recorder.ConfigurePool). The recorder
	// stops only when told (Run stops it after the River client; on every
	// other way out, close does, before the pools close), so jobs still
	// running during a soft stop can record.
	recCfg := conn
	recCfg.MaxConns = 2
	recPoolCfg, err := dbconn.PoolConfig(recCfg)
	if err != nil {
		return nil, err
	}
	recorder.ConfigurePool(recPoolCfg, cfg.RecorderAsyncCommit)
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
		LeaseTTL:       cfg.leaseTTL(),
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
	fw, err := NewFetchWorker(JobConfig{Pool: rt.pool, Pacer: jobPacer, Fetcher: fetcher, Recorder: rt.recorder, MaxWait: cfg.MaxWait,
		Clock: cfg.Clock, Metrics: rt.metrics, Logger: cfg.Logger, Worker: cfg.ID, NoHistory: cfg.Tick.HistoryRetention == scan.NoHistory})
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
