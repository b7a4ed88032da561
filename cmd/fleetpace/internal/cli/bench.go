package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/bench"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/redact"
)

// benchCmd is `fleetpace bench` with the given benchmarks.
func (a *app) benchCmd(benchmarks ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure fleetpace against its baselines (one run, one database, medians)",
		Long: `Benchmarks that measure fleetpace side by side with a named baseline (what
you would run without fleetpace: a bare single-row upsert, a bare River job,
the plain ORDER BY … LIMIT of the due sources), in one run on one database,
and report medians.

Without --database-url each benchmark starts a throwaway embedded cluster;
with one, use a throwaway database: benchmarks delete and create data.`,
	}
	cmd.AddCommand(benchmarks...)
	return cmd
}

// benchDB returns a pool on the database to benchmark: the given URL, or a
// throwaway embedded cluster (removed by the returned cleanup).
func (a *app) benchDB(ctx context.Context, maxConns int32) (*pgxpool.Pool, string, func(), error) {
	url := a.databaseURL
	cleanup := func() {}
	if url == "" {
		fmt.Fprintln(a.stderr, "fleetpace: starting a throwaway embedded PostgreSQL for the benchmark")
		c, err := pgembed.Start(ctx, pgembed.Config{Logger: a.logger, Settings: map[string]string{"shared_buffers": "'512MB'", "max_connections": "1000"}})
		if err != nil {
			return nil, "", nil, err
		}
		cleanup = func() { _ = c.Close(context.WithoutCancel(ctx)) }
		url = c.URL("postgres")
	} else {
		a.announce("benchmarking database %s", redact.DescribeDatabase(url))
	}
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: url, ConnectTimeout: a.connectTimeout, MaxConns: maxConns})
	if err != nil {
		cleanup()
		return nil, "", nil, err
	}
	if _, err := fleetpace.Apply(ctx, pool, nil); err != nil {
		pool.Close()
		cleanup()
		return nil, "", nil, dbError(err)
	}
	return pool, url, func() { pool.Close(); cleanup() }, nil
}

// benchResult is what every benchmark returns.
type benchResult interface {
	WriteText(io.Writer) error
	WriteJSON(io.Writer) error
}

// runBench runs a benchmark on the database to benchmark (benchDB) and
// prints its result as a table or, with asJSON, as one JSON object.
func (a *app) runBench(ctx context.Context, asJSON bool, run func(ctx context.Context, pool *pgxpool.Pool, url string) (benchResult, error)) error {
	pool, url, cleanup, err := a.benchDB(ctx, 4)
	if err != nil {
		return err
	}
	defer cleanup()
	res, err := run(ctx, pool, url)
	if err != nil {
		return dbError(err)
	}
	if asJSON {
		return res.WriteJSON(a.stdout)
	}
	return res.WriteText(a.stdout)
}

// benchmark is one subcommand of `fleetpace bench`: its help, its flags
// (bound to its configuration), and how it runs on the database to
// benchmark (runBench). Every benchmark validates its configuration before
// it touches a database and has --json.
type benchmark struct {
	use, short, long string
	cfg              interface{ Validate() error } // what the flags set
	flags            func(f *pflag.FlagSet)
	zeroIsDefault    []string // flags whose 0 is refused (leave them out for the default)
	jsonHelp         string   // --json's help; default "print one JSON object"
	// check refuses a combination of flags before cfg.Validate (nil: none).
	check func(cmd *cobra.Command) error
	run   func(ctx context.Context, pool *pgxpool.Pool, url string) (benchResult, error)
}

// benchCommand is the subcommand of b.
func (a *app) benchCommand(b benchmark) *cobra.Command {
	var (
		asJSON  bool
		profile string
	)
	cmd := &cobra.Command{
		Use:   b.use,
		Short: b.short,
		Long:  b.long,
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if b.check != nil {
				if err := b.check(cmd); err != nil {
					return err
				}
			}
			if err := b.cfg.Validate(); err != nil {
				return err
			}
			if profile != "" {
				stop, err := startCPUProfile(profile)
				if err != nil {
					return err
				}
				defer stop()
			}
			return a.runBench(cmd.Context(), asJSON, b.run)
		},
	}
	f := cmd.Flags()
	b.flags(f)
	f.BoolVar(&asJSON, "json", false, cmp.Or(b.jsonHelp, "print one JSON object"))
	f.StringVar(&profile, "cpu-profile", "", "write a Go CPU profile of this process (not of worker processes it starts) to this file, for go tool pprof")
	zeroIsDefault(f, b.zeroIsDefault...)
	return cmd
}

// benchCmds are the subcommands of `fleetpace bench`, one per benchmark,
// and the hidden child process of the pacer benchmark.
func (a *app) benchCmds() []*cobra.Command {
	var (
		scanCfg      bench.ScanConfig
		pacerCfg     bench.PacerConfig
		fleetCfg     bench.FleetConfig
		soakCfg      bench.SoakConfig
		workerCfg    bench.WorkerConfig
		adaptCfg     bench.AdaptConfig
		dashboardCfg bench.DashboardConfig
		keysCfg      bench.KeysConfig
		history      bool // bench worker --history: NoHistory's negation
	)
	benchmarks := []benchmark{
		{
			use: "scan", cfg: &scanCfg,
			short: "Due query and whole tick on 1,000,000 sources vs the bare ORDER BY … LIMIT floor",
			flags: func(f *pflag.FlagSet) {
				f.IntVar(&scanCfg.Sources, "sources", bench.DefaultScanSources, "sources to create")
				f.IntSliceVar(&scanCfg.Platforms, "platforms", []int{bench.DefaultScanPlatforms}, "platforms sharing them; several sizes (20,1000,10000) run one after the other, each on fresh data")
				f.IntVar(&scanCfg.CoolingDown, "cooling-down", bench.DefaultScanCoolingDown, "platforms in cooldown (at most all but one)")
				f.IntVar(&scanCfg.Select, "select", bench.DefaultScanSelect, "sources selected by the due query and each tick")
				f.IntVar(&scanCfg.Runs, "runs", bench.DefaultScanRuns, "repetitions of each measurement (ticks: a third, at least 5)")
				f.IntVar(&scanCfg.Keys, "keys", 0, "keys each keyed platform spreads its sources over (0: none); keyed platforms take 1,000/s")
				f.IntVar(&scanCfg.KeyedPlatforms, "keyed-platforms", 0, "how many platforms have --keys keys (0: all); --platforms 1 --keys 100000 is 100,000 keys on one platform")
				f.Float64Var(&scanCfg.KeyRate, "key-rate", bench.DefaultScanKeyRate, "per-key rate of keyed platforms, requests/s")
			},
			zeroIsDefault: []string{"sources", "select", "runs", "key-rate"},
			run: func(ctx context.Context, pool *pgxpool.Pool, _ string) (benchResult, error) {
				scanCfg.Pool, scanCfg.Progress = pool, a.stderr
				return bench.Scan(ctx, scanCfg)
			},
		},
		{
			use: "pacer", cfg: &pacerCfg,
			short: "Reservation latency and throughput vs SELECT 1 and a bare upsert; accuracy of a multi-process fleet",
			long: `Measures, in one run on one database:
  - round trips of SELECT 1 (the floor), a bare single-row upsert of the
    reservation's shape (the physical limit of one row) and a pacer
    reservation at an unlimited rate, one statement each: median and p99
    latency with one caller, throughput with 1, 4 and 16 concurrent callers
    on one platform; beside them, the same reservations with blocks on (the
    pacer's default), which take many slots per statement;
  - accuracy: a ceiling shared by several processes × goroutines for a while:
    delivered rate / ceiling and the largest 1-s window.
Targets: reservation median ≤ 1.5× the bare upsert; throughput at 4 callers
≥ 0.8× the upsert's; delivered/ceiling ≥ 0.97; largest window ≤ ceiling + burst.`,
			flags: func(f *pflag.FlagSet) {
				f.IntVar(&pacerCfg.LatencySamples, "samples", bench.DefaultPacerSamples, "round trips of each kind for the latency figures")
				f.DurationVar(&pacerCfg.ThroughputDuration, "throughput-duration", bench.DefaultPacerThroughputDuration, "length of each throughput measurement")
				f.Float64Var(&pacerCfg.Ceiling, "ceiling", bench.DefaultPacerCeiling, "rate of the accuracy measurement, per second")
				f.IntVar(&pacerCfg.Burst, "burst", bench.DefaultPacerBurst, "burst of the accuracy measurement")
				f.IntVar(&pacerCfg.Processes, "processes", bench.DefaultPacerProcesses, "processes of the accuracy measurement")
				f.IntVar(&pacerCfg.Goroutines, "goroutines", bench.DefaultPacerGoroutines, "goroutines per process of the accuracy measurement")
				f.DurationVar(&pacerCfg.AccuracyDuration, "accuracy-duration", bench.DefaultPacerAccuracyDuration, "length of the accuracy measurement")
			},
			zeroIsDefault: []string{"samples", "throughput-duration", "ceiling", "burst", "processes", "goroutines", "accuracy-duration"},
			run: func(ctx context.Context, _ *pgxpool.Pool, url string) (benchResult, error) {
				self, err := os.Executable()
				if err != nil {
					return nil, err
				}
				pacerCfg.DatabaseURL, pacerCfg.Progress = url, a.stderr
				pacerCfg.Spawn = func(args []string) *exec.Cmd {
					return exec.Command(self, append([]string{"bench", "pacer-child"}, args...)...)
				}
				return bench.Pacer(ctx, pacerCfg)
			},
		},
		{
			use: "fleet", cfg: &fleetCfg,
			short: "The whole path at a ceiling: worker processes, scan, River, pacer, a destination enforcing the ceiling, the database near or far",
			long: `Runs --workers fleetpace worker processes (their scan loops, River, the
pacer, the check recorder) against a fake destination, at each ceiling of
--rates (the platform's burst: --burst), for each rate and each round trip added between the workers and PostgreSQL
(--rtt: a delaying proxy in this process; 0: direct). The destination
answers everything (--enforce: it refuses what exceeds the ceiling, and
every refusal makes the pacer back off). Reports, over the steady part of
each run, what the destination saw: requests/s, goodput (accepted
requests/s ÷ the rate), the largest number of requests in any 1-s window,
refusals; and the scan's supply (jobs queued/s) and the pacer's blocks
(reservations served from blocks, slots discarded).
Targets: the largest window ≤ rate + burst, goodput ≥ 0.95.`,
			flags: func(f *pflag.FlagSet) {
				f.IntVar(&fleetCfg.Workers, "workers", bench.DefaultFleetWorkers, "worker processes")
				f.IntVar(&fleetCfg.Concurrency, "concurrency", bench.DefaultFleetConcurrency, "each worker's --concurrency")
				f.Float64SliceVar(&fleetCfg.Rates, "rates", bench.DefaultFleetRates, "ceilings to run, requests/s")
				f.IntVar(&fleetCfg.Burst, "burst", 0, "the platform's burst (default: rate / 50, at least 1)")
				f.DurationSliceVar(&fleetCfg.RTTs, "rtt", bench.DefaultFleetRTTs, "round trips added between the workers and PostgreSQL (0: direct)")
				f.DurationVar(&fleetCfg.Duration, "duration", bench.DefaultFleetDuration, "length of one run (the first 8 s and the last second are not counted)")
				f.IntVar(&fleetCfg.Runs, "runs", 1, "runs of each rate × round trip; medians are reported")
				f.BoolVar(&fleetCfg.Enforce, "enforce", false, "the destination refuses (429) what exceeds rate + burst (default: it answers everything, and the benchmark counts)")
				f.StringSliceVar(&fleetCfg.WorkerArgs, "worker-arg", nil, "extra worker flag (repeatable), for experiments")
				f.StringVar(&fleetCfg.Dir, "log-dir", "", "keep the workers' logs in this directory (default: a temporary one, removed)")
				f.StringVar(&fleetCfg.Executable, "worker-bin", "", "run the workers from this fleetpace binary (default: this one), to compare builds")
			},
			zeroIsDefault: []string{"workers", "concurrency", "duration", "runs"},
			run: func(ctx context.Context, _ *pgxpool.Pool, url string) (benchResult, error) {
				fleetCfg.DatabaseURL, fleetCfg.Progress, fleetCfg.Logger = url, a.stderr, a.logger
				return bench.Fleet(ctx, fleetCfg)
			},
		},
		{
			use: "soak", cfg: &soakCfg,
			short: "Minutes of sustained load on several platforms: each one's busiest second at the destination, staleness, worker memory",
			long: `Runs --workers fleetpace worker processes for --duration (at least 5 min)
against a fake destination that answers everything, with --platforms
platforms at --rate and --burst each and --sources sources due again every
--interval. Reports, per platform, the largest number of requests the
destination saw in any 1-s window (target: ≤ rate + burst), how late the
most overdue source was (sampled every 10 s after the first minute), and
each worker's resident memory after the first minute and at the end.`,
			flags: func(f *pflag.FlagSet) {
				f.IntVar(&soakCfg.Workers, "workers", bench.DefaultSoakWorkers, "worker processes")
				f.IntVar(&soakCfg.Concurrency, "concurrency", bench.DefaultSoakConcurrency, "each worker's --concurrency")
				f.IntVar(&soakCfg.Platforms, "platforms", bench.DefaultSoakPlatforms, "platforms")
				f.Float64Var(&soakCfg.Rate, "rate", bench.DefaultSoakRate, "every platform's rate, requests/s")
				f.IntVar(&soakCfg.Burst, "burst", bench.DefaultSoakBurst, "every platform's burst")
				f.IntVar(&soakCfg.Sources, "sources", bench.DefaultSoakSources, "sources in all, spread evenly over the platforms")
				f.DurationVar(&soakCfg.Interval, "interval", bench.DefaultSoakInterval, "every source's check interval")
				f.DurationVar(&soakCfg.Duration, "duration", bench.DefaultSoakDuration, "length of the soak (at least 5m)")
				f.StringVar(&soakCfg.Executable, "worker-bin", "", "run the workers from this fleetpace binary (default: this one), to compare builds")
			},
			zeroIsDefault: []string{"workers", "concurrency", "platforms", "rate", "burst", "sources", "interval", "duration"},
			run: func(ctx context.Context, _ *pgxpool.Pool, url string) (benchResult, error) {
				soakCfg.DatabaseURL, soakCfg.Progress, soakCfg.Logger = url, a.stderr, a.logger
				return bench.Soak(ctx, soakCfg)
			},
		},
		{
			use: "worker", cfg: &workerCfg,
			short: "Jobs/s of the whole fleetpace fetch job (no-op fetcher) vs bare River jobs, same workers",
			long: `Measures jobs per second of fleetpace's fetch job as the scan queues it —
pacer reserve and report, the check recorded (written behind the job, with
group commit) — with a no-op fetcher and an effectively unlimited platform
(1e9/s), side by side with bare River jobs whose worker does nothing, on one
database with the same River settings and worker count. Each run inserts
--jobs jobs, starts a client and times until all have completed and, for
fleetpace, every check has been written; the sides alternate for --runs runs
and medians are reported. Target: ratio ≥ 0.9, with the fetch history on.

Each check is recorded with its fetch history row, in the same statement,
as a worker records it; --history=false records the checks alone, to
measure what the history costs. With the history on, the result gives the
history table's size (indexes included) per million checks. The checks'
commits are made with synchronous_commit off, as a worker's are by
default; --recorder-sync-commit measures them with the server's setting (a
worker's --recorder-sync-commit). (The throwaway embedded cluster has
synchronous_commit off: measure that on a durable database.)

--fetch-cooldown defaults to River's minimum (1ms): with River's default
(100ms) both sides are capped at --workers jobs per 100 ms and the ratio says
nothing about the cost of a job.`,
			jsonHelp: "print one JSON object (fleetpace_jobs_per_sec, river_jobs_per_sec, ratio, workers, …)",
			flags: func(f *pflag.FlagSet) {
				f.IntVar(&workerCfg.Workers, "workers", bench.DefaultWorkerWorkers, "River workers (MaxWorkers) of both clients, like the worker's --concurrency")
				f.IntVar(&workerCfg.Jobs, "jobs", bench.DefaultWorkerJobs, "jobs per run")
				f.IntVar(&workerCfg.Runs, "runs", bench.DefaultWorkerRuns, "runs of each side (alternating); medians are reported")
				f.DurationVar(&workerCfg.FetchCooldown, "fetch-cooldown", bench.DefaultWorkerFetchCooldown, "River FetchCooldown of both clients (River's minimum; its default 100ms would cap both sides)")
				f.BoolVar(&history, "history", true, "record each check with its fetch history row, as a worker does (false: the checks alone)")
				f.BoolVar(&workerCfg.RecorderSyncCommit, "recorder-sync-commit", false, "record the checks with the server's synchronous_commit, as a worker's --recorder-sync-commit (default: off, as a worker)")
				f.Var(invertedBool{&workerCfg.RecorderSyncCommit}, "recorder-async-commit", "records the checks with synchronous_commit off (the default now)")
				f.Lookup("recorder-async-commit").NoOptDefVal = "true"
				_ = f.MarkDeprecated("recorder-async-commit", "it is the default; --recorder-sync-commit measures the server's setting")
			},
			zeroIsDefault: []string{"workers", "jobs", "runs", "fetch-cooldown"},
			run: func(ctx context.Context, _ *pgxpool.Pool, url string) (benchResult, error) {
				workerCfg.DatabaseURL, workerCfg.Progress, workerCfg.Logger = url, a.stderr, a.logger
				workerCfg.NoHistory = !history
				return bench.Worker(ctx, workerCfg)
			},
		},
		{
			use: "adapt", cfg: &adaptCfg,
			short: "Goodput and 429s of adaptive pacing against destinations that allow less than the ceiling, side by side with the classic schedule, the AWS SDKs' adaptive mode and an oracle",
			long: `Runs real worker processes (this binary) against destinations that allow less
than the configured ceiling, one run per destination model, with one
platform per schedule side by side, each on a destination of its own:

  default  a new platform's settings (--adapt estimate)
  classic  the classic multiplicative schedule (--adapt multiplier, ×2, ÷2
           per 100 clean, no probing, no headers, no re-spacing)
  aws      the AWS SDKs' adaptive retry mode in each process on its own (a
           token bucket whose rate follows CUBIC over the measured send
           rate), each process capped at ceiling ÷ processes
  oracle   each process paced at 0.97 × allowance ÷ processes (3 % for
           jitter), the processes in turn, no adaptation, a caller for
           every slot (its platform has as many sources per worker as the
           others have in all: River hands jobs to processes unevenly):
           the physical reference

Models (fake destinations; --models takes names or patterns such as
'window*'): token buckets (strict-40, strict-70, bucket10-50, with
X-RateLimit-* as -xrl, bucket10-50-ietf, strict-40-ietf); fixed windows
of 1 s, 10 s and 60 s at 1/3 and 1/10 of the ceiling (window1s-33,
window10s-10, …, the 1-s and 60-s ones at 50 %, and window5s-33), each
also with -xrl and -ietf headers; strict-nginx-40 (nginx's limit_req, no
Retry-After; -ietf announces it as q=8;w=1); sliding10s-33 (a sliding
log); drop-80-30 (and -xrl), rise-40-80 and drop-80-40 (the limit moves
a third into the run).

--nginx runs the models nginx-RATE (limit_req rate=RATEr/s, limit_req_status
429, no burst) and nginx-RATE-burst5 (burst=5 nodelay) against a real nginx
the benchmark starts (one limit_req zone per schedule, static files with
their ETag and Last-Modified), judged from nginx's access log.

Per row, medians of --runs: goodput (accepted over allowed) over seconds
10–70 and over the last half, the share of 429s from second 10 to the end and
in the last half, when goodput first holds ≥ 0.85 for 5 s, the largest 1-s
window (never above ceiling + burst), for rise models how soon goodput holds
≥ 0.85 of the new limit and for drop models how soon the 429s stop; every
run's figures with --json. The default schedule's rows name the targets
they miss. The machine's load average is printed with the table.

--sweep decay runs the multiplier with decay_after 10, 30, 100, 300, 1000;
--sweep factors the backoff × recovery factors; both on the models without
headers.`,
			jsonHelp: "print JSON",
			check: func(cmd *cobra.Command) error {
				if cmd.Flags().Changed("nginx-rate") && !adaptCfg.Nginx {
					return usagef("--nginx-rate: only with --nginx")
				}
				return nil
			},
			flags: func(f *pflag.FlagSet) {
				f.IntVar(&adaptCfg.Workers, "workers", bench.DefaultAdaptWorkers, "worker processes")
				f.IntVar(&adaptCfg.Concurrency, "concurrency", 0, "each worker's --concurrency (default: enough for every platform's jobs to sleep on the pacer at once)")
				f.Float64Var(&adaptCfg.Ceiling, "ceiling", bench.DefaultAdaptCeiling, "every platform's rate, requests/s")
				f.DurationVar(&adaptCfg.Duration, "duration", bench.DefaultAdaptDuration, "one run of a model (a window longer than 1 s runs 4.5 windows at least)")
				f.IntVar(&adaptCfg.Runs, "runs", bench.DefaultAdaptRuns, "runs; every figure is the median")
				f.StringSliceVar(&adaptCfg.Models, "models", nil, "destination models to run, names or patterns such as 'window*' (default: all; an unknown name lists them)")
				f.StringVar(&adaptCfg.Sweep, "sweep", "", "decay or factors: sweep the multiplier's settings instead of the four schedules")
				f.BoolVar(&adaptCfg.Nginx, "nginx", false, "run against a real nginx the benchmark starts (models nginx-RATE and nginx-RATE-burst5)")
				f.IntVar(&adaptCfg.NginxRate, "nginx-rate", bench.DefaultAdaptNginxRate, "with --nginx: limit_req rate, requests/s")
			},
			zeroIsDefault: []string{"workers", "ceiling", "duration", "runs", "nginx-rate"},
			run: func(ctx context.Context, _ *pgxpool.Pool, url string) (benchResult, error) {
				adaptCfg.DatabaseURL, adaptCfg.Progress, adaptCfg.Logger = url, a.stderr, a.logger
				return bench.Adapt(ctx, adaptCfg)
			},
		},
		{
			use: "dashboard", cfg: &dashboardCfg,
			short: "Server time of each dashboard page on 1,000,000 sources and 10,000 platforms",
			long: `Fill a throwaway database with the scan benchmark's data set (--sources
spread evenly over --platforms, about 10 % due, 0.5 % queued, two platforms
cooling down, 1 % failing) and serve each dashboard page --runs times
through the handler a worker serves, reporting the time of its SQL and of
the whole answer (Server-Timing), median and 95th percentile. Target: the
overview's SQL under 100 ms on 10,000 platforms and 1,000,000 sources. With
--platforms 20 it is the scan benchmark's own data set.`,
			flags: func(f *pflag.FlagSet) {
				f.IntVar(&dashboardCfg.Sources, "sources", bench.DefaultDashboardSources, "sources to create")
				f.IntVar(&dashboardCfg.Platforms, "platforms", bench.DefaultDashboardPlatforms, "platforms sharing them")
				f.IntVar(&dashboardCfg.Runs, "runs", bench.DefaultDashboardRuns, "times each page is served")
			},
			zeroIsDefault: []string{"sources", "platforms", "runs"},
			run: func(ctx context.Context, pool *pgxpool.Pool, _ string) (benchResult, error) {
				dashboardCfg.Pool, dashboardCfg.Progress = pool, a.stderr
				return bench.Dashboard(ctx, dashboardCfg)
			},
		},
		{
			use: "keys", cfg: &keysCfg,
			short: "Nested limits: reservations of a key + its platform vs the platform alone, idle key rows, the whole path with thousands of keys",
			long: `Measures, side by side in one run:

  - reservations of a key and its platform (one statement) against
    reservations of the platform alone: p50 of one caller and throughput of
    --callers, medians of --runs (targets: p50 ≤ 1.3 ×, throughput ≥ 0.8 ×);
  - idle key rows: the database's bytes per 1,000 (--idle-keys rows made
    as first uses make them), and their pruning with an idle expiry of
    --idle as the scan tick prunes (none before it; all soon after);
  - the whole path: --workers worker processes, --keys keys at --key-rate
    (burst 1) under a platform at --rate, for --duration (targets: ≥ 0.95 ×
    the smaller of the platform's rate and the keys' together (--keys ×
    --key-rate) delivered, no 1-s window over rate + burst, and no key over
    its rate + burst in any 1-s window at the destination);
    --skip-path leaves it out.

It prints the machine's load average: on a busy machine the figures are
not comparable.`,
			flags: func(f *pflag.FlagSet) {
				f.IntVar(&keysCfg.Runs, "runs", bench.DefaultKeysRuns, "runs of the reservation measurements; medians are reported")
				f.IntVar(&keysCfg.Samples, "samples", bench.DefaultKeysSamples, "round trips of each kind per run for the p50")
				f.DurationVar(&keysCfg.ThroughputDuration, "throughput-duration", bench.DefaultKeysThroughput, "length of each throughput measurement")
				f.IntVar(&keysCfg.Callers, "callers", bench.DefaultKeysCallers, "concurrent callers of the throughput measurement")
				f.IntVar(&keysCfg.IdleKeys, "idle-keys", bench.DefaultKeysIdleKeys, "key rows made for the memory measurement")
				f.DurationVar(&keysCfg.Idle, "idle", bench.DefaultKeysIdle, "idle expiry the key rows are pruned with (the scan tick's is 10m)")
				f.IntVar(&keysCfg.Workers, "workers", bench.DefaultKeysWorkers, "worker processes of the whole path")
				f.IntVar(&keysCfg.Concurrency, "concurrency", bench.DefaultKeysConcurrency, "each worker's --concurrency")
				f.IntVar(&keysCfg.Keys, "keys", bench.DefaultKeysKeys, "keys of the whole path")
				f.Float64Var(&keysCfg.KeyRate, "key-rate", bench.DefaultKeysKeyRate, "each key's rate, requests/s (burst 1)")
				f.Float64Var(&keysCfg.Rate, "rate", bench.DefaultKeysRate, "the platform's rate, requests/s (burst rate / 50)")
				f.DurationVar(&keysCfg.Duration, "duration", bench.DefaultKeysDuration, "length of the whole path (the first 8 s and the last second are not counted)")
				f.BoolVar(&keysCfg.SkipPath, "skip-path", false, "leave the whole path out")
				f.StringVar(&keysCfg.Executable, "worker-bin", "", "run the workers from this fleetpace binary (default: this one)")
			},
			zeroIsDefault: []string{"runs", "samples", "throughput-duration", "callers", "idle-keys", "idle", "workers", "concurrency", "keys", "key-rate", "rate", "duration"},
			run: func(ctx context.Context, _ *pgxpool.Pool, url string) (benchResult, error) {
				keysCfg.DatabaseURL, keysCfg.Progress, keysCfg.Logger = url, a.stderr, a.logger
				return bench.Keys(ctx, keysCfg)
			},
		},
	}
	cmds := []*cobra.Command{a.benchPacerChildCmd()}
	for _, b := range benchmarks {
		cmds = append(cmds, a.benchCommand(b))
	}
	return cmds
}

func (a *app) benchPacerChildCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "pacer-child",
		Hidden:             true,
		DisableFlagParsing: true,
		PersistentPreRunE:  func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.PacerChild(cmd.Context(), args, a.stdout)
		},
	}
}

// startCPUProfile starts Go's CPU profiler writing to path (created or
// truncated) and returns what stops it and closes the file.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, usagef("--cpu-profile %s: %w", path, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}
