// Package demo is `fleetpace demo`: the whole system on a throwaway embedded
// PostgreSQL cluster and a fake destination on loopback, with real
// `fleetpace worker` processes sharing three platforms' ceilings, live
// progress, a summary, a chart, and a pass/fail verdict (no platform's ceiling
// exceeded in any 1-s window at the destination).
//
// The three platforms show the three things fleetpace coordinates across
// processes:
//
//   - steady: the destination accepts everything; the fleet holds the
//     configured ceiling.
//   - throttled: the destination rate-limits below the configured ceiling;
//     429s raise the shared multiplier until the fleet fits, clean answers
//     lower it again.
//   - cooldown: after a quarter of the run the destination answers a burst
//     of 429s with a long Retry-After; the fleet puts the platform into
//     cooldown and sits it out together.
//
// Everything the demo starts (cluster, destination, workers) is stopped, and
// everything it writes except the chart is removed, when it ends or is
// interrupted.
package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

// ErrCeilingExceeded is returned (wrapped, naming the platform and window)
// when some platform received more requests in a 1-s window than its ceiling
// allows.
var ErrCeilingExceeded = errors.New("demo: ceiling exceeded")

// ErrInterrupted is returned when the demo was stopped before its duration
// (Ctrl-C, SIGTERM): everything was still stopped and removed.
var ErrInterrupted = errors.New("demo: interrupted")

// DefaultChartPath is where the chart goes when Config.ChartPath is empty: in
// the current directory, so it outlives the demo's temporary directory.
const DefaultChartPath = "fleetpace-demo.svg"

// Config configures a demo. The zero value means defaults.
type Config struct {
	// Workers is how many `fleetpace worker` processes run. Default 3.
	Workers int
	// Duration is how long the workers run. Default 60 s.
	Duration time.Duration
	// Sources is how many sources are created, split evenly over the three
	// platforms. Default 300.
	Sources int
	// ChartPath is the chart file: ".png" writes a PNG, ".svg" an SVG (any
	// other ending is refused). Default DefaultChartPath (in the current
	// directory).
	ChartPath string
	// TmpDir is where the demo's temporary directory (cluster, worker logs)
	// is created and removed. When running as root it must be searchable by
	// the postgres user. Default os.TempDir().
	TmpDir string
	// Executable is the fleetpace binary started as workers. Default
	// os.Executable().
	Executable string
	// Terminal redraws the progress in place with ANSI escapes; otherwise
	// progress is printed as plain lines every PlainEvery.
	Terminal bool
	// Refresh is how often progress is sampled (and redrawn on a terminal).
	// Default 1 s.
	Refresh time.Duration
	// PlainEvery is how often progress lines are printed when not on a
	// terminal. Default 5 s.
	PlainEvery time.Duration
	// Logger receives diagnostics. Default: discard.
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultWorkers  = 3
	DefaultDuration = 60 * time.Second
	DefaultSources  = 300
)

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("invalid config")

func (c Config) withDefaults() Config {
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.Duration = cmp.Or(c.Duration, DefaultDuration)
	c.Sources = cmp.Or(c.Sources, DefaultSources)
	c.ChartPath = cmp.Or(c.ChartPath, DefaultChartPath)
	c.TmpDir = cmp.Or(c.TmpDir, os.TempDir())
	c.Refresh = cmp.Or(c.Refresh, time.Second)
	c.PlainEvery = cmp.Or(c.PlainEvery, 5*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Workers < 1 || c.Workers > 32:
		return fmt.Errorf("%w: demo.Config.Workers must be in 1..32, got %d", ErrInvalidConfig, c.Workers)
	case c.Duration < 5*time.Second:
		return fmt.Errorf("%w: demo.Config.Duration must be ≥ 5s, got %s", ErrInvalidConfig, c.Duration)
	case c.Duration > 24*time.Hour:
		return fmt.Errorf("%w: demo.Config.Duration must be ≤ 24h, got %s", ErrInvalidConfig, c.Duration)
	case c.Sources < 3 || c.Sources > 1_000_000:
		return fmt.Errorf("%w: demo.Config.Sources must be in 3..1000000, got %d", ErrInvalidConfig, c.Sources)
	case !slices.Contains([]string{".svg", ".png"}, strings.ToLower(filepath.Ext(c.ChartPath))):
		return fmt.Errorf("%w: demo.Config.ChartPath must end in .svg or .png, got %q", ErrInvalidConfig, c.ChartPath)
	case c.Refresh < 100*time.Millisecond:
		return fmt.Errorf("%w: demo.Config.Refresh must be ≥ 100ms, got %s", ErrInvalidConfig, c.Refresh)
	case c.PlainEvery < c.Refresh:
		return fmt.Errorf("%w: demo.Config.PlainEvery (%s) must be ≥ Refresh (%s)", ErrInvalidConfig, c.PlainEvery, c.Refresh)
	}
	return nil
}

// platformSpec is one demo platform.
type platformSpec struct {
	name       string
	rate       float64 // configured ceiling, requests/s
	burst      int
	destRate   float64 // the destination's own limit (0: none)
	destBurst  int
	decayAfter int
	cooldown   bool // the destination says stop for a while
}

func (p platformSpec) prefix() string { return "/" + p.name + "/" }

// limit is the most requests allowed in any 1-s window: the ceiling plus the
// burst.
func (p platformSpec) limit() int { return int(math.Ceil(p.rate)) + p.burst }

var specs = []platformSpec{
	{name: "steady", rate: 20, burst: 1},
	{name: "throttled", rate: 12, burst: 1, destRate: 5, destBurst: 2, decayAfter: 20},
	{name: "cooldown", rate: 8, burst: 1, cooldown: true},
}

// timeline of the cooldown platform's "stop" episode, from the duration.
type timeline struct {
	blockAt, blockFor, retryAfter time.Duration
}

func newTimeline(d time.Duration) timeline {
	return timeline{
		blockAt:    max(3*time.Second, d/4),
		blockFor:   2 * time.Second,
		retryAfter: min(max(5*time.Second, d/5), 20*time.Second).Round(time.Second),
	}
}

// rateLimitedAfter is passed to the workers: a 429 whose Retry-After is
// longer cools the platform down (the throttled platform's 1 s is shorter).
const rateLimitedAfter = 3 * time.Second

// PlatformSummary is one platform's line of the summary.
type PlatformSummary struct {
	Name       string  `json:"name"`
	Ceiling    float64 `json:"ceiling_per_sec"`
	Burst      int     `json:"burst"`
	DestLimit  float64 `json:"destination_limit_per_sec"` // 0: none
	Requests   int     `json:"requests"`
	OK         int     `json:"ok"`
	Status429  int     `json:"status_429"`
	MeanRate   float64 `json:"mean_per_sec"`
	MaxIn1s    int     `json:"max_in_1s"`
	Limit      int     `json:"limit_in_1s"` // ceiling + burst
	MaxWindow  float64 `json:"max_window_start_s"`
	Exceeded   bool    `json:"exceeded"`
	MaxMult    float64 `json:"max_multiplier_seen"`
	Cooldowns  int     `json:"cooldowns"` // escalation count seen (0: never cooled down)
	CooledFor  float64 `json:"cooled_down_s"`
	Checked    int64   `json:"sources_checked"` // checked at least once during the run
	SourcesTot int64   `json:"sources"`
	// StopAt and RetryAfter, for the platform whose destination says stop:
	// when (seconds into the run) and for how long it said so.
	StopAt     float64 `json:"stop_at_s,omitempty"`
	RetryAfter float64 `json:"retry_after_s,omitempty"`
	// WindowArrivalsMS, when Exceeded, are the arrival times in the busiest
	// window, in ms from its start.
	WindowArrivalsMS []float64 `json:"window_arrivals_ms,omitempty"`
}

// Summary is what a demo run showed.
type Summary struct {
	Workers     int               `json:"workers"`
	Duration    time.Duration     `json:"duration_ns"`
	Platforms   []PlatformSummary `json:"platforms"`
	ChartPath   string            `json:"chart_path"`
	TempDir     string            `json:"temp_dir"`
	Interrupted bool              `json:"interrupted"`
}

// OK reports whether no platform exceeded its ceiling.
func (s *Summary) OK() bool {
	for _, p := range s.Platforms {
		if p.Exceeded {
			return false
		}
	}
	return true
}

// Run runs the demo, printing progress to out, and returns its summary. The
// error is ErrCeilingExceeded (wrapped) when a ceiling was exceeded,
// ErrInterrupted when ctx ended first, or what stopped the demo from running.
// Whatever happens, everything started is stopped and the temporary
// directory removed before Run returns.
func Run(ctx context.Context, cfg Config, out io.Writer) (sum *Summary, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("demo: cannot find the fleetpace executable: %w", err)
		}
		cfg.Executable = exe
	}
	chartPath, err := filepath.Abs(cfg.ChartPath)
	if err != nil {
		return nil, fmt.Errorf("demo: chart path: %w", err)
	}
	// Fail before starting anything if the chart cannot be written.
	if err := checkWritable(chartPath); err != nil {
		return nil, fmt.Errorf("demo: demo.Config.ChartPath: %w", err)
	}

	// cleanup runs the stop steps in reverse order, with a context of its
	// own: ctx may be cancelled already (Ctrl-C).
	var undo []func(context.Context)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
		defer cancel()
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i](cctx)
		}
	}()

	tmp, err := os.MkdirTemp(cfg.TmpDir, "fleetpace-demo-")
	if err != nil {
		return nil, fmt.Errorf("demo: temp dir: %w", err)
	}
	undo = append(undo, func(context.Context) {
		if err := os.RemoveAll(tmp); err != nil {
			fmt.Fprintf(out, "demo: removing %s: %v\n", tmp, err)
			return
		}
		fmt.Fprintf(out, "demo: stopped workers, destination and PostgreSQL; removed %s\n", tmp)
	})
	// When root, PostgreSQL runs as the postgres user, which must be able to
	// enter the directory.
	if err := os.Chmod(tmp, 0o711); err != nil {
		return nil, fmt.Errorf("demo: temp dir: %w", err)
	}
	fmt.Fprintf(out, "demo: temporary directory %s (removed at exit)\n", tmp)

	// The cluster.
	fmt.Fprintf(out, "demo: starting a throwaway PostgreSQL cluster…\n")
	cluster, err := pgembed.Start(ctx, pgembed.Config{DataDir: filepath.Join(tmp, "pg")})
	if err != nil {
		return nil, interruptedOr(ctx, fmt.Errorf("demo: %w", err))
	}
	undo = append(undo, func(c context.Context) {
		if err := cluster.Close(c); err != nil {
			fmt.Fprintf(out, "demo: stopping PostgreSQL: %v\n", err)
		}
	})
	dbURL := cluster.URL("postgres")
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: dbURL, MaxConns: 4})
	if err != nil {
		return nil, interruptedOr(ctx, fmt.Errorf("demo: %w", err))
	}
	undo = append(undo, func(context.Context) { pool.Close() })
	if _, err := fleetpace.Apply(ctx, pool, nil); err != nil {
		return nil, interruptedOr(ctx, fmt.Errorf("demo: schema: %w", err))
	}

	// The destination.
	tl := newTimeline(cfg.Duration)
	dest, err := fakedest.New(fakedest.Config{Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	for _, p := range specs {
		if p.destRate > 0 {
			if err := dest.SetRule(p.prefix(), fakedest.Rule{Rate: p.destRate, Burst: p.destBurst}); err != nil {
				return nil, err
			}
		}
	}
	if err := dest.Start(); err != nil {
		return nil, err
	}
	undo = append(undo, func(context.Context) { _ = dest.Close() })

	if err := setup(ctx, pool, dest.URL(), cfg.Sources, tl); err != nil {
		return nil, interruptedOr(ctx, err)
	}

	// The workers.
	fmt.Fprintf(out, "demo: %d platforms, %d sources, destination %s, %d workers, %s\n",
		len(specs), cfg.Sources, dest.URL(), cfg.Workers, cfg.Duration)
	fleet, err := workers.Start(workers.Config{Executable: cfg.Executable, Args: workerArgs(dbURL, tmp), N: cfg.Workers,
		Dir: tmp, Grace: workerSoftStop + 10*time.Second})
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	stopWorkers := func(c context.Context) {
		if err := fleet.Stop(c); err != nil {
			fmt.Fprintf(out, "demo: %v\n", err)
		}
	}
	undo = append(undo, stopWorkers)
	dest.Reset() // the chart's time 0: the workers are starting
	origin := dest.Origin()

	// Run: sample, draw, switch the cooldown platform's rule on schedule.
	mon := newMonitor(cfg, pool, dest, origin, out)
	runErr := mon.run(ctx, fleet, tl)
	interrupted := errors.Is(runErr, ErrInterrupted)
	if runErr != nil && !interrupted {
		return nil, runErr
	}
	mon.finish()

	// Stop the workers before reading the destination's record, so nothing
	// arrives after the verdict.
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	stopWorkers(stopCtx) // once: the undo step then does nothing
	cancel()

	sum = mon.summary(ctx, tl)
	sum.TempDir, sum.Interrupted, sum.ChartPath = tmp, interrupted, chartPath
	if err := writeChart(chartPath, mon, sum); err != nil {
		fmt.Fprintf(out, "demo: chart: %v\n", err)
		sum.ChartPath = ""
	}
	writeSummary(out, sum)
	switch {
	case interrupted:
		return sum, ErrInterrupted
	case !sum.OK():
		var parts []string
		for _, p := range sum.Platforms {
			if p.Exceeded {
				parts = append(parts, fmt.Sprintf("%s: %d requests in the 1-s window starting at +%.2fs (ceiling %g/s + burst %d = %d)",
					p.Name, p.MaxIn1s, p.MaxWindow, p.Ceiling, p.Burst, p.Limit))
			}
		}
		return sum, fmt.Errorf("%w: %s", ErrCeilingExceeded, strings.Join(parts, "; "))
	}
	return sum, nil
}

func interruptedOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ErrInterrupted
	}
	return err
}

// workerSoftStop is the workers' --soft-stop: short, fetches are fast here.
const workerSoftStop = 2 * time.Second

// workerArgs are the flags of every demo worker. --data-dir names the demo's
// directory (it is not used: --database-url wins), so every process the demo
// started can be found by it. The workers get no FLEETPACE_* variable from
// the demo's environment (package workers removes them): only these flags
// decide what they do.
func workerArgs(dbURL, tmp string) []string {
	return []string{
		"worker",
		"--database-url", dbURL,
		"--data-dir", filepath.Join(tmp, "pg"),
		"--allow-private-networks",
		"--http-addr", "",
		"--startup-jitter", "500ms",
		"--poll-base", "500ms",
		"--poll-max", "2s",
		"--soft-stop", workerSoftStop.String(),
		"--rate-limited-after", rateLimitedAfter.String(),
		"--heartbeat", "2s",
		"--max-pacer-wait", "2s",
		"--log-level", "warn",
		"-q",
	}
}

// setup creates the platforms and the sources, pointing at the destination.
func setup(ctx context.Context, pool *pgxpool.Pool, destURL string, n int, tl timeline) error {
	for _, s := range specs {
		p := sources.Platform{Name: s.name, RatePerSec: s.rate, Burst: s.burst, DecayAfter: s.decayAfter}
		if s.cooldown {
			p.Cooldown = tl.retryAfter
		}
		if _, err := sources.SetPlatform(ctx, pool, p); err != nil {
			return fmt.Errorf("demo: platform %s: %w", s.name, err)
		}
	}
	var b strings.Builder
	b.WriteString("platform,url,interval\n")
	for i := range n {
		s := specs[i%len(specs)]
		// A short interval keeps every platform busy above its ceiling for
		// the whole run.
		fmt.Fprintf(&b, "%s,%s%s%d,2s\n", s.name, destURL, s.prefix(), i/len(specs)+1)
	}
	if _, err := sourcefile.Import(ctx, pool, strings.NewReader(b.String()), sourcefile.Options{}); err != nil {
		return fmt.Errorf("demo: sources: %w", err)
	}
	return nil
}

// windowMax is the largest number of times within one half-open window
// [t, t+w) and the earliest t where it is reached.
func windowMax(times []time.Time, w time.Duration) (int, time.Time) {
	sorted := append([]time.Time(nil), times...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Before(sorted[j]) })
	best, lo := 0, 0
	var at time.Time
	for hi := range sorted {
		for sorted[hi].Sub(sorted[lo]) >= w {
			lo++
		}
		if hi-lo+1 > best {
			best, at = hi-lo+1, sorted[lo]
		}
	}
	return best, at
}

// checkWritable fails if path cannot be created or written, leaving nothing
// behind.
func checkWritable(path string) error {
	if _, err := os.Stat(path); err == nil {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		return f.Close()
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(path)
}
