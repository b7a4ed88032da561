package worker

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
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
	// ListenIdle is how long the pacer's listener stays connected while
	// this process reserves nothing (pacer.Config.ListenIdle): an idle
	// worker then holds no connection for it. Default
	// pacer.DefaultListenIdle; at most MaxListenIdle.
	ListenIdle time.Duration

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

	// RecorderSyncCommit records checks with the server's
	// synchronous_commit: a batch's commit waits for the disk (and a
	// synchronous standby) as the server says. Default false: with
	// synchronous_commit off, as the pacer's own state, since a check is
	// written behind its job anyway (recorder.Recorder.Submit) — a check
	// lost with an unflushed commit (the database crashing or failing over
	// within a fraction of a second of it) is lost like one of a worker
	// killed before its batch: the scan's reconciliation releases its
	// source a minute later and it is fetched again, its history row lost
	// (recorder.ConfigurePool). Waiting for the disk costs a flush per
	// batch beside River's own (bench worker on a durable database: 0.775 ×
	// bare River with it, 0.91 × without).
	RecorderSyncCommit bool

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

// MaxListenIdle bounds Config.ListenIdle.
const MaxListenIdle = time.Hour

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
	case c.ListenIdle < 0 || c.ListenIdle > MaxListenIdle:
		return bad("ListenIdle must be in [0, %s] (0: default), got %s", MaxListenIdle, c.ListenIdle)
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
