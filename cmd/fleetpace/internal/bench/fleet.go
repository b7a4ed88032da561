package bench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/netdelay"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/sources"
)

// FleetConfig configures the whole-path benchmark: real worker processes
// (scan loop, River, the pacer, the check recorder) against a fake
// destination that enforces the platform's own ceiling, with the database
// optionally far away (a delaying proxy between the workers and
// PostgreSQL). The zero value means defaults (but for DatabaseURL).
type FleetConfig struct {
	// Processes are the workers, 3 at concurrency 50 by default (the
	// tables are emptied before every run), and where the benchmark
	// reports (Progress: a line per run).
	Processes
	// Rates are the ceilings to run, requests/s. Default 50 and 500.
	Rates []float64
	// Burst is the platform's burst (and the destination's). Default: a
	// 50th of the rate, at least 1.
	Burst int
	// RTTs are the round trips added between the workers and PostgreSQL.
	// Default 0 and 20 ms.
	RTTs []time.Duration
	// Duration is one run. Default 30 s; the first 8 s (start, first scans)
	// and the last second are not counted.
	Duration time.Duration
	// Runs is how many runs of each rate × RTT; figures are medians (the
	// largest window: the largest). Default 1.
	Runs int
	// Enforce makes the destination refuse (429) what exceeds the ceiling,
	// a token bucket at the platform's rate and burst; the pacer then backs
	// off on every refusal a late request causes. Default: the destination
	// answers everything and the benchmark counts what it saw.
	Enforce bool
	// WorkerArgs are added to every worker's command line (experiments).
	WorkerArgs []string
}

// Defaults and targets of the whole-path benchmark.
const (
	DefaultFleetWorkers     = 3
	DefaultFleetConcurrency = 50
	DefaultFleetDuration    = 30 * time.Second
	FleetGoodputTarget      = 0.95
	fleetWarmup             = 8 * time.Second
)

// DefaultFleetRates and DefaultFleetRTTs are FleetConfig's defaults.
var (
	DefaultFleetRates = []float64{50, 500}
	DefaultFleetRTTs  = []time.Duration{0, 20 * time.Millisecond}
)

func (c *FleetConfig) setDefaults() error {
	if len(c.Rates) == 0 {
		c.Rates = DefaultFleetRates
	}
	if len(c.RTTs) == 0 {
		c.RTTs = DefaultFleetRTTs
	}
	c.Duration = cmp.Or(c.Duration, DefaultFleetDuration)
	c.Runs = cmp.Or(c.Runs, 1)
	return c.Processes.setDefaults("FleetConfig", DefaultFleetWorkers, DefaultFleetConcurrency)
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig. It does not check DatabaseURL.
func (c FleetConfig) Validate() error {
	return c.Processes.check("FleetConfig", c.setDefaults, func(bad badField) error {
		switch {
		case c.Burst < 0:
			return bad("Burst must be ≥ 1 (0: default), got %d", c.Burst)
		case c.Duration <= fleetWarmup+2*time.Second:
			return bad("Duration must be > %s, got %s", fleetWarmup+2*time.Second, c.Duration)
		case c.Runs < 1:
			return bad("Runs must be ≥ 1, got %d", c.Runs)
		}
		for _, r := range c.Rates {
			if !(r > 0 && r <= 100_000) {
				return bad("Rates must be in (0, 100000], got %g", r)
			}
		}
		for _, d := range c.RTTs {
			if d < 0 || d > 10*time.Second {
				return bad("RTTs must be in [0, 10s], got %s", d)
			}
		}
		return nil
	})
}

func (c FleetConfig) burst(rate float64) int {
	if c.Burst > 0 {
		return c.Burst
	}
	return max(1, int(math.Ceil(rate/50)))
}

// FleetRow is one rate × round trip: medians over the runs of the steady
// part, as the destination counted.
type FleetRow struct {
	Rate        float64   `json:"rate_per_sec"`
	Burst       int       `json:"burst"`
	RTTms       float64   `json:"rtt_ms"`
	Delivered   float64   `json:"delivered_per_sec"` // every request the destination received
	Goodput     float64   `json:"goodput"`           // accepted requests / s / rate
	GoodputRuns []float64 `json:"goodput_runs"`
	Limited     int       `json:"limited"`    // requests the destination refused (429), all runs
	MaxWindow   int       `json:"max_window"` // largest number of requests in a 1-s window, all runs
	Bound       int       `json:"bound"`      // rate + burst
	Enqueued    float64   `json:"enqueued_per_sec"`
	FromBlock   float64   `json:"from_block"`      // reservations served from blocks, all workers
	Discarded   float64   `json:"block_discarded"` // block slots that went unused
	Late        float64   `json:"late"`            // slots given up by jobs that woke too late for them
}

// Met reports whether the row meets the targets: no 1-s window over rate +
// burst, goodput ≥ FleetGoodputTarget.
func (r FleetRow) Met() bool { return r.MaxWindow <= r.Bound && r.Goodput >= FleetGoodputTarget }

// FleetResult is the benchmark's outcome.
type FleetResult struct {
	Workers     int        `json:"workers"`
	Concurrency int        `json:"concurrency"`
	Duration    string     `json:"duration"`
	Runs        int        `json:"runs"`
	Rows        []FleetRow `json:"rows"`
}

// Fleet runs the benchmark: for each rate and round trip, Runs runs of a
// fresh fleet on fresh tables.
func Fleet(ctx context.Context, cfg FleetConfig) (*FleetResult, error) {
	dir, pool, release, err := prepare(ctx, &cfg, "FleetConfig", "fleet")
	if err != nil {
		return nil, err
	}
	defer release()
	res := &FleetResult{Workers: cfg.Workers, Concurrency: cfg.Concurrency, Duration: cfg.Duration.String(), Runs: cfg.Runs}
	for _, rtt := range cfg.RTTs {
		for _, rate := range cfg.Rates {
			var rows []FleetRow
			for run := 1; run <= cfg.Runs; run++ {
				row, err := fleetRun(ctx, cfg, pool, rate, rtt, filepath.Join(dir, fmt.Sprintf("r%g-rtt%s-%d", rate, rtt, run)))
				if err != nil {
					return nil, fmt.Errorf("bench fleet: %g/s, RTT %s, run %d: %w", rate, rtt, run, err)
				}
				fmt.Fprintf(cfg.Progress, "bench fleet: %g/s, RTT %s, run %d: goodput %.3f, largest 1-s window %d (bound %d), %d refused, enqueued %.0f/s, %.0f from blocks, %.0f discarded, %.0f late\n",
					rate, rtt, run, row.Goodput, row.MaxWindow, row.Bound, row.Limited, row.Enqueued, row.FromBlock, row.Discarded, row.Late)
				rows = append(rows, row)
			}
			res.Rows = append(res.Rows, medianFleetRow(rows))
		}
	}
	return res, nil
}

func medianFleetRow(rows []FleetRow) FleetRow {
	out := rows[0]
	var g, d, e, fb, dc, lt []float64
	out.Limited, out.MaxWindow = 0, 0
	for _, r := range rows {
		g, d, e, fb, dc, lt = append(g, r.Goodput), append(d, r.Delivered), append(e, r.Enqueued), append(fb, r.FromBlock), append(dc, r.Discarded), append(lt, r.Late)
		out.Limited += r.Limited
		out.MaxWindow = max(out.MaxWindow, r.MaxWindow)
	}
	out.Goodput, out.Delivered, out.Enqueued, out.FromBlock, out.Discarded, out.Late = median(g), median(d), median(e), median(fb), median(dc), median(lt)
	out.GoodputRuns = g
	return out
}

// fleetRun is one run: fresh tables, a destination enforcing the ceiling,
// a proxy adding rtt, the workers through it.
func fleetRun(ctx context.Context, cfg FleetConfig, pool *pgxpool.Pool, rate float64, rtt time.Duration, dir string) (FleetRow, error) {
	burst := cfg.burst(rate)
	row := FleetRow{Rate: rate, Burst: burst, RTTms: float64(rtt) / float64(time.Millisecond), Bound: int(rate) + burst}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return row, err
	}
	if err := emptyTables(ctx, pool); err != nil {
		return row, err
	}
	rule := fakedest.Rule{}
	if cfg.Enforce {
		rule = fakedest.Rule{Rate: rate, Burst: burst}
	}
	dest, err := startDest(cfg.Logger, map[string]fakedest.Rule{"/f/": rule})
	if err != nil {
		return row, err
	}
	defer dest.Close()
	if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: "f", RatePerSec: rate, Burst: burst}); err != nil {
		return row, err
	}
	var csv strings.Builder
	csv.WriteString("platform,url,interval\n")
	n := int(math.Ceil(rate * cfg.Duration.Seconds() * 1.5))
	for i := range n {
		fmt.Fprintf(&csv, "f,%s/f/%d,1h\n", dest.URL(), i)
	}
	if err := importCSV(ctx, pool, csv.String()); err != nil {
		return row, err
	}

	workerURL := cfg.DatabaseURL
	if rtt > 0 {
		proxy, far, err := netdelay.StartURL(cfg.DatabaseURL, rtt/2)
		if err != nil {
			return row, err
		}
		defer proxy.Close()
		workerURL = far
	}
	args := append(workerArgs(workerURL, "info", "127.0.0.1:0", cfg.Concurrency), cfg.WorkerArgs...)
	start, m, err := runWorkers(ctx, workers.Config{Executable: cfg.Executable, Dir: dir, N: cfg.Workers, Args: args},
		cfg.Duration, cfg.Logger, "bench fleet")
	if err != nil {
		return row, err
	}
	row.FromBlock = m["fleetpace_pacer_block_reservations_total"]
	row.Discarded = m["fleetpace_pacer_block_slots_discarded_total"]
	row.Late = m[`fleetpace_job_snoozes_total{platform="f",reason="late"}`]
	from, to := start.Add(fleetWarmup), start.Add(cfg.Duration-time.Second)
	var all []time.Time
	accepted, total := 0, 0
	for _, r := range dest.Requests() {
		all = append(all, r.Time)
		if r.Limited {
			row.Limited++
		}
		if r.Time.Before(from) || !r.Time.Before(to) {
			continue
		}
		total++
		if !r.Limited && r.Status < 400 {
			accepted++
		}
	}
	span := to.Sub(from).Seconds()
	row.Delivered = float64(total) / span
	row.Goodput = float64(accepted) / span / rate
	row.MaxWindow = fakedest.MaxInWindow(all, time.Second)
	var enq int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE created_at >= $1 AND created_at < $2`, from, to).Scan(&enq); err == nil {
		row.Enqueued = float64(enq) / span
	}
	return row, nil
}

var listenLine = regexp.MustCompile(`msg="http server listening" addr=(\S+)`)

// workerAddrs reads each worker's HTTP address from its log.
func workerAddrs(ctx context.Context, fleet *workers.Fleet, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	var out []string
	for _, path := range fleet.Logs() {
		for {
			b, _ := os.ReadFile(path)
			if m := listenLine.FindSubmatch(b); m != nil {
				out = append(out, string(m[1]))
				break
			}
			if err := fleet.Exited(); err != nil {
				return nil, err
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("no HTTP address in %s after %s:\n%s", path, timeout, workers.Tail(path, 10))
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return out, nil
}

// scrape reads a worker's /metrics: every series by its full name (labels
// included), and every metric by its name (the sum of its series).
func scrape(addr string) map[string]float64 {
	out := map[string]float64{}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			out[name] += v // the series
			name = name[:i]
		}
		out[name] += v // the sum of the metric's series
	}
	return out
}

// WriteText prints the table.
func (r *FleetResult) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "bench fleet: %d workers × concurrency %d, %s per run (steady part from %s), medians of %d run(s)\n",
		r.Workers, r.Concurrency, r.Duration, fleetWarmup, r.Runs)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rate/s\tburst\tRTT\tdelivered/s\tgoodput\tlargest 1 s\trefused\tenqueued/s\tfrom blocks\tdiscarded\tlate\ttargets\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%g\t%d\t%gms\t%.1f\t%.3f\t%d/%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t\n", row.Rate, row.Burst, row.RTTms,
			row.Delivered, row.Goodput, row.MaxWindow, row.Bound, row.Limited, row.Enqueued, row.FromBlock, row.Discarded, row.Late,
			metOrMissed(row.Met()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "targets: largest 1-s window ≤ rate + burst; goodput (accepted/s ÷ rate) ≥ %.2f\n", FleetGoodputTarget)
	return nil
}

// WriteJSON prints the result as JSON.
func (r *FleetResult) WriteJSON(w io.Writer) error { return writeJSON(w, r) }
