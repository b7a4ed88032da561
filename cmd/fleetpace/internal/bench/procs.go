package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/sourcefile"
)

// open opens what a benchmark of worker processes needs: its working
// directory (p.Dir, or a temporary one named after name that release
// removes) and a small pool on p.DatabaseURL for its own queries. release
// closes and removes what open made.
func (p *Processes) open(ctx context.Context, name string) (string, *pgxpool.Pool, func(), error) {
	dir, tmp := p.Dir, ""
	if dir == "" {
		d, err := os.MkdirTemp("", "fleetpace-bench-"+name+"-")
		if err != nil {
			return "", nil, nil, err
		}
		dir, tmp = d, d
	}
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: p.DatabaseURL, MaxConns: 4})
	if err != nil {
		if tmp != "" {
			os.RemoveAll(tmp)
		}
		return "", nil, nil, err
	}
	return dir, pool, func() {
		pool.Close()
		if tmp != "" {
			os.RemoveAll(tmp)
		}
	}, nil
}

// badField makes the error of a bad field of a configuration from its
// message (format and args).
type badField func(format string, args ...any) error

// invalidField is the error of a bad field of the configuration typ:
// "bench.typ." and format, wrapping ErrInvalidConfig.
func invalidField(typ string) badField {
	return func(format string, args ...any) error {
		return fmt.Errorf("%w: bench.%s.%s", ErrInvalidConfig, typ, fmt.Sprintf(format, args...))
	}
}

// Processes configures what every benchmark of worker processes (adapt,
// fleet, keys, soak) runs and where it reports; their configurations
// embed it, and name their own defaults of Workers and Concurrency.
type Processes struct {
	// DatabaseURL is a scratch database with the schema applied: the
	// benchmark empties fleetpace's tables and River's jobs. Required.
	DatabaseURL string
	// Executable is the fleetpace binary the workers run. Default: this
	// process's own executable.
	Executable string
	// Workers is how many worker processes, Concurrency each one's
	// --concurrency.
	Workers     int
	Concurrency int
	// Dir receives the workers' logs. Default: a temporary directory,
	// removed afterwards.
	Dir string
	// Progress receives the benchmark's progress lines. Default: none.
	Progress io.Writer
	// Logger. Default: discard.
	Logger *slog.Logger
}

// setDefaults fills in the benchmark's defaults of workers at concurrency
// each, and what the benchmarks share: the workers run this binary unless
// told otherwise, and progress and logs go nowhere. kind names the
// configuration in an error.
func (p *Processes) setDefaults(kind string, workers, concurrency int) error {
	p.Workers = cmp.Or(p.Workers, workers)
	p.Concurrency = cmp.Or(p.Concurrency, concurrency)
	if p.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench: %s.Executable: %w", kind, err)
		}
		p.Executable = exe
	}
	p.Progress = cmp.Or(p.Progress, io.Discard)
	p.Logger = cmp.Or(p.Logger, slog.New(slog.DiscardHandler))
	return nil
}

// check validates the configuration kind of a benchmark of worker
// processes, p its Processes: it applies kind's defaults (setDefaults),
// checks what every such benchmark has — 1–32 workers of 1–10,000 jobs
// each — and then the benchmark's own fields (own, given the error maker
// of kind's fields).
func (p *Processes) check(kind string, setDefaults func() error, own func(bad badField) error) error {
	if err := setDefaults(); err != nil {
		return err
	}
	bad := invalidField(kind)
	switch {
	case p.Workers < 1 || p.Workers > 32:
		return bad("Workers must be in [1, 32], got %d", p.Workers)
	case p.Concurrency < 1 || p.Concurrency > 10_000:
		return bad("Concurrency must be in [1, 10000], got %d", p.Concurrency)
	}
	return own(bad)
}

// emptyTables empties fleetpace's tables and River's for a run of worker
// processes (CASCADE: and the tables that refer to them, the keys' limits
// among them).
func emptyTables(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `TRUNCATE fleetpace_source, fleetpace_cooldown, fleetpace_pace, fleetpace_platform, fleetpace_worker, river_job, river_leader CASCADE`); err != nil {
		return fmt.Errorf("empty the tables: %w", err)
	}
	return nil
}

// startDest starts a fake destination with rules (nil: every path answers
// 200 at any rate).
func startDest(logger *slog.Logger, rules map[string]fakedest.Rule) (*fakedest.Server, error) {
	dest, err := fakedest.New(fakedest.Config{Logger: logger, Rules: rules})
	if err != nil {
		return nil, err
	}
	if err := dest.Start(); err != nil {
		return nil, err
	}
	return dest, nil
}

// importCSV imports the sources of a CSV file (with its header line).
func importCSV(ctx context.Context, pool *pgxpool.Pool, csv string) error {
	_, err := sourcefile.Import(ctx, pool, strings.NewReader(csv), sourcefile.Options{Format: sourcefile.FormatCSV})
	return err
}

// workerArgs are the flags of a benchmark's worker processes: on url,
// quiet but for logLevel, free to fetch from the local fake destination,
// serving HTTP on httpAddr, starting at once.
func workerArgs(url, logLevel, httpAddr string, concurrency int) []string {
	return []string{"worker", "--database-url", url, "-q", "--log-level", logLevel,
		"--allow-private-networks", "--http-addr", httpAddr, "--startup-jitter", "0",
		"--concurrency", strconv.Itoa(concurrency)}
}

// runWorkers runs the worker processes of cfg for d (their HTTP servers on
// 127.0.0.1:0), then stops them. It returns when they started and their
// metrics at the end, each summed over the processes.
func runWorkers(ctx context.Context, cfg workers.Config, d time.Duration, logger *slog.Logger, what string) (time.Time, map[string]float64, error) {
	fleet, err := workers.Start(cfg)
	if err != nil {
		return time.Time{}, nil, err
	}
	defer fleet.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // stopped below; this is the error path
	start := time.Now()
	addrs, err := workerAddrs(ctx, fleet, 30*time.Second)
	if err != nil {
		return start, nil, err
	}
	select {
	case <-ctx.Done():
		return start, nil, ctx.Err()
	case <-time.After(d):
	}
	if err := fleet.Exited(); err != nil {
		return start, nil, err
	}
	sum := map[string]float64{}
	for _, a := range addrs {
		for name, v := range scrape(a) {
			sum[name] += v
		}
	}
	if err := fleet.Stop(ctx); err != nil {
		logger.Warn(what+": stopping the workers", "err", err)
	}
	return start, sum, nil
}

// processes is the configuration's Processes (the configurations of the
// benchmarks of worker processes have it by embedding Processes).
func (p *Processes) processes() *Processes { return p }

// procConfig is the configuration of a benchmark of worker processes.
type procConfig interface {
	Validate() error
	setDefaults() error
	processes() *Processes
}

// prepare readies cfg, the configuration typ of a benchmark of worker
// processes, for a run (valid, its defaults applied, with a database URL)
// and opens what the run needs (Processes.open: name names its temporary
// directory).
func prepare(ctx context.Context, cfg procConfig, typ, name string) (dir string, pool *pgxpool.Pool, release func(), err error) {
	if err := cfg.Validate(); err != nil {
		return "", nil, nil, err
	}
	if err := cfg.setDefaults(); err != nil {
		return "", nil, nil, err
	}
	p := cfg.processes()
	if p.DatabaseURL == "" {
		return "", nil, nil, invalidField(typ)("DatabaseURL is required")
	}
	return p.open(ctx, name)
}
