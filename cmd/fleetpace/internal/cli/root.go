// Package cli is the fleetpace command line: a cobra command tree over the
// library packages. cmd/fleetpace only calls Main.
//
// Exit codes: 0 success, 1 runtime failure (database unreachable, …), 2 bad
// usage or invalid input. Errors name the offending field, line or value;
// passwords in database URLs are never printed.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/bench"
	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/demo"
	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// usageError marks an error as bad usage or bad input (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// app holds the global flags and what commands share.
type app struct {
	stdout, stderr io.Writer

	databaseURL    string
	dataDir        string
	logFormat      string
	logLevel       string
	connectTimeout time.Duration
	pooler         string
	quiet          bool
	secretParams   []string

	logger *slog.Logger
}

// Main runs the command line and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	code := exitCode(err)
	fmt.Fprintf(stderr, "fleetpace: %s\n", redact.Text(flagMessage(err)))
	if code == ExitUsage && isFlagError(err) {
		fmt.Fprintln(stderr, "Run 'fleetpace --help' for usage.")
	}
	return code
}

func exitCode(err error) int {
	var ue *usageError
	switch {
	case errors.As(err, &ue), isFlagError(err), errors.Is(err, pgembed.ErrBinariesNotFound),
		errors.Is(err, redact.ErrInvalidDatabaseURL), errors.Is(err, dbconn.ErrInvalidConfig), errors.Is(err, pgembed.ErrInvalidDataDir),
		errors.Is(err, sources.ErrInvalid), errors.Is(err, scan.ErrInvalidConfig),
		errors.Is(err, queue.ErrInvalidConfig), errors.Is(err, poller.ErrInvalidConfig),
		errors.Is(err, fetch.ErrInvalidConfig), errors.Is(err, worker.ErrInvalidConfig),
		errors.Is(err, bench.ErrInvalidConfig), errors.Is(err, demo.ErrInvalidConfig),
		errors.Is(err, dashboard.ErrInvalidConfig):
		return ExitUsage
	}
	return ExitFailure
}

// flagNames maps the configuration fields the command line sets from its
// flags, as the libraries' validation errors name them, to those flags: the
// libraries validate, and the command line says which flag was wrong.
var flagNames = map[string]string{
	"dbconn.Config.ConnectTimeout":         "--connect-timeout",
	"worker.Config.Concurrency":            "--concurrency",
	"queue.Config.MaxWorkers":              "--concurrency",
	"queue.Config.JobTimeout":              "--job-timeout",
	"queue.Config.RescueAfter":             "--rescue-after",
	"queue.Config.SoftStopTimeout":         "--soft-stop",
	"worker.Config.SoftStop":               "--soft-stop",
	"worker.Config.MaxWait":                "--max-pacer-wait",
	"worker.Config.LeaseTTL":               "--lease-ttl",
	"worker.Config.ListenIdle":             "--listen-idle",
	"worker.Config.MinFleetSize":           "--min-fleet-size",
	"worker.Config.Heartbeat":              "--heartbeat",
	"worker.Config.MaxConns":               "--max-conns",
	"worker.Config.HTTPAddr":               "--http-addr",
	"worker.Config.AdminToken":             "--admin-token",
	"worker.Config.AllowedHosts":           "--allowed-host",
	"dashboard.Config.AdminToken":          "--admin-token",
	"dashboard.Config.AllowedHosts":        "--allowed-host",
	"worker.Config.Pooler":                 "--pooler",
	"poller.Config.Base":                   "--poll-base",
	"poller.Config.Max":                    "--poll-max",
	"poller.Config.JitterRatio":            "--poll-jitter",
	"poller.Config.StartupJitter":          "--startup-jitter",
	"fetch.HTTPConfig.Timeout":             "--fetch-timeout",
	"fetch.HTTPConfig.MaxBodyBytes":        "--max-body-bytes",
	"fetch.HTTPConfig.MaxRedirects":        "--max-redirects",
	"fetch.HTTPConfig.RateLimitedAfter":    "--rate-limited-after",
	"scan.Config.Limit":                    "--limit",
	"scan.Config.PerPlatformCap":           "--per-platform-cap",
	"scan.Config.LookAhead":                "--look-ahead",
	"scan.Config.HistoryRetention":         "--history-retention",
	"queue.DrainConfig.MaxDuration":        "--max-duration",
	"bench.ScanConfig.Sources":             "--sources",
	"bench.ScanConfig.Platforms":           "--platforms",
	"bench.ScanConfig.CoolingDown":         "--cooling-down",
	"bench.ScanConfig.Select":              "--select",
	"bench.ScanConfig.Runs":                "--runs",
	"bench.ScanConfig.Keys":                "--keys",
	"bench.ScanConfig.KeyedPlatforms":      "--keyed-platforms",
	"bench.ScanConfig.KeyRate":             "--key-rate",
	"bench.FleetConfig.Workers":            "--workers",
	"bench.FleetConfig.Concurrency":        "--concurrency",
	"bench.FleetConfig.Rates":              "--rates",
	"bench.FleetConfig.Burst":              "--burst",
	"bench.FleetConfig.RTTs":               "--rtt",
	"bench.FleetConfig.Duration":           "--duration",
	"bench.FleetConfig.Runs":               "--runs",
	"bench.SoakConfig.Workers":             "--workers",
	"bench.SoakConfig.Concurrency":         "--concurrency",
	"bench.SoakConfig.Platforms":           "--platforms",
	"bench.SoakConfig.Rate":                "--rate",
	"bench.SoakConfig.Burst":               "--burst",
	"bench.SoakConfig.Sources":             "--sources",
	"bench.SoakConfig.Interval":            "--interval",
	"bench.SoakConfig.Duration":            "--duration",
	"bench.PacerConfig.LatencySamples":     "--samples",
	"bench.PacerConfig.ThroughputDuration": "--throughput-duration",
	"bench.PacerConfig.Ceiling":            "--ceiling",
	"bench.PacerConfig.Burst":              "--burst",
	"bench.PacerConfig.Processes":          "--processes",
	"bench.PacerConfig.Goroutines":         "--goroutines",
	"bench.PacerConfig.AccuracyDuration":   "--accuracy-duration",
	"bench.WorkerConfig.Workers":           "--workers",
	"bench.WorkerConfig.Jobs":              "--jobs",
	"bench.WorkerConfig.Runs":              "--runs",
	"bench.WorkerConfig.FetchCooldown":     "--fetch-cooldown",
	"bench.DashboardConfig.Sources":        "--sources",
	"bench.DashboardConfig.Platforms":      "--platforms",
	"bench.DashboardConfig.Runs":           "--runs",
	"demo.Config.Workers":                  "--workers",
	"demo.Config.Duration":                 "--duration",
	"demo.Config.Sources":                  "--sources",
	"demo.Config.ChartPath":                "--chart",
}

// fieldName matches a configuration field as the libraries name it in
// their errors: package.Type.Field.
var fieldName = regexp.MustCompile(`\b[a-z]+\.[A-Z][A-Za-z]*\.[A-Z][A-Za-z]*\b`)

// flagMessage is err's message with every configuration field the command
// line sets from a flag named by that flag.
func flagMessage(err error) string {
	return fieldName.ReplaceAllStringFunc(err.Error(), func(field string) string {
		if flag, ok := flagNames[field]; ok {
			return flag
		}
		return field
	})
}

// renameField renames the field of a sources.FieldError in err to the flag
// or argument it came from (fields maps one to the other); other errors are
// returned as they are.
func renameField(err error, fields map[string]string) error {
	var fe *sources.FieldError
	if errors.As(err, &fe) {
		if name, ok := fields[fe.Field]; ok {
			renamed := *fe
			renamed.Field = name
			return &renamed
		}
	}
	return err
}

// annotationZeroIsDefault marks a flag whose library field reads 0 as "the
// default" (see zeroIsDefault).
const annotationZeroIsDefault = "fleetpace_zero_is_default"

// zeroIsDefault marks flags whose value goes to a library field that reads 0
// (or "") as "use the default": given explicitly, 0 would quietly mean the
// default, so the command line refuses it (exit 2) instead
// (checkZeroFlags).
func zeroIsDefault(f *pflag.FlagSet, names ...string) {
	for _, name := range names {
		if err := f.SetAnnotation(name, annotationZeroIsDefault, []string{"true"}); err != nil {
			panic("cli: " + err.Error()) // a flag name of this package is wrong
		}
	}
}

// checkZeroFlags refuses an explicit 0 for the flags zeroIsDefault marked.
func checkZeroFlags(cmd *cobra.Command) error {
	var err error
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if v := f.Value.String(); err == nil && f.Annotations[annotationZeroIsDefault] != nil && (v == "0" || v == "0s" || v == "") {
			err = usagef("--%s: must not be 0 (leave the flag out for the default, %s)", f.Name, f.DefValue)
		}
	})
	return err
}

// flagError wraps cobra's argument and flag errors.
type flagError struct{ err error }

func (e *flagError) Error() string { return e.err.Error() }
func (e *flagError) Unwrap() error { return e.err }

func isFlagError(err error) bool {
	var fe *flagError
	return errors.As(err, &fe) || strings.HasPrefix(err.Error(), "unknown command") ||
		strings.HasPrefix(err.Error(), "unknown flag") || strings.HasPrefix(err.Error(), "unknown shorthand flag")
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "fleetpace",
		Short: "Poll many sources from a fleet of workers without exceeding any destination's rate",
		Long: `fleetpace polls many sources (feeds, API accounts, URLs) from a fleet of worker
processes that share one view of how fast each destination may be hit, how
hard it is pushing back and which platforms are cooling down. It runs on
PostgreSQL and River.

Without --database-url or DATABASE_URL, fleetpace uses a local embedded
PostgreSQL cluster under --data-dir, started on first use.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return a.setup(cmd)
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &flagError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "PostgreSQL URL; empty: the embedded cluster under --data-dir")
	pf.StringVar(&a.dataDir, "data-dir", defaultDataDir(), "directory of the embedded PostgreSQL cluster used when no database URL is given")
	pf.StringVar(&a.logFormat, "log-format", "text", "log format: text or json")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.DurationVar(&a.connectTimeout, "connect-timeout", dbconn.DefaultConnectTimeout, "bound on one database connection attempt (fleetpace never retries a connection)")
	pf.StringVar(&a.pooler, "pooler", string(dbconn.PoolerAuto), "what --database-url leads to: auto (one connection tells), none (PostgreSQL), transaction (a pooler in transaction mode, e.g. PgBouncer: pooler-safe statements, no LISTEN)")
	pf.BoolVarP(&a.quiet, "quiet", "q", false, "do not print which database is used")
	pf.StringSliceVar(&a.secretParams, "secret-params", redact.DefaultSecretParams, "query parameters whose values are hidden wherever a URL is shown (pages, logs, output; such sources are queued by id alone), matched in any case, also after a _ or - (token hides github_token): the whole list, comma-separated (empty: none)")
	zeroIsDefault(pf, "connect-timeout")

	// The whole command tree, in one place.
	root.AddCommand(
		a.schemaCmd(),
		a.platformsCmd(),
		a.cooldownsCmd(),
		a.sourcesCmd(),
		a.keysCmd(),
		a.scanCmd(),
		a.enqueueCmd(),
		a.drainCmd(),
		a.statusCmd(),
		a.workerCmd(),
		a.dashboardCmd(),
		a.embeddedCmd(),
		a.demoCmd(),
		a.simulateCmd(),
		a.benchCmd(a.benchCmds()...),
	)
	a.addVersion(root)
	refuseUnknownSubcommands(root)
	refuseUnknownHelpTopics(root)
	bindEnv(root) // last: the whole tree
	return root
}

// refuseUnknownHelpTopics makes `fleetpace help NAME` for a command that
// does not exist bad usage (exit 2), as running it would be; cobra prints
// "Unknown help topic" and succeeds.
func refuseUnknownHelpTopics(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	for _, c := range root.Commands() {
		if c.Name() != "help" || c.Run == nil {
			continue
		}
		show := c.Run
		c.Run = nil
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if target, rest, err := root.Find(args); err != nil || target == nil || len(rest) > 0 {
				return &flagError{fmt.Errorf("unknown help topic %q", strings.Join(args, " "))}
			}
			show(cmd, args)
			return nil
		}
	}
}

// refuseUnknownSubcommands makes every command that only groups others
// (platforms, sources, bench, …) refuse an unknown subcommand as bad usage
// (exit 2), with cobra's suggestions; cobra's own behaviour is to print the
// group's help and succeed. A group given no subcommand prints its help.
func refuseUnknownSubcommands(c *cobra.Command) {
	for _, sub := range c.Commands() {
		refuseUnknownSubcommands(sub)
	}
	if !c.HasSubCommands() || c.Runnable() || !c.HasParent() {
		return // the root refuses unknown commands itself
	}
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return cmd.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if cmd.SuggestionsMinimumDistance <= 0 {
			cmd.SuggestionsMinimumDistance = 2 // cobra sets it on the root only
		}
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
		}
		var names []string
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() {
				names = append(names, sub.Name())
			}
		}
		return &flagError{fmt.Errorf("%s\n%s has: %s", msg, cmd.CommandPath(), strings.Join(names, ", "))}
	}
}

// defaultDataDir is $XDG_DATA_HOME/fleetpace, else ~/.local/share/fleetpace;
// as root /var/lib/fleetpace, because the server then runs as the postgres
// user, which cannot enter /root.
func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/fleetpace"
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "fleetpace")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "fleetpace")
	}
	return filepath.Join(os.TempDir(), "fleetpace")
}

// setup checks the flags the libraries cannot (checkZeroFlags) and the
// global ones, and builds the logger.
func (a *app) setup(cmd *cobra.Command) error {
	if err := checkZeroFlags(cmd); err != nil {
		return err
	}
	if err := redact.SetSecretParams(a.secretParams); err != nil {
		return usagef("--secret-params: %v", err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return usagef("--log-level: %q is not one of debug, info, warn, error", a.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch a.logFormat {
	case "text":
		a.logger = slog.New(slog.NewTextHandler(a.stderr, opts))
	case "json":
		a.logger = slog.New(slog.NewJSONHandler(a.stderr, opts))
	default:
		return usagef("--log-format: %q is not one of text, json", a.logFormat)
	}
	if _, err := dbconn.ParsePooler(a.pooler); err != nil || a.pooler == "" {
		return usagef("--pooler: %q is not one of auto, none, transaction", a.pooler)
	}
	return dbconn.Config{ConnectTimeout: a.connectTimeout}.Validate()
}

// poolerFor is the --pooler mode for url: the embedded cluster is
// PostgreSQL itself.
func (a *app) poolerFor(url string) dbconn.Pooler {
	if a.databaseURL == "" || url != a.databaseURL {
		return dbconn.PoolerNone
	}
	return dbconn.Pooler(a.pooler)
}

// resolveURL returns the database URL to use: the given one, or the embedded
// cluster's (started if needed, schema applied).
func (a *app) resolveURL(ctx context.Context) (string, error) {
	if a.databaseURL != "" {
		if _, err := dbconn.PoolConfig(dbconn.Config{URL: a.databaseURL}); err != nil {
			return "", err
		}
		a.announce("using database %s", redact.DescribeDatabase(a.databaseURL))
		return a.databaseURL, nil
	}
	return a.embeddedURL(ctx)
}

// embeddedURL returns the URL of the embedded cluster's database under
// --data-dir, starting the cluster if needed and applying the schema.
func (a *app) embeddedURL(ctx context.Context) (string, error) {
	if a.dataDir == "" {
		return "", usagef("--data-dir must not be empty")
	}
	c, err := pgembed.EnsureShared(ctx, a.dataDir, pgembed.Config{Logger: a.logger})
	if errors.Is(err, pgembed.ErrInvalidDataDir) {
		return "", &usageError{fmt.Errorf("--data-dir %s: %w", a.dataDir, err)}
	}
	if err != nil {
		return "", fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	url := c.URL(pgembed.DatabaseName)
	a.announce("using embedded PostgreSQL in %s (127.0.0.1:%d)", a.dataDir, c.Port())
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: url, ConnectTimeout: a.connectTimeout, MaxConns: 2})
	if err != nil {
		return "", err
	}
	defer pool.Close()
	if _, err := fleetpace.Apply(ctx, pool, nil); err != nil {
		return "", err
	}
	return url, nil
}

func (a *app) announce(format string, args ...any) {
	if a.quiet {
		return
	}
	fmt.Fprintf(a.stderr, "fleetpace: "+format+"\n", args...)
}

// pool opens a fail-fast pool on the database to use, pooler-safe when
// --pooler says (or, auto, one connection finds) that it is behind a
// transaction pooler.
func (a *app) pool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	url, err := a.resolveURL(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := dbconn.ResolvePooler(ctx, dbconn.Config{URL: url, ConnectTimeout: a.connectTimeout, MaxConns: maxConns,
		Pooler: a.poolerFor(url)})
	if err != nil {
		return nil, err
	}
	return dbconn.NewPool(ctx, cfg)
}

// dbError turns database errors into messages a user can act on.
func dbError(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("%w\nhint: the fleetpace schema is missing; run `fleetpace schema apply`", err)
	}
	if dbconn.IsUnavailable(err) {
		return fmt.Errorf("database unreachable (one attempt, no retry): %w", err)
	}
	return err
}

// withPool runs fn with a small pool on the command's database; failing to
// reach the database is a database error (exit 1).
func (a *app) withPool(ctx context.Context, fn func(*pgxpool.Pool) error) error {
	pool, err := a.pool(ctx, 2)
	if err != nil {
		return dbError(err)
	}
	defer pool.Close()
	return fn(pool)
}
