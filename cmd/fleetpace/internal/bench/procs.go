package bench

import (
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

// procEnv opens what a benchmark of worker processes needs: its working
// directory (dir, or a temporary one named after name that release
// removes) and a small pool on url for its own queries. release closes
// and removes what procEnv made.
func procEnv(ctx context.Context, url, dir, name string) (string, *pgxpool.Pool, func(), error) {
	var tmp string
	if dir == "" {
		d, err := os.MkdirTemp("", "fleetpace-bench-"+name+"-")
		if err != nil {
			return "", nil, nil, err
		}
		dir, tmp = d, d
	}
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: url, MaxConns: 4})
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

// invalidField is the error of a bad field of the configuration typ:
// "bench.typ." and format, wrapping ErrInvalidConfig.
func invalidField(typ string) func(format string, args ...any) error {
	return func(format string, args ...any) error {
		return fmt.Errorf("%w: bench.%s.%s", ErrInvalidConfig, typ, fmt.Sprintf(format, args...))
	}
}

// checkProcesses applies a benchmark's defaults (setDefaults) and checks
// the fields every benchmark of worker processes has: 1–32 workers of 1–
// 10,000 jobs each. It returns the error maker for kind's other fields.
func checkProcesses(kind string, setDefaults func() error, workers, concurrency *int) (bad func(format string, args ...any) error, err error) {
	if err := setDefaults(); err != nil {
		return nil, err
	}
	bad = invalidField(kind)
	switch {
	case *workers < 1 || *workers > 32:
		return bad, bad("Workers must be in [1, 32], got %d", *workers)
	case *concurrency < 1 || *concurrency > 10_000:
		return bad, bad("Concurrency must be in [1, 10000], got %d", *concurrency)
	}
	return bad, nil
}

// processDefaults fills in what the benchmarks of worker processes share:
// the workers run this binary unless told otherwise, and their progress
// and logs go nowhere. kind names the configuration in an error.
func processDefaults(kind string, executable *string, progress *io.Writer, logger **slog.Logger) error {
	if *executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench: %s.Executable: %w", kind, err)
		}
		*executable = exe
	}
	if *progress == nil {
		*progress = io.Discard
	}
	if *logger == nil {
		*logger = slog.New(slog.DiscardHandler)
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

// procConfig is the configuration of a benchmark of worker processes.
type procConfig interface {
	Validate() error
	setDefaults() error
}

// prepare readies cfg, the configuration typ of a benchmark of worker
// processes, for a run: valid, its defaults applied, with a database URL.
func prepare(cfg procConfig, typ, databaseURL string) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	if databaseURL == "" {
		return invalidField(typ)("DatabaseURL is required")
	}
	return nil
}
