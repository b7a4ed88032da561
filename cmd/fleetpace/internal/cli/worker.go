package cli

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/bench/localpace"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

// addFetchFlags registers the flags of the built-in HTTP fetcher.
func addFetchFlags(f *pflag.FlagSet, h *fetch.HTTPConfig) {
	// Tests only, hidden, without an environment variable: see
	// fetch.HTTPConfig.GuardExempt. Never in production.
	f.Var((*addrPorts)(&h.GuardExempt), "test-guard-exempt", "TESTS ONLY, never in production: an ADDRESS:PORT the SSRF guard lets through (repeatable)")
	if err := f.MarkHidden("test-guard-exempt"); err != nil {
		panic("cli: " + err.Error())
	}
	f.BoolVar(&h.AllowPrivateNetworks, "allow-private-networks", false, "allow fetching loopback, private and link-local addresses (refused by default: SSRF guard)")
	f.StringVar(&h.StoreDir, "store-dir", "", "store fetched bodies content-addressed under this directory (default: discard)")
	f.StringVar(&h.UserAgent, "user-agent", fetch.DefaultUserAgent, "User-Agent of every request")
	f.DurationVar(&h.Timeout, "fetch-timeout", fetch.DefaultTimeout, "bound on one fetch (connect, redirects, body)")
	f.Int64Var(&h.MaxBodyBytes, "max-body-bytes", fetch.DefaultMaxBodyBytes, "largest body accepted, in bytes (10485760 = 10 MiB); larger is a failed fetch")
	f.IntVar(&h.MaxRedirects, "max-redirects", fetch.DefaultMaxRedirects, "redirects followed; one more is a failed fetch")
	f.DurationVar(&h.RateLimitedAfter, "rate-limited-after", fetch.DefaultRateLimitedAfter, "a 429/503 whose Retry-After exceeds this cools the whole platform down")
	zeroIsDefault(f, "fetch-timeout", "max-body-bytes", "rate-limited-after")
}

// addJobFlags registers the flags shared by worker and drain.
func addJobFlags(f *pflag.FlagSet, c *worker.Config) {
	f.IntVar(&c.Concurrency, "concurrency", worker.DefaultConcurrency, "fetch jobs run at once by this process")
	f.DurationVar(&c.JobTimeout, "job-timeout", queue.DefaultJobTimeout, "bound on one fetch job (River's job timeout)")
	f.DurationVar(&c.RescueAfter, "rescue-after", queue.DefaultRescueAfter, "a job running this long counts as abandoned by a dead worker and runs again (River's leader checks every 30 s, so rescue takes up to 30 s more)")
	f.DurationVar(&c.MaxWait, "max-pacer-wait", worker.DefaultMaxWait, "longest pacer wait a job sleeps through; longer waits snooze the job")
	f.DurationVar(&c.LeaseTTL, "lease-ttl", 0, fmt.Sprintf("on platforms that cap open requests (--max-in-flight), how long a killed worker's open requests still count (0: --max-pacer-wait + --fetch-timeout + %s; %s to %s)", worker.LeaseMargin, worker.MinLeaseTTL, worker.MaxLeaseTTL))
	f.IntVar(&c.MinFleetSize, "min-fleet-size", worker.DefaultMinFleetSize, "fleet size assumed at least when the database is unreachable (degraded pacing at rate / (fleet + 1))")
	f.IntVar(&c.MaxConns, "max-conns", worker.DefaultMaxConns, "PostgreSQL connections this process holds at most, every pool and listener included (size the server: workers × this ≤ max_connections, or use PgBouncer)")
	f.BoolVar(&c.RecorderSyncCommit, "recorder-sync-commit", false, "record checks with the server's synchronous_commit (waiting for the disk or a synchronous standby) instead of with it off; off, a check lost in a crash or failover within a fraction of a second of its commit is fetched again a minute later, as one a killed worker had not written yet")
	f.Var(invertedBool{&c.RecorderSyncCommit}, "recorder-async-commit", "records checks with synchronous_commit off (the default now)")
	f.Lookup("recorder-async-commit").NoOptDefVal = "true"
	_ = f.MarkDeprecated("recorder-async-commit", "it is the default; --recorder-sync-commit waits for the disk")
	f.DurationVar(&c.ListenIdle, "listen-idle", pacer.DefaultListenIdle, fmt.Sprintf("how long the pacer's LISTEN connection stays open while this process reserves nothing (at most %s)", worker.MaxListenIdle))
	f.BoolVar(&c.PollOnly, "poll-only", false, "no LISTEN at all (for PgBouncer in transaction mode): the pacer learns of slow-downs at its next reservation instead of within milliseconds; saves a connection (River always polls)")
	zeroIsDefault(f, "concurrency", "job-timeout", "rescue-after", "min-fleet-size", "max-conns", "lease-ttl")
	addFetchFlags(f, &c.HTTP)
}

// workerConfig validates the worker's configuration built from the flags
// (before anything is started: bad flags change nothing), then resolves the
// database and completes it.
func (a *app) workerConfig(cmd *cobra.Command, c *worker.Config) error {
	if c.HTTP.MaxRedirects == 0 {
		c.HTTP.MaxRedirects = -1 // the fetch package's "follow none"
	}
	c.Logger = a.logger
	if err := c.Validate(); err != nil {
		return err
	}
	url, err := a.resolveURL(cmd.Context())
	if err != nil {
		return dbError(err)
	}
	c.DatabaseURL = url
	c.ConnectTimeout = a.connectTimeout
	c.Pooler = string(a.poolerFor(url))
	return nil
}

func (a *app) drainCmd() *cobra.Command {
	var (
		cfg         worker.Config
		maxDuration time.Duration
	)
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "Work queued fetch jobs until none is left, then exit (pair with `scan` in cron)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := (queue.DrainConfig{MaxDuration: maxDuration}).Validate(); err != nil {
				return err
			}
			if err := a.workerConfig(cmd, &cfg); err != nil {
				return err
			}
			res, err := worker.Drain(cmd.Context(), cfg, maxDuration)
			if err != nil {
				return dbError(err)
			}
			if res.TimedOut {
				fmt.Fprintf(a.stdout, "drain: stopped after --max-duration %s with %d job(s) left (%d finished)\n", maxDuration, res.Left, res.Completed)
				return nil
			}
			fmt.Fprintf(a.stdout, "drain: queue empty (%d job(s) finished)\n", res.Completed)
			return nil
		},
	}
	addJobFlags(cmd.Flags(), &cfg)
	cmd.Flags().DurationVar(&maxDuration, "max-duration", 0, "stop after this long even if jobs are left (0: no limit)")
	return cmd
}

func (a *app) workerCmd() *cobra.Command {
	var (
		cfg           worker.Config
		startupJitter time.Duration
		jitter        float64
	)
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a long-lived worker: fetch jobs through the shared pacer, scan loop, heartbeat, HTTP status server",
		Long: `Run a worker process. Start as many as you like, on as many machines, against
the same PostgreSQL: River shares the jobs out and the pacer rows keep every
platform under its fleet-wide ceiling.

The worker serves, on --http-addr: the dashboard at / (see ` + "`fleetpace dashboard --help`" + `;
its actions need --admin-token), /healthz, /readyz (503 with Retry-After
while the database is unreachable; the database is pinged at most once a
second), /metrics (Prometheus), /status (JSON, at most 10 s old) and
/riverui/ (River's job dashboard; behind the dashboard's sign-in with
--admin-token). /healthz, /readyz and /metrics answer any Host and need no
sign-in; the rest answer only to the loopback names, the address listened
on and --allowed-host.

SIGTERM or SIGINT: stop taking jobs, let running fetches finish within
--soft-stop, then cancel them (they run again later), and exit 0.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case !cmd.Flags().Changed("startup-jitter"):
				cfg.Poll.StartupJitter = 0 // default: U[0, poll max]
			case startupJitter == 0:
				cfg.Poll.StartupJitter = poller.NoStartupJitter
			default:
				cfg.Poll.StartupJitter = startupJitter
			}
			cfg.Poll.JitterRatio = jitter
			if jitter == 0 {
				cfg.Poll.JitterRatio = poller.NoJitter
			}
			switch {
			case cfg.TopKeys < 0 || cfg.TopKeys > sources.MaxTopKeys:
				return usagef("--top-keys: must be in [0, %d], got %d", sources.MaxTopKeys, cfg.TopKeys)
			case cfg.TopKeys == 0:
				cfg.TopKeys = -1 // none (worker.Config's 0 is the default)
			}
			if err := a.workerConfig(cmd, &cfg); err != nil {
				return err
			}
			cfg.Ready = func(addr net.Addr) {
				if addr != nil {
					a.logger.Info("worker ready", "http", "http://"+addr.String()+"/status")
				}
			}
			return worker.Run(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	addJobFlags(f, &cfg)
	addTickFlags(cmd, &cfg.Tick)
	f.StringVar(&cfg.HTTPAddr, "http-addr", worker.DefaultHTTPAddr, "address of the dashboard (/), /healthz, /readyz, /metrics, /status, /riverui/ (empty: no server)")
	addHTTPFlags(f, &cfg.AdminToken, &cfg.AllowedHosts, &cfg.PublicRead, &cfg.TrustProxyHeaders)
	f.DurationVar(&cfg.SoftStop, "soft-stop", worker.DefaultSoftStop, "on SIGTERM, time running fetches get to finish before they are cancelled")
	f.DurationVar(&cfg.Poll.Base, "poll-base", poller.DefaultBase, "scan loop: sleep after a tick that found work")
	f.DurationVar(&cfg.Poll.Max, "poll-max", poller.DefaultMax, "scan loop: longest sleep (doubling from --poll-base after empty or failed ticks)")
	f.Float64Var(&jitter, "poll-jitter", poller.DefaultJitterRatio, "scan loop: every sleep is multiplied by U[1-j, 1+j] (0 disables)")
	f.DurationVar(&startupJitter, "startup-jitter", 0, "sleep U[0, this] before starting (default: --poll-max; 0 disables)")
	f.BoolVar(&cfg.DisableScan, "no-scan", false, "do not run the scan loop (when fleetpace scan runs from cron or a timer)")
	f.IntVar(&cfg.TopKeys, "top-keys", sources.DefaultTopKeys, fmt.Sprintf("keys per platform named by /metrics and /status: those under the most pressure (held, slowed, open requests; 0 to %d; bounds the per-key series)", sources.MaxTopKeys))
	f.DurationVar(&cfg.Heartbeat, "heartbeat", worker.DefaultHeartbeat, "how often this worker announces itself (fleet size for degraded pacing)")
	addBenchLocalPacer(f, &cfg)
	return cmd
}

// addBenchLocalPacer registers the hidden --bench-local-pacer flag: `bench
// adapt` runs its baselines (the AWS SDKs' adaptive mode per process, the
// oracle's fixed share) on platforms of their own by pacing them inside each
// worker instead of through the shared pacer. Benchmarks only.
func addBenchLocalPacer(f *pflag.FlagSet, cfg *worker.Config) {
	f.Var(&localPacers{cfg: cfg}, "bench-local-pacer", "BENCHMARKS ONLY: pace PLATFORM in this process alone: PLATFORM=aws:CAP or PLATFORM=oracle:RATE[@UNIXMS:RATE]…[~PHASE] (repeatable)")
	if err := f.MarkHidden("bench-local-pacer"); err != nil {
		panic("cli: " + err.Error())
	}
}

// localPacers is the repeatable --bench-local-pacer flag: each value is
// parsed when given (a bad one is a flag error, exit 2), and the worker's
// WrapPacer routes the platforms named so far to their local pacers.
type localPacers struct {
	cfg   *worker.Config
	specs []localpace.Spec
}

func (l *localPacers) String() string {
	var s []string
	for _, sp := range l.specs {
		s = append(s, sp.String())
	}
	return strings.Join(s, ",")
}

func (l *localPacers) Set(v string) error {
	sp, err := localpace.Parse(v)
	if err != nil {
		return err
	}
	specs := append(slices.Clone(l.specs), sp)
	if _, err := localpace.NewRouter(nil, nil, specs); err != nil {
		return err
	}
	l.specs = specs
	l.cfg.WrapPacer = func(shared worker.Pacer) worker.Pacer {
		r, err := localpace.NewRouter(shared, l.cfg.Clock, specs)
		if err != nil {
			panic("cli: local pacers checked by Set: " + err.Error())
		}
		return r
	}
	return nil
}

func (*localPacers) Type() string { return "spec" }

// addrPorts is a repeatable ADDRESS:PORT flag.
type addrPorts []netip.AddrPort

func (a *addrPorts) String() string {
	s := make([]string, len(*a))
	for i, ap := range *a {
		s[i] = ap.String()
	}
	return strings.Join(s, ",")
}

func (a *addrPorts) Set(v string) error {
	ap, err := netip.ParseAddrPort(v)
	if err != nil {
		return fmt.Errorf("%q is not an ADDRESS:PORT (e.g. 127.0.0.1:8080)", v)
	}
	*a = append(*a, ap)
	return nil
}

func (*addrPorts) Type() string { return "addrport" }
