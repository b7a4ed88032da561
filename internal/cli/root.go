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
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/sources"
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
	quiet          bool

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
	fmt.Fprintf(stderr, "fleetpace: %s\n", dbconn.Redact(err.Error()))
	if code == ExitUsage && isFlagError(err) {
		fmt.Fprintln(stderr, "Run 'fleetpace --help' for usage.")
	}
	return code
}

func exitCode(err error) int {
	var ue *usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, sources.ErrInvalid), errors.Is(err, dbconn.ErrInvalidURL),
		errors.Is(err, pgembed.ErrBinariesNotFound), isFlagError(err):
		return ExitUsage
	}
	return ExitFailure
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
			return a.setup()
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &flagError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.databaseURL, "database-url", "", "PostgreSQL URL; empty: the embedded cluster under --data-dir")
	pf.StringVar(&a.dataDir, "data-dir", defaultDataDir(), "directory of the embedded PostgreSQL cluster used when no database URL is given")
	pf.StringVar(&a.logFormat, "log-format", "text", "log format: text or json")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pf.DurationVar(&a.connectTimeout, "connect-timeout", dbconn.DefaultConnectTimeout, "bound on one database connection attempt (fleetpace never retries a connection)")
	pf.BoolVarP(&a.quiet, "quiet", "q", false, "do not print which database is used")

	root.AddCommand(
		a.schemaCmd(),
		a.platformsCmd(),
		a.sourcesCmd(),
		a.scanCmd(),
		a.enqueueCmd(),
		a.drainCmd(),
		a.statusCmd(),
		a.embeddedCmd(),
	)
	for _, c := range a.extraCommands() {
		root.AddCommand(c)
	}
	a.addVersion(root)
	bindEnv(root) // last: the whole tree
	return root
}

// extraCommands are registered by other files of the package (worker, demo,
// bench) through init-time hooks.
var extraCommandHooks []func(*app) *cobra.Command

func (a *app) extraCommands() []*cobra.Command {
	out := make([]*cobra.Command, 0, len(extraCommandHooks))
	for _, h := range extraCommandHooks {
		out = append(out, h(a))
	}
	return out
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

func (a *app) setup() error {
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
	if a.connectTimeout <= 0 {
		return usagef("--connect-timeout: must be > 0, got %s", a.connectTimeout)
	}
	return nil
}

// resolveURL returns the database URL to use: the given one, or the embedded
// cluster's (started if needed, schema applied).
func (a *app) resolveURL(ctx context.Context) (string, error) {
	if a.databaseURL != "" {
		if _, err := dbconn.PoolConfig(dbconn.Config{URL: a.databaseURL}); err != nil {
			return "", err
		}
		a.announce("using database %s", dbconn.Describe(a.databaseURL))
		return a.databaseURL, nil
	}
	c, err := pgembed.EnsureShared(ctx, a.dataDir, pgembed.Config{Logger: a.logger})
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

// pool opens a fail-fast pool on the database to use.
func (a *app) pool(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	url, err := a.resolveURL(ctx)
	if err != nil {
		return nil, err
	}
	return dbconn.NewPool(ctx, dbconn.Config{URL: url, ConnectTimeout: a.connectTimeout, MaxConns: maxConns})
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
