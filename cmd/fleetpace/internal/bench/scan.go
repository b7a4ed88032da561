// Package bench holds fleetpace's benchmarks behind `fleetpace bench`:
// each measures fleetpace side by side with its baseline, in one run, on one
// database, and reports medians.
package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
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
	// Platforms are the numbers of platforms sharing them: the benchmark
	// runs once per size, on data made afresh. Default [20].
	Platforms []int
	// CoolingDown is how many platforms are in cooldown (at most all but
	// one). Default 2.
	CoolingDown int
	// Keys is how many keys each keyed platform's sources are spread over
	// (0: no keys, every source has key ""). Keyed platforms take 1,000
	// requests/s and limit each key to KeyRate.
	Keys int
	// KeyedPlatforms is how many platforms have keys, the first ones
	// (0: all of them, when Keys > 0).
	KeyedPlatforms int
	// KeyRate is the per-key rate of keyed platforms, requests/s. Default 1.
	KeyRate float64
	// Select is how many sources the due query and a tick select. Default 1000.
	Select int
	// Runs is how many times each measurement is repeated. Default 30
	// (ticks: a third of it, at least 5).
	Runs int
	// Progress receives progress lines. Default: none.
	Progress io.Writer
}

// ScanReport is the outcome of the scan benchmark: one result per size.
type ScanReport struct {
	Sizes []*ScanResult `json:"sizes"`
}

// ScanResult is the outcome of the scan benchmark at one size (durations in
// ms, except the data's).
type ScanResult struct {
	Sources        int     `json:"sources"`
	Platforms      int     `json:"platforms"`
	CoolingDown    int     `json:"cooling_down"`
	Keys           int     `json:"keys"`            // keys per keyed platform
	KeyedPlatforms int     `json:"keyed_platforms"` // platforms with keys
	KeyRate        float64 `json:"key_rate"`
	Rows           Rows    `json:"rows"`
	LoadStart      string  `json:"load_average_start"` // /proc/loadavg when the measurements began
	LoadEnd        string  `json:"load_average_end"`   // and when they ended
	DueFraction    float64 `json:"due_fraction"`
	Selected       int     `json:"selected"`
	DueP50         float64 `json:"due_p50_ms"`
	DueP95         float64 `json:"due_p95_ms"`
	// DueFresh is the due query run again in the same transaction, its
	// heads already fresh: its reads alone (how the benchmark timed the
	// due query before keys).
	DueFreshP50    float64 `json:"due_fresh_p50_ms"`
	DueFreshP95    float64 `json:"due_fresh_p95_ms"`
	TickP50        float64 `json:"tick_p50_ms"`
	TickP95        float64 `json:"tick_p95_ms"`
	FloorP50       float64 `json:"floor_p50_ms"`
	FloorP95       float64 `json:"floor_p95_ms"`
	DueRatio       float64 `json:"due_ratio"`
	IndexedFloorP5 float64 `json:"indexed_floor_p50_ms"`
	IndexedRatio   float64 `json:"due_ratio_indexed_floor"`
	TickEnqueued   int     `json:"tick_enqueued"`
	DataSeconds    float64 `json:"data_seconds"`  // making the data set: rows, indexes, statistics
	TotalSeconds   float64 `json:"total_seconds"` // the whole size, data included
	DuePlan        string  `json:"due_plan"`
	// DueStats is what each measured due query read.
	DueStats []scan.DueStats `json:"due_stats"`
}

// Rows are the row counts of a size's data set.
type Rows struct {
	Sources    int64 `json:"sources"`
	Due        int64 `json:"due"`    // enabled, not queued, due now
	Queued     int64 `json:"queued"` // before the measurements
	Platforms  int64 `json:"platforms"`
	Keys       int64 `json:"keys"`       // distinct (platform, key) of sources, key "" included
	KeyHeads   int64 `json:"key_heads"`  // fleetpace_platform_due's rows of keys
	KeyLimits  int64 `json:"key_limits"` // fleetpace_key_limit's rows
	ChangeRows int64 `json:"change_log"` // fleetpace_due_change's rows left after the warm-up tick
}

// ErrInvalidConfig is wrapped by every error of the benchmarks' Validate
// methods.
var ErrInvalidConfig = errors.New("invalid config")

// Defaults of ScanConfig.
const (
	DefaultScanSources     = 1_000_000
	DefaultScanPlatforms   = 20
	MaxScanPlatforms       = 100_000
	DefaultScanCoolingDown = 2
	DefaultScanSelect      = 1000
	DefaultScanRuns        = 30
	DefaultScanKeyRate     = 1.0
	// scanKeyedRate is the rate of keyed platforms: a platform with many
	// accounts has an application-wide limit well above one account's.
	scanKeyedRate = 1000
)

func (c *ScanConfig) setDefaults() {
	c.Sources = cmp.Or(c.Sources, DefaultScanSources)
	if len(c.Platforms) == 0 {
		c.Platforms = []int{DefaultScanPlatforms}
	}
	c.CoolingDown = cmp.Or(c.CoolingDown, DefaultScanCoolingDown)
	c.Select = cmp.Or(c.Select, DefaultScanSelect)
	c.Runs = cmp.Or(c.Runs, DefaultScanRuns)
	c.KeyRate = cmp.Or(c.KeyRate, DefaultScanKeyRate)
	c.Progress = cmp.Or(c.Progress, io.Discard)
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig. It does not check Pool (Scan does).
func (c ScanConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Sources < 1000:
		return fmt.Errorf("%w: bench.ScanConfig.Sources must be ≥ 1000, got %d", ErrInvalidConfig, c.Sources)
	case c.CoolingDown < 0:
		return fmt.Errorf("%w: bench.ScanConfig.CoolingDown must be ≥ 0, got %d", ErrInvalidConfig, c.CoolingDown)
	case c.Select < 1:
		return fmt.Errorf("%w: bench.ScanConfig.Select must be ≥ 1, got %d", ErrInvalidConfig, c.Select)
	case c.Runs < 1:
		return fmt.Errorf("%w: bench.ScanConfig.Runs must be ≥ 1, got %d", ErrInvalidConfig, c.Runs)
	case c.Keys < 0 || c.Keys > c.Sources:
		return fmt.Errorf("%w: bench.ScanConfig.Keys must be in [0, bench.ScanConfig.Sources (%d)], got %d", ErrInvalidConfig, c.Sources, c.Keys)
	case c.KeyedPlatforms < 0:
		return fmt.Errorf("%w: bench.ScanConfig.KeyedPlatforms must be ≥ 0, got %d", ErrInvalidConfig, c.KeyedPlatforms)
	case !(c.KeyRate >= sources.MinRate && c.KeyRate <= sources.MaxRate):
		return fmt.Errorf("%w: bench.ScanConfig.KeyRate must be in [%g, %g], got %g", ErrInvalidConfig, sources.MinRate, sources.MaxRate, c.KeyRate)
	}
	for _, n := range c.Platforms {
		switch {
		case n < 1 || n > MaxScanPlatforms:
			return fmt.Errorf("%w: bench.ScanConfig.Platforms must be 1–%d each, got %d", ErrInvalidConfig, MaxScanPlatforms, n)
		case c.KeyedPlatforms > n:
			return fmt.Errorf("%w: bench.ScanConfig.KeyedPlatforms must be at most bench.ScanConfig.Platforms (%d), got %d", ErrInvalidConfig, n, c.KeyedPlatforms)
		case n > c.Sources:
			return fmt.Errorf("%w: bench.ScanConfig.Platforms must be at most bench.ScanConfig.Sources (%d), got %d", ErrInvalidConfig, c.Sources, n)
		}
	}
	return nil
}

// Scan measures the due query, a whole tick and the floor query at each
// size, on data made afresh for it.
func Scan(ctx context.Context, cfg ScanConfig) (*ScanReport, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: bench.ScanConfig.Pool is required", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	report := &ScanReport{}
	for _, n := range cfg.Platforms {
		res, err := scanSize(ctx, cfg, n)
		if err != nil {
			return nil, err
		}
		report.Sizes = append(report.Sizes, res)
	}
	return report, nil
}

// scanSize fills the database with sources over platforms platforms and
// measures the due query, a whole tick and the floor query on that data.
func scanSize(ctx context.Context, cfg ScanConfig, platforms int) (*ScanResult, error) {
	pool := cfg.Pool
	start := time.Now()
	size := scanLayout(cfg, platforms)
	fmt.Fprintf(cfg.Progress, "bench scan: creating %d sources over %d platforms (%d of them with %d keys each)…\n",
		cfg.Sources, platforms, size.keyed, cfg.Keys)
	if err := fillScanData(ctx, pool, cfg, platforms); err != nil {
		return nil, err
	}
	res := &ScanResult{
		Sources: cfg.Sources, Platforms: platforms, CoolingDown: size.cooling, Selected: cfg.Select,
		Keys: cfg.Keys, KeyedPlatforms: size.keyed, KeyRate: cfg.KeyRate,
	}
	res.DataSeconds = time.Since(start).Seconds()
	fmt.Fprintf(cfg.Progress, "bench scan: data ready in %s\n", time.Since(start).Round(time.Millisecond))
	var dueCount int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fleetpace_source WHERE due_at <= now()`).Scan(&dueCount); err != nil {
		return nil, err
	}
	res.DueFraction = float64(dueCount) / float64(cfg.Sources)

	dueOpts := scan.DueOptions{Limit: cfg.Select, DefaultCap: size.cap, KeyCap: map[string]int{}}
	for i := range size.keyed {
		dueOpts.KeyCap[size.keyedPlatform(i)] = int(math.Ceil(cfg.KeyRate * scanLookAhead.Seconds()))
	}
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
	tickCfg := scan.Config{Limit: cfg.Select, PerPlatformCap: size.cap, LookAhead: scanLookAhead}
	// One tick, not measured, brings every key's head up to date (the data
	// was loaded without the triggers, and every key logged once as
	// changed): from here on each tick, and each due query, refreshes the
	// heads of the keys the last tick took from, as in a running fleet.
	if _, err := measureTick(ctx, pool, client, tickCfg, &res.TickEnqueued); err != nil {
		return nil, err
	}
	if res.Rows, err = countRows(ctx, pool); err != nil {
		return nil, err
	}
	res.LoadStart = loadAverage()
	var dueMs, freshMs, floorMs, tickMs []float64
	// The floor without an index reads every source: at most 5 runs.
	floorRuns := min(cfg.Runs, 5)
	tickRuns := max(5, cfg.Runs/3)
	for round := 0; round < cfg.Runs; round++ {
		// The due query in a read transaction of its own, as in a tick: it
		// refreshes the heads of the keys the last tick and its checks
		// changed, then reads. Its warm-up run is a transaction of its own
		// too, rolled back: the measured run finds the same change log and
		// does the same work.
		var d []float64
		for _, timed := range []bool{false, true} {
			t, again, stats, err := dueOnce(ctx, pool, dueOpts, cfg.Select)
			if err != nil {
				return nil, err
			}
			if timed {
				d = append(d, t)
				freshMs = append(freshMs, again)
				res.DueStats = append(res.DueStats, stats)
			}
		}
		dueMs = append(dueMs, d...)
		if round < floorRuns {
			f, err := measure("floor", 1, func() error { return floor(ctx, pool, cfg.Select) })
			if err != nil {
				return nil, err
			}
			floorMs = append(floorMs, f...)
		}
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
	res.LoadEnd = loadAverage()
	res.DueP50, res.DueP95 = percentile(dueMs, 50), percentile(dueMs, 95)
	res.DueFreshP50, res.DueFreshP95 = percentile(freshMs, 50), percentile(freshMs, 95)
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
	res.TotalSeconds = time.Since(start).Seconds()
	return res, nil
}

// dueOnce runs the due query in a read transaction of its own, rolled
// back, and returns how long Run took (ms), and how long it took run
// again in the transaction (its heads fresh); it must select want sources.
func dueOnce(ctx context.Context, pool *pgxpool.Pool, opts scan.DueOptions, want int) (first, again float64, stats scan.DueStats, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, 0, stats, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	q, err := scan.PrepareDue(ctx, tx, opts)
	if err != nil {
		return 0, 0, stats, fmt.Errorf("bench: due query: %w", err)
	}
	var times [2]float64
	for i := range times {
		t := time.Now()
		got, err := q.Run(ctx, tx)
		times[i] = ms(time.Since(t))
		if err == nil && len(got) != want {
			err = fmt.Errorf("selected %d sources, want %d (%+v)", len(got), want, q.Stats())
		}
		if err != nil {
			return 0, 0, stats, fmt.Errorf("bench: due query: %w", err)
		}
		if i == 0 {
			stats = q.Stats()
		}
	}
	return times[0], times[1], stats, nil
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
// insert River jobs, commit, and the prunes after it), then, outside the
// timing, does what the fleet would: the jobs go and their sources are
// checked (last checked now, due again after their interval), so the next
// due query and tick refresh the heads of the keys those sources left, as
// in a running fleet.
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
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL, last_checked_at = now(), due_at = now() + check_interval
		WHERE queued_job_id IS NOT NULL`); err != nil {
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
	plan, err := q.Explain(ctx, tx)
	return longArray.ReplaceAllStringFunc(plan, func(a string) string {
		return fmt.Sprintf("'{… %d elements}'", strings.Count(a, ",")+1)
	}), err
}

// longArray is an array constant of a custom plan too long to print.
var longArray = regexp.MustCompile(`'\{[^']{100,}\}'`)

// scanLookAhead is the look-ahead of the benchmark's ticks.
const scanLookAhead = time.Minute

// layout is how a size's data set is laid out.
type layout struct {
	platforms int
	cooling   int // the first platforms cool down
	keyed     int // the last platforms have keys
	cap       int // every platform's cap: half the selection (all of it for one platform)
}

func scanLayout(cfg ScanConfig, platforms int) layout {
	l := layout{platforms: platforms, cooling: min(cfg.CoolingDown, platforms-1), cap: max(1, cfg.Select/2)}
	if platforms == 1 {
		l.cap = cfg.Select
	}
	if cfg.Keys > 0 {
		l.keyed = cmp.Or(cfg.KeyedPlatforms, platforms)
	}
	return l
}

// keyedPlatform is the name of the i-th keyed platform of l.
func (l layout) keyedPlatform(i int) string {
	return benchPlatform(l.platforms-l.keyed+i, l.platforms)
}

// fillScanData replaces every platform, source, cooldown and job with the
// benchmark's data set: platforms platforms (the first CoolingDown of them
// in cooldown, at most all but one), Sources sources spread evenly, 1 %
// never checked, intervals of 30 min, 1 h and 2 h, last checked so that
// about 10 % are due; 0.5 % are already queued. Every platform gets the
// same mix: a source's platform is its number modulo platforms, everything
// else follows from the quotient. With Keys, the last KeyedPlatforms (all,
// by default) spread their sources over Keys keys (the quotient modulo
// Keys), take 1,000 requests/s and limit each key to KeyRate.
//
// The sources are made by one INSERT … SELECT from generate_series with
// fleetpace_source's indexes, constraints and triggers out of the way, then
// put back as they were (their definitions read from the catalog), which is
// several times faster than maintaining them row by row; every key is then
// logged once as changed, so the next tick computes every head.
func fillScanData(ctx context.Context, pool *pgxpool.Pool, cfg ScanConfig, platforms int) error {
	l := scanLayout(cfg, platforms)
	if _, err := pool.Exec(ctx, `TRUNCATE river_job, fleetpace_cooldown, fleetpace_source, fleetpace_pace, fleetpace_platform CASCADE`); err != nil {
		return fmt.Errorf("bench: reset: %w", err)
	}
	width := platformDigits(platforms)
	_, err := pool.Exec(ctx, `
INSERT INTO fleetpace_platform (name, rate_per_sec, key_rate)
SELECT format('bench-%s', lpad(i::text, $2, '0')),
       CASE WHEN i >= $1 - $3 THEN $5 ELSE 5 + 5 * (i % 10) END,
       CASE WHEN i >= $1 - $3 THEN $4 ELSE 0 END
FROM generate_series(0, $1 - 1) i`, platforms, width, l.keyed, cfg.KeyRate, scanKeyedRate)
	if err != nil {
		return fmt.Errorf("bench: platforms: %w", err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE fleetpace_platform`); err != nil {
		return fmt.Errorf("bench: platforms: %w", err)
	}
	err = withoutIndexes(ctx, pool, "fleetpace_source", func(conn *pgxpool.Conn) error {
		_, err := conn.Exec(ctx, `
INSERT INTO fleetpace_source (id, platform, key, url, check_interval, last_checked_at, due_at, queued_at)
SELECT g, format('bench-%s', lpad((g % $2)::text, $3, '0')),
       CASE WHEN g % $2 >= $2 - $4 THEN 'key-' || ((g / $2) % $5) ELSE '' END,
       'https://bench.example/' || g,
       iv,
       lc,
       COALESCE(lc + iv, now() - interval '1 minute'),
       CASE WHEN (g / $2) % 200 = 7 THEN now() + interval '1 day' END
FROM generate_series(1, $1) AS g,
     LATERAL (SELECT (ARRAY[interval '30 minutes', interval '1 hour', interval '2 hours'])[1 + (g / $2) % 3] AS iv) i,
     LATERAL (SELECT CASE WHEN (g / $2) % 100 = 50 THEN NULL
                          ELSE now() - iv * (random() * 1.0989) END AS lc) l`, cfg.Sources, platforms, width, l.keyed, max(cfg.Keys, 1))
		return err
	})
	if err != nil {
		return fmt.Errorf("bench: sources: %w", err)
	}
	if _, err := pool.Exec(ctx, `SELECT setval(pg_get_serial_sequence('fleetpace_source', 'id'), $1)`, cfg.Sources); err != nil {
		return fmt.Errorf("bench: sources: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO fleetpace_due_change (platform, key, due_at)
		SELECT DISTINCT platform, key, '-infinity'::timestamptz FROM fleetpace_source WHERE enabled AND queued_at IS NULL`); err != nil {
		return fmt.Errorf("bench: change log: %w", err)
	}
	for i := 0; i < l.cooling; i++ {
		name := benchPlatform(i, platforms)
		if _, _, err := sources.SetCooldown(ctx, pool, name, time.Hour, "bench", 0.5); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE fleetpace_source`); err != nil {
		return fmt.Errorf("bench: analyze: %w", err)
	}
	return nil
}

// countRows counts the rows of a size's data set.
func countRows(ctx context.Context, pool *pgxpool.Pool) (Rows, error) {
	var r Rows
	err := pool.QueryRow(ctx, `
SELECT (SELECT count(*) FROM fleetpace_source),
       (SELECT count(*) FROM fleetpace_source WHERE enabled AND queued_at IS NULL AND due_at <= now()),
       (SELECT count(*) FROM fleetpace_source WHERE queued_at IS NOT NULL),
       (SELECT count(*) FROM fleetpace_platform),
       (SELECT count(*) FROM (SELECT DISTINCT platform, key FROM fleetpace_source) k),
       (SELECT count(*) FROM fleetpace_platform_due),
       (SELECT count(*) FROM fleetpace_key_limit),
       (SELECT count(*) FROM fleetpace_due_change)`).Scan(
		&r.Sources, &r.Due, &r.Queued, &r.Platforms, &r.Keys, &r.KeyHeads, &r.KeyLimits, &r.ChangeRows)
	if err != nil {
		return r, fmt.Errorf("bench: row counts: %w", err)
	}
	return r, nil
}

// withoutIndexes runs load on one connection with table's secondary
// indexes, its unique and foreign-key constraints and its user triggers
// out of the way, then builds them again from the definitions the catalog
// gave. The triggers are fleetpace_source's change log: the caller makes
// the heads stale (a TRUNCATE does).
func withoutIndexes(ctx context.Context, pool *pgxpool.Pool, table string, load func(*pgxpool.Conn) error) (err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	rows, err := conn.Query(ctx, `
SELECT format('ALTER TABLE %I ADD CONSTRAINT %I %s', conrelid::regclass, conname, pg_get_constraintdef(oid)),
       format('ALTER TABLE %I DROP CONSTRAINT %I', conrelid::regclass, conname)
FROM pg_constraint WHERE conrelid = $1::regclass AND contype IN ('u', 'f')
UNION ALL
SELECT pg_get_indexdef(i.indexrelid), format('DROP INDEX %s', i.indexrelid::regclass)
FROM pg_index i
WHERE i.indrelid = $1::regclass AND NOT i.indisprimary
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)`, table)
	if err != nil {
		return err
	}
	type def struct{ create, drop string }
	defs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (def, error) {
		var d def
		return d, r.Scan(&d.create, &d.drop)
	})
	if err != nil {
		return err
	}
	ident := pgx.Identifier{table}.Sanitize()
	steps := []string{"ALTER TABLE " + ident + " DISABLE TRIGGER USER"}
	for _, d := range defs {
		steps = append(steps, d.drop)
	}
	for _, q := range steps {
		if _, err := conn.Exec(ctx, q); err != nil {
			return err
		}
	}
	defer func() {
		// Put everything back even if the load failed. Statistics first:
		// validating the foreign key is a join the planner must not take
		// for a join of two empty tables.
		restore := []string{"SET maintenance_work_mem = '512MB'", "ANALYZE " + ident}
		for _, d := range defs {
			restore = append(restore, d.create)
		}
		restore = append(restore, "ALTER TABLE "+ident+" ENABLE TRIGGER USER", "RESET maintenance_work_mem")
		for _, q := range restore {
			if _, rerr := conn.Exec(context.WithoutCancel(ctx), q); rerr != nil && err == nil {
				err = rerr
			}
		}
	}()
	return load(conn)
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

// WriteText prints each size's result as a table with the targets.
func (r *ScanReport) WriteText(w io.Writer) error {
	for i, s := range r.Sizes {
		if i > 0 {
			fmt.Fprintln(w)
		}
		if err := s.WriteText(w); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON prints the report as one JSON object.
func (r *ScanReport) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

// WriteText prints the result as a table with the targets.
func (r *ScanResult) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "bench scan: %d sources, %d platforms (%d cooling down), %.1f %% due, selecting %d; data made in %.0f s, %.0f s in all\n",
		r.Sources, r.Platforms, r.CoolingDown, 100*r.DueFraction, r.Selected, r.DataSeconds, r.TotalSeconds)
	if r.Keys > 0 {
		fmt.Fprintf(tw, "keys: %d platforms with %d keys each, every key at %g/s\n", r.KeyedPlatforms, r.Keys, r.KeyRate)
	}
	fmt.Fprintf(tw, "rows: %d sources (%d due, %d queued), %d platforms, %d keys (key \"\" included), %d key heads, %d key limits\n",
		r.Rows.Sources, r.Rows.Due, r.Rows.Queued, r.Rows.Platforms, r.Rows.Keys, r.Rows.KeyHeads, r.Rows.KeyLimits)
	fmt.Fprintf(tw, "load average (1, 5, 15 min): %s at the start of the measurements, %s at the end\n\n", r.LoadStart, r.LoadEnd)
	fmt.Fprintln(tw, "MEASURE\tP50 ms\tP95 ms\tTARGET")
	fmt.Fprintf(tw, "due query (heads refreshed, fair order, keys in turns, caps, cooldowns, queued excluded)\t%.2f\t%.2f\t≤ 50 ms and ≤ 3× floor\n", r.DueP50, r.DueP95)
	fmt.Fprintf(tw, "  the same again in its transaction, heads fresh (its reads alone)\t%.2f\t%.2f\t\n", r.DueFreshP50, r.DueFreshP95)
	if st := r.medianStats(); st.Statements > 0 {
		fmt.Fprintf(tw, "  each (median): %d statements, %d candidate platforms, %d keys' heads, %d sources past them\t\t\t\n",
			st.Statements, st.Candidates, st.Keys, st.Sources)
	}
	fmt.Fprintf(tw, "whole tick (select, mark, enqueue %d jobs, commit)\t%.2f\t%.2f\t≤ 250 ms\n", r.TickEnqueued, r.TickP50, r.TickP95)
	fmt.Fprintf(tw, "floor: SELECT id … ORDER BY last_checked_at NULLS FIRST, id LIMIT n\t%.2f\t%.2f\t\n", r.FloorP50, r.FloorP95)
	fmt.Fprintf(tw, "floor with an index on (last_checked_at, id)\t%.2f\t\t\n", r.IndexedFloorP5)
	fmt.Fprintf(tw, "\ndue / floor (median)\t%.2f×\t\t≤ 3×\n", r.DueRatio)
	fmt.Fprintf(tw, "due / indexed floor (median)\t%.2f×\t\t\n", r.IndexedRatio)
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.DuePlan != "" {
		fmt.Fprintf(w, "\ndue query plans:\n%s\n", indent(r.DuePlan))
	}
	return nil
}

// medianStats is the median of each of the due queries' counts.
func (r *ScanResult) medianStats() scan.DueStats {
	med := func(f func(scan.DueStats) int) int {
		xs := make([]float64, len(r.DueStats))
		for i, s := range r.DueStats {
			xs[i] = float64(f(s))
		}
		if len(xs) == 0 {
			return 0
		}
		return int(percentile(xs, 50))
	}
	return scan.DueStats{
		Statements: med(func(s scan.DueStats) int { return s.Statements }),
		Candidates: med(func(s scan.DueStats) int { return s.Candidates }),
		Keys:       med(func(s scan.DueStats) int { return s.Keys }),
		Sources:    med(func(s scan.DueStats) int { return s.Sources }),
	}
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}
