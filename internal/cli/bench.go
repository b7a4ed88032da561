package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/bench"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/pgembed"
)

// benchCmd is `fleetpace bench` with the given benchmarks.
func (a *app) benchCmd(benchmarks ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure fleetpace against its baselines (one run, one database, medians)",
		Long: `Benchmarks that measure fleetpace side by side with the baseline named in
its issue, in one run on one database, and report medians.

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
		c, err := pgembed.Start(ctx, pgembed.Config{Logger: a.logger, Settings: map[string]string{"shared_buffers": "'512MB'"}})
		if err != nil {
			return nil, "", nil, err
		}
		cleanup = func() { _ = c.Close(context.WithoutCancel(ctx)) }
		url = c.URL("postgres")
	} else {
		a.announce("benchmarking database %s", dbconn.Describe(url))
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
func (a *app) runBench(ctx context.Context, asJSON bool, run func(pool *pgxpool.Pool, url string) (benchResult, error)) error {
	pool, url, cleanup, err := a.benchDB(ctx, 4)
	if err != nil {
		return err
	}
	defer cleanup()
	res, err := run(pool, url)
	if err != nil {
		return dbError(err)
	}
	if asJSON {
		return res.WriteJSON(a.stdout)
	}
	return res.WriteText(a.stdout)
}

func (a *app) benchScanCmd() *cobra.Command {
	var (
		cfg    bench.ScanConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "scan",
		Short: "Due query and whole tick on 1,000,000 sources vs the bare ORDER BY … LIMIT floor",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			return a.runBench(cmd.Context(), asJSON, func(pool *pgxpool.Pool, _ string) (benchResult, error) {
				cfg.Pool = pool
				cfg.Progress = a.stderr
				return bench.Scan(cmd.Context(), cfg)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Sources, "sources", bench.DefaultScanSources, "sources to create")
	f.IntVar(&cfg.Platforms, "platforms", bench.DefaultScanPlatforms, "platforms sharing them")
	f.IntVar(&cfg.CoolingDown, "cooling-down", bench.DefaultScanCoolingDown, "platforms in cooldown")
	f.IntVar(&cfg.Select, "select", bench.DefaultScanSelect, "sources selected by the due query and each tick")
	f.IntVar(&cfg.Runs, "runs", bench.DefaultScanRuns, "repetitions of each measurement (ticks: a third, at least 5)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	zeroIsDefault(f, "sources", "platforms", "select", "runs")
	return cmd
}
