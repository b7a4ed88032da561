package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/dashboard"
)

// DashboardConfig configures the dashboard benchmark. The zero value means
// defaults.
type DashboardConfig struct {
	// Pool is the database to fill and measure: a throwaway one (the
	// benchmark deletes every source, platform, cooldown and River job in
	// it). Required.
	Pool *pgxpool.Pool
	// Sources is how many sources to create. Default 1,000,000.
	Sources int
	// Platforms is how many platforms share them. Default 10,000.
	Platforms int
	// Runs is how many times each page is served. Default 20.
	Runs int
	// Progress receives progress lines. Default: none.
	Progress io.Writer
}

// Defaults of DashboardConfig.
const (
	DefaultDashboardSources   = 1_000_000
	DefaultDashboardPlatforms = 10_000
	DefaultDashboardRuns      = 20
)

func (c *DashboardConfig) setDefaults() {
	c.Sources = cmp.Or(c.Sources, DefaultDashboardSources)
	c.Platforms = cmp.Or(c.Platforms, DefaultDashboardPlatforms)
	c.Runs = cmp.Or(c.Runs, DefaultDashboardRuns)
	c.Progress = cmp.Or(c.Progress, io.Discard)
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig. It does not check Pool.
func (c DashboardConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Sources < 1000:
		return fmt.Errorf("%w: bench.DashboardConfig.Sources must be ≥ 1000, got %d", ErrInvalidConfig, c.Sources)
	case c.Platforms < 2 || c.Platforms > c.Sources:
		return fmt.Errorf("%w: bench.DashboardConfig.Platforms must be in 2..Sources (%d), got %d", ErrInvalidConfig, c.Sources, c.Platforms)
	case c.Runs < 1:
		return fmt.Errorf("%w: bench.DashboardConfig.Runs must be ≥ 1, got %d", ErrInvalidConfig, c.Runs)
	}
	return nil
}

// PageTiming is one page's server time: its reads (the page's SQL, in one
// read-only transaction) and the whole answer (reads and rendering), in ms.
type PageTiming struct {
	Page     string  `json:"page"`
	Path     string  `json:"path"`
	Bytes    int     `json:"bytes"`
	DBP50    float64 `json:"db_p50_ms"`
	DBP95    float64 `json:"db_p95_ms"`
	TotalP50 float64 `json:"total_p50_ms"`
	TotalP95 float64 `json:"total_p95_ms"`
}

// DashboardResult is the outcome of the dashboard benchmark.
type DashboardResult struct {
	Sources   int   `json:"sources"`
	Platforms int   `json:"platforms"`
	Failing   int64 `json:"failing_sources"`
	// HistoryRows is the fetch history of the last hour: as many checks as
	// the sources' intervals make (every source once per its interval, on
	// average 1 h 10 min), spread over the platforms like the sources.
	HistoryRows int64        `json:"history_rows_last_hour"`
	Runs        int          `json:"runs"`
	Pages       []PageTiming `json:"pages"`
}

// Dashboard fills the database with the scan benchmark's data set (the
// sources spread evenly over the platforms, about 10 % due, 0.5 % queued,
// two platforms cooling down; 1 % of the sources failing, one worker
// live) and serves each dashboard page Runs times, through the handler as
// the worker serves it, reading the server time each answer reports
// (Server-Timing). Pages take turns, round by round.
func Dashboard(ctx context.Context, cfg DashboardConfig) (*DashboardResult, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: bench.DashboardConfig.Pool is required", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	pool := cfg.Pool
	start := time.Now()
	fmt.Fprintf(cfg.Progress, "bench dashboard: creating %d sources over %d platforms…\n", cfg.Sources, cfg.Platforms)
	scfg := ScanConfig{Pool: pool, Sources: cfg.Sources, Platforms: []int{cfg.Platforms}, CoolingDown: min(2, cfg.Platforms-1)}
	scfg.setDefaults()
	if err := fillScanData(ctx, pool, scfg, cfg.Platforms); err != nil {
		return nil, err
	}
	res := &DashboardResult{Sources: cfg.Sources, Platforms: cfg.Platforms, Runs: cfg.Runs}
	if err := pool.QueryRow(ctx, benchFailingSQL).Scan(&res.Failing); err != nil {
		return nil, fmt.Errorf("bench: failing sources: %w", err)
	}
	if _, err := pool.Exec(ctx, benchWorkerSQL); err != nil {
		return nil, fmt.Errorf("bench: worker: %w", err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE fleetpace_source`); err != nil {
		return nil, fmt.Errorf("bench: analyze: %w", err)
	}
	steps := []string{`TRUNCATE fleetpace_check`, benchHistorySQL, `ANALYZE fleetpace_check`}
	for i, step := range steps {
		tag, err := pool.Exec(ctx, step, [][]any{nil, {cfg.Sources, cfg.Platforms, platformDigits(cfg.Platforms)}, nil}[i]...)
		if err != nil {
			return nil, fmt.Errorf("bench: history: %w", err)
		}
		if step == benchHistorySQL {
			res.HistoryRows = tag.RowsAffected()
		}
	}
	fmt.Fprintf(cfg.Progress, "bench dashboard: data ready in %s\n", time.Since(start).Round(time.Millisecond))

	h, err := dashboard.New(dashboard.Config{DB: pool, RiverUI: http.NotFoundHandler()}) // pages link to it as in a worker
	if err != nil {
		return nil, err
	}
	var (
		middle = benchPlatform(cfg.Platforms/2, cfg.Platforms)
		// The first platform has the most sources (one more than the
		// last ones when they do not divide evenly).
		biggest = benchPlatform(1, cfg.Platforms)
		source  int64
	)
	if err := pool.QueryRow(ctx, `SELECT min(id) FROM fleetpace_source WHERE consecutive_failures > 0`).Scan(&source); err != nil {
		return nil, err
	}
	pages := []PageTiming{
		{Page: "overview, first page (50 platforms)", Path: "/"},
		{Page: "overview, a middle page", Path: "/?after=" + middle},
		{Page: "platform (its failing and most overdue sources)", Path: "/platforms/" + biggest},
		{Page: "source", Path: "/sources/" + strconv.FormatInt(source, 10)},
	}
	db := make([][]float64, len(pages))
	total := make([][]float64, len(pages))
	for round := -1; round < cfg.Runs; round++ { // round -1 warms up, unmeasured
		for i := range pages {
			d, t, n, err := serve(ctx, h, pages[i].Path)
			if err != nil {
				return nil, err
			}
			if round >= 0 {
				db[i], total[i] = append(db[i], d), append(total[i], t)
			}
			pages[i].Bytes = n
		}
		if round%5 == 4 {
			fmt.Fprintf(cfg.Progress, "bench dashboard: %d/%d rounds\n", round+1, cfg.Runs)
		}
	}
	for i := range pages {
		pages[i].DBP50, pages[i].DBP95 = percentile(db[i], 50), percentile(db[i], 95)
		pages[i].TotalP50, pages[i].TotalP95 = percentile(total[i], 50), percentile(total[i], 95)
	}
	res.Pages = pages
	return res, nil
}

var serverTiming = regexp.MustCompile(`^db;dur=([\d.]+), total;dur=([\d.]+)$`)

// serve asks the handler for a page and returns the server times it
// reports (ms) and the page's size.
func serve(ctx context.Context, h http.Handler, path string) (db, total float64, size int, err error) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	req.Host = "localhost" // a name the dashboard answers to
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return 0, 0, 0, fmt.Errorf("bench: GET %s: %d: %.300s", path, rec.Code, rec.Body.String())
	}
	m := serverTiming.FindStringSubmatch(rec.Header().Get("Server-Timing"))
	if m == nil {
		return 0, 0, 0, fmt.Errorf("bench: GET %s: no Server-Timing", path)
	}
	db, _ = strconv.ParseFloat(m[1], 64)
	total, _ = strconv.ParseFloat(m[2], 64)
	return db, total, rec.Body.Len(), nil
}

// benchFailingSQL makes 1 % of the sources failing, spread over the
// platforms, (checked, 1–3 failures
// in a row, with a reason) and counts them.
const benchFailingSQL = `
WITH u AS (
    UPDATE fleetpace_source SET consecutive_failures = 1 + id % 3, last_outcome = 'failed', last_status = 500,
        last_error = 'HTTP 500 Internal Server Error', last_checked_at = COALESCE(last_checked_at, now())
    WHERE id % 101 = 3
    RETURNING 1)
SELECT count(*) FROM u`

// benchHistorySQL fills the fetch history of the last hour ($1 sources
// over $2 platforms named with $3 digits): $1 × 3600 / 4200 checks (the
// data set's intervals, 30 min, 1 h and 2 h, average 70 min), 80 % ok,
// 15 % not modified, 3 % answered 429, 2 % failed, spread over the hour and
// the platforms like the sources, in time order as workers append them.
// It is analyzed, not vacuumed: in a running fleet the last hour's pages
// are too recent for autovacuum to have marked them all-visible, so
// counting them visits the heap.
const benchHistorySQL = `
INSERT INTO fleetpace_check (source_id, platform, checked_at, outcome, status, duration_ms, bytes, reason, worker)
SELECT 1 + g % $1, format('bench-%s', lpad((g % $2)::text, $3, '0')),
       now() - interval '1 hour' + (g - random()) * (interval '1 hour' / ($1::bigint * 3600 / 4200)),
       o.outcome, o.status, 20, CASE WHEN o.outcome = 'ok' THEN 4096 ELSE 0 END, o.reason, 'bench-worker'
FROM generate_series(1, $1::bigint * 3600 / 4200) AS g,
     LATERAL (SELECT CASE WHEN g % 50 = 1 THEN 'failed' WHEN g % 33 = 2 THEN 'rate_pressure'
                          WHEN g % 7 = 3 THEN 'not_modified' ELSE 'ok' END AS outcome) k,
     LATERAL (SELECT k.outcome,
                     CASE k.outcome WHEN 'failed' THEN 500 WHEN 'rate_pressure' THEN 429 WHEN 'not_modified' THEN 304 ELSE 200 END AS status,
                     CASE k.outcome WHEN 'failed' THEN 'HTTP 500 Internal Server Error' WHEN 'rate_pressure' THEN 'HTTP 429 Too Many Requests' END AS reason) o`

const benchWorkerSQL = `
INSERT INTO fleetpace_worker (id, hostname, pid, version) VALUES ('bench-worker', 'bench', 1, 'bench')
ON CONFLICT (id) DO UPDATE SET seen_at = now()`

// WriteText prints the result as a table with the target.
func (r *DashboardResult) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "bench dashboard: %d sources, %d platforms, %d failing, %d checks in the history's last hour; %d runs per page\n\n",
		r.Sources, r.Platforms, r.Failing, r.HistoryRows, r.Runs)
	fmt.Fprintln(tw, "PAGE\tSQL P50 ms\tSQL P95 ms\tSERVER P50 ms\tSERVER P95 ms\tKB\tTARGET")
	for _, p := range r.Pages {
		target := ""
		if p.Path == "/" {
			target = "SQL < 100 ms"
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%s\n", p.Page, p.DBP50, p.DBP95, p.TotalP50, p.TotalP95, float64(p.Bytes)/1024, target)
	}
	return tw.Flush()
}

// WriteJSON prints the result as one JSON object.
func (r *DashboardResult) WriteJSON(w io.Writer) error { return writeJSON(w, r) }
