// Package bench holds fleetpace's benchmarks behind `fleetpace bench`:
// each measures fleetpace side by side with its baseline, in one run, on one
// database, and reports medians.
package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
)

// ScanConfig configures the scan benchmark. The zero value means defaults.
type ScanConfig struct {
	// Pool is the database to fill and measure; it must have the schema and
	// should be a throwaway database (the benchmark deletes every source,
	// platform, cooldown and River job in it). Required.
	Pool *pgxpool.Pool
	// Sources is how many sources to create. Default 1,000,000.
	Sources int
	// Platforms is how many platforms share them. Default 20.
	Platforms int
	// CoolingDown is how many platforms are in cooldown. Default 2.
	CoolingDown int
	// Select is how many sources the due query and a tick select. Default 1000.
	Select int
	// Runs is how many times each measurement is repeated. Default 30
	// (ticks: a third of it, at least 5).
	Runs int
	// Progress receives progress lines. Default: none.
	Progress io.Writer
}

// ScanResult is the outcome of the scan benchmark (durations in ms).
type ScanResult struct {
	Sources        int     `json:"sources"`
	Platforms      int     `json:"platforms"`
	CoolingDown    int     `json:"cooling_down"`
	DueFraction    float64 `json:"due_fraction"`
	Selected       int     `json:"selected"`
	DueP50         float64 `json:"due_p50_ms"`
	DueP95         float64 `json:"due_p95_ms"`
	TickP50        float64 `json:"tick_p50_ms"`
	TickP95        float64 `json:"tick_p95_ms"`
	FloorP50       float64 `json:"floor_p50_ms"`
	FloorP95       float64 `json:"floor_p95_ms"`
	DueRatio       float64 `json:"due_ratio"`
	IndexedFloorP5 float64 `json:"indexed_floor_p50_ms"`
	IndexedRatio   float64 `json:"due_ratio_indexed_floor"`
	TickEnqueued   int     `json:"tick_enqueued"`
	DuePlan        string  `json:"due_plan"`
}

// ErrInvalidConfig is wrapped by every error of the benchmarks' Validate
// methods.
var ErrInvalidConfig = errors.New("invalid config")

// Defaults of ScanConfig.
const (
	DefaultScanSources     = 1_000_000
	DefaultScanPlatforms   = 20
	DefaultScanCoolingDown = 2
	DefaultScanSelect      = 1000
	DefaultScanRuns        = 30
)

func (c *ScanConfig) setDefaults() {
	c.Sources = cmp.Or(c.Sources, DefaultScanSources)
	c.Platforms = cmp.Or(c.Platforms, DefaultScanPlatforms)
	c.CoolingDown = cmp.Or(c.CoolingDown, DefaultScanCoolingDown)
	c.Select = cmp.Or(c.Select, DefaultScanSelect)
	c.Runs = cmp.Or(c.Runs, DefaultScanRuns)
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig. It does not check Pool (Scan does).
func (c ScanConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Sources < 1000:
		return fmt.Errorf("%w: bench.ScanConfig.Sources must be ≥ 1000, got %d", ErrInvalidConfig, c.Sources)
	case c.Platforms < 2:
		return fmt.Errorf("%w: bench.ScanConfig.Platforms must be ≥ 2, got %d", ErrInvalidConfig, c.Platforms)
	case c.CoolingDown < 0 || c.CoolingDown >= c.Platforms:
		return fmt.Errorf("%w: bench.ScanConfig.CoolingDown must be ≥ 0 and below bench.ScanConfig.Platforms (%d), got %d", ErrInvalidConfig, c.Platforms, c.CoolingDown)
	case c.Select < 1:
		return fmt.Errorf("%w: bench.ScanConfig.Select must be ≥ 1, got %d", ErrInvalidConfig, c.Select)
	case c.Runs < 1:
		return fmt.Errorf("%w: bench.ScanConfig.Runs must be ≥ 1, got %d", ErrInvalidConfig, c.Runs)
	}
	return nil
}

// Scan fills the database with sources and measures the due query, a whole
// tick and the floor query on the same data.
func Scan(ctx context.Context, cfg ScanConfig) (*ScanResult, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: bench.ScanConfig.Pool is required", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	pool := cfg.Pool
	start := time.Now()
	fmt.Fprintf(cfg.Progress, "bench scan: creating %d sources over %d platforms…\n", cfg.Sources, cfg.Platforms)
	if err := fillScanData(ctx, pool, cfg); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "bench scan: data ready in %s\n", time.Since(start).Round(time.Millisecond))

	res := &ScanResult{Sources: cfg.Sources, Platforms: cfg.Platforms, CoolingDown: cfg.CoolingDown, Selected: cfg.Select}
	var dueCount int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fleetpace_source WHERE due_at <= now()`).Scan(&dueCount); err != nil {
		return nil, err
	}
	res.DueFraction = float64(dueCount) / float64(cfg.Sources)

	dueOpts := scan.DueOptions{Limit: cfg.Select, DefaultCap: cfg.Select / 2}
	measure := func(name string, runs int, f func() error) ([]float64, error) {
		// One unmeasured run warms caches and prepared statements.
		if err := f(); err != nil {
			return nil, fmt.Errorf("bench: %s: %w", name, err)
		}
		out := make([]float64, 0, runs)
		for i := 0; i < runs; i++ {
			t := time.Now()
			if err := f(); err != nil {
				return nil, fmt.Errorf("bench: %s: %w", name, err)
			}
			out = append(out, ms(time.Since(t)))
		}
		return out, nil
	}

	// Interleave the measurements, round by round, so load on a shared
	// machine hits them alike.
	client, err := queue.NewClient(pool, queue.Config{})
	if err != nil {
		return nil, err
	}
	tickCfg := scan.Config{Limit: cfg.Select, PerPlatformCap: cfg.Select / 2, LookAhead: time.Minute}
	var dueMs, floorMs, tickMs []float64
	tickRuns := max(5, cfg.Runs/3)
	for round := 0; round < cfg.Runs; round++ {
		// The due query and the floor, each one statement, each in a read
		// transaction of its own (as in a tick).
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		q, err := scan.PrepareDue(ctx, tx, dueOpts)
		if err != nil {
			tx.Rollback(ctx) //nolint:errcheck
			return nil, err
		}
		d, err := measure("due query", 1, func() error {
			got, err := q.Run(ctx, tx)
			if err == nil && len(got) != cfg.Select {
				err = fmt.Errorf("selected %d sources, want %d", len(got), cfg.Select)
			}
			return err
		})
		tx.Rollback(ctx) //nolint:errcheck // read only
		if err != nil {
			return nil, err
		}
		dueMs = append(dueMs, d...)
		f, err := measure("floor", 1, func() error { return floor(ctx, pool, cfg.Select) })
		if err != nil {
			return nil, err
		}
		floorMs = append(floorMs, f...)
		if round < tickRuns {
			t, err := measureTick(ctx, pool, client, tickCfg, &res.TickEnqueued)
			if err != nil {
				return nil, err
			}
			tickMs = append(tickMs, t)
		}
		if round%10 == 9 {
			fmt.Fprintf(cfg.Progress, "bench scan: %d/%d rounds\n", round+1, cfg.Runs)
		}
	}
	res.DueP50, res.DueP95 = percentile(dueMs, 50), percentile(dueMs, 95)
	res.FloorP50, res.FloorP95 = percentile(floorMs, 50), percentile(floorMs, 95)
	res.TickP50, res.TickP95 = percentile(tickMs, 50), percentile(tickMs, 95)
	res.DueRatio = res.DueP50 / res.FloorP50

	// The floor as specified has no index to use (fleetpace's schema has
	// none on last_checked_at alone: the due query uses a per-platform
	// index). For a stricter comparison, measure it again with one.
	if _, err := pool.Exec(ctx, `CREATE INDEX bench_floor_idx ON fleetpace_source (last_checked_at ASC NULLS FIRST, id)`); err != nil {
		return nil, err
	}
	idx, err := measure("indexed floor", cfg.Runs, func() error { return floor(ctx, pool, cfg.Select) })
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `DROP INDEX bench_floor_idx`); err != nil {
		return nil, err
	}
	res.IndexedFloorP5 = percentile(idx, 50)
	res.IndexedRatio = res.DueP50 / res.IndexedFloorP5

	plan, err := explainDue(ctx, pool, dueOpts)
	if err != nil {
		return nil, err
	}
	res.DuePlan = plan
	return res, nil
}

func floor(ctx context.Context, pool *pgxpool.Pool, n int) error {
	rows, err := pool.Query(ctx, `SELECT id FROM fleetpace_source ORDER BY last_checked_at ASC NULLS FIRST, id LIMIT $1`, n)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err == nil && len(ids) != n {
		err = fmt.Errorf("floor returned %d rows", len(ids))
	}
	return err
}

// measureTick times one whole tick (lock, plan, due query, mark queued,
// insert River jobs, commit), then undoes it outside the timing.
func measureTick(ctx context.Context, pool *pgxpool.Pool, client *queue.Client, cfg scan.Config, enqueued *int) (float64, error) {
	t := time.Now()
	res, err := scan.Tick(ctx, pool, client, cfg)
	elapsed := time.Since(t)
	if err != nil {
		return 0, fmt.Errorf("bench: tick: %w", err)
	}
	if res.Skipped || res.Enqueued == 0 {
		return 0, fmt.Errorf("bench: tick enqueued nothing (%+v)", res)
	}
	*enqueued = res.Enqueued
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL WHERE queued_job_id IS NOT NULL`); err != nil {
		return 0, err
	}
	if _, err := pool.Exec(ctx, `DELETE FROM river_job`); err != nil {
		return 0, err
	}
	return ms(elapsed), nil
}

// explainDue returns the due query's plan, in a read transaction of its own
// as in a tick.
func explainDue(ctx context.Context, pool *pgxpool.Pool, opts scan.DueOptions) (string, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	q, err := scan.PrepareDue(ctx, tx, opts)
	if err != nil {
		return "", err
	}
	return q.Explain(ctx, tx)
}

// fillScanData replaces every platform, source, cooldown and job with the
// benchmark's data set: Platforms platforms (the first CoolingDown of them in
// cooldown), Sources sources spread evenly, 1 % never checked, intervals of
// 30 min, 1 h and 2 h, last checked so that about 10 % are due; 0.5 % are
// already queued.
func fillScanData(ctx context.Context, pool *pgxpool.Pool, cfg ScanConfig) error {
	steps := []string{
		`DELETE FROM river_job`,
		`DELETE FROM fleetpace_cooldown`,
		`DELETE FROM fleetpace_source`,
		`DELETE FROM fleetpace_pace`,
		`DELETE FROM fleetpace_platform`,
	}
	for _, s := range steps {
		if _, err := pool.Exec(ctx, s); err != nil {
			return fmt.Errorf("bench: reset: %w", err)
		}
	}
	for i := 0; i < cfg.Platforms; i++ {
		if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: benchPlatform(i, cfg.Platforms), RatePerSec: float64(5 + 5*(i%10))}); err != nil {
			return err
		}
	}
	_, err := pool.Exec(ctx, `
INSERT INTO fleetpace_source (platform, url, check_interval, last_checked_at, due_at, queued_at)
SELECT format('bench-%s', lpad((g % $2)::text, $3, '0')),
       'https://bench.example/' || g,
       iv,
       lc,
       COALESCE(lc + iv, now() - interval '1 minute'),
       CASE WHEN g % 200 = 7 THEN now() + interval '1 day' END
FROM generate_series(1, $1) AS g,
     LATERAL (SELECT (ARRAY[interval '30 minutes', interval '1 hour', interval '2 hours'])[1 + g % 3] AS iv) i,
     LATERAL (SELECT CASE WHEN g % 100 = 50 THEN NULL
                          ELSE now() - iv * (random() * 1.0989) END AS lc) l`, cfg.Sources, cfg.Platforms, platformDigits(cfg.Platforms))
	if err != nil {
		return fmt.Errorf("bench: sources: %w", err)
	}
	for i := 0; i < cfg.CoolingDown; i++ {
		if _, _, err := sources.SetCooldown(ctx, pool, benchPlatform(i, cfg.Platforms), time.Hour, "bench", 0.5); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE fleetpace_source`); err != nil {
		return fmt.Errorf("bench: analyze: %w", err)
	}
	return nil
}

// benchPlatform is the name of the i-th of n benchmark platforms: bench-00,
// bench-01, … (as many digits as n needs, at least two).
func benchPlatform(i, n int) string {
	return fmt.Sprintf("bench-%0*d", platformDigits(n), i)
}

func platformDigits(n int) int { return max(2, len(strconv.Itoa(n-1))) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile returns the p-th percentile (nearest rank) of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(rank, len(s)-1))]
}

// WriteText prints the result as a table with the targets.
func (r *ScanResult) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "bench scan: %d sources, %d platforms (%d cooling down), %.1f %% due, selecting %d\n\n",
		r.Sources, r.Platforms, r.CoolingDown, 100*r.DueFraction, r.Selected)
	fmt.Fprintln(tw, "MEASURE\tP50 ms\tP95 ms\tTARGET")
	fmt.Fprintf(tw, "due query (fair order, caps, cooldowns, queued excluded)\t%.2f\t%.2f\t≤ 50 ms and ≤ 3× floor\n", r.DueP50, r.DueP95)
	fmt.Fprintf(tw, "whole tick (select, mark, enqueue %d jobs, commit)\t%.2f\t%.2f\t≤ 250 ms\n", r.TickEnqueued, r.TickP50, r.TickP95)
	fmt.Fprintf(tw, "floor: SELECT id … ORDER BY last_checked_at NULLS FIRST, id LIMIT n\t%.2f\t%.2f\t\n", r.FloorP50, r.FloorP95)
	fmt.Fprintf(tw, "floor with an index on (last_checked_at, id)\t%.2f\t\t\n", r.IndexedFloorP5)
	fmt.Fprintf(tw, "\ndue / floor (median)\t%.2f×\t\t≤ 3×\n", r.DueRatio)
	fmt.Fprintf(tw, "due / indexed floor (median)\t%.2f×\t\t\n", r.IndexedRatio)
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.DuePlan != "" {
		fmt.Fprintf(w, "\ndue query plan:\n%s\n", indent(r.DuePlan))
	}
	return nil
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}

// WriteJSON prints the result as one JSON object.
func (r *ScanResult) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
