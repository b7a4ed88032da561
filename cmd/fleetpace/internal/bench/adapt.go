package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/fleetpace/fleetpace/sources"
)

// AdaptConfig configures the adaptive-pacing benchmark: real worker
// processes, the real pacer, fake destinations that allow less than the
// ceiling. The zero value means defaults (but for DatabaseURL).
type AdaptConfig struct {
	// DatabaseURL is a scratch database with the schema applied; the
	// benchmark empties fleetpace's tables and River's jobs before every
	// run. Required.
	DatabaseURL string
	// Executable is the fleetpace binary the workers run. Default: this
	// process's own executable.
	Executable string
	// Workers is how many worker processes. Default DefaultAdaptWorkers.
	Workers int
	// Concurrency is each worker's --concurrency. Default: enough job slots
	// that no platform waits for one — every platform's jobs sleep on the
	// pacer at once, each up to the workers' --max-pacer-wait (1 s):
	// 1.5 × platforms of a run × ceiling × 1 s / workers, at least 50.
	Concurrency int
	// Ceiling is every platform's configured rate, requests/s. Default 20.
	Ceiling float64
	// Duration is one run of one model (its schedules side by side). Default
	// 2 minutes; a model with a long fixed window runs at least 4.5 of its
	// windows, so the steady half holds two whole ones.
	Duration time.Duration
	// Runs is how many runs; every figure is the median. Default 3.
	Runs int
	// Models are the destination models to run (names as in Models()).
	// Default: all.
	Models []string
	// Sweep replaces the schedules: "" (the seed's schedule and the
	// defaults), "decay" (the defaults with decay_after ∈ SweepDecay) or
	// "factors" (backoff × recovery factors ∈ SweepBackoff × SweepRecovery).
	// Sweeps run the models without headers.
	Sweep string
	// Dir receives the workers' logs. Default: a temporary directory,
	// removed afterwards.
	Dir string
	// Progress receives a line every 10 s and one per run. Default: none.
	Progress io.Writer
	// Logger. Default: discard.
	Logger *slog.Logger
}

// Sweep values.
var (
	SweepDecay    = []int{10, 30, 100, 300, 1000}
	SweepBackoff  = []float64{1.25, 1.5, 2}
	SweepRecovery = []float64{1.1, 1.25, 2}
)

// Defaults of AdaptConfig.
const (
	DefaultAdaptWorkers     = 3
	DefaultAdaptConcurrency = 50
	DefaultAdaptCeiling     = 20.0
	DefaultAdaptDuration    = 2 * time.Minute
	DefaultAdaptRuns        = 3
)

func (c *AdaptConfig) setDefaults() error {
	if c.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench: AdaptConfig.Executable: %w", err)
		}
		c.Executable = exe
	}
	if c.Workers == 0 {
		c.Workers = DefaultAdaptWorkers
	}
	if c.Ceiling == 0 {
		c.Ceiling = DefaultAdaptCeiling
	}
	if c.Duration == 0 {
		c.Duration = DefaultAdaptDuration
	}
	if c.Runs == 0 {
		c.Runs = DefaultAdaptRuns
	}
	if len(c.Models) == 0 {
		for _, m := range Models() {
			if c.Sweep == "" || m.Headers == fakedest.None {
				c.Models = append(c.Models, m.Name)
			}
		}
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig (zero
// fields are defaults; DatabaseURL is checked by Adapt).
func (c AdaptConfig) Validate() error {
	switch {
	case c.Workers < 0:
		return fmt.Errorf("%w: bench.AdaptConfig.Workers must be ≥ 1 (0: default), got %d", ErrInvalidConfig, c.Workers)
	case c.Concurrency < 0:
		return fmt.Errorf("%w: bench.AdaptConfig.Concurrency must be ≥ 1 (0: default), got %d", ErrInvalidConfig, c.Concurrency)
	case math.IsNaN(c.Ceiling) || c.Ceiling < 0 || (c.Ceiling > 0 && c.Ceiling < 1) || c.Ceiling > 1000:
		return fmt.Errorf("%w: bench.AdaptConfig.Ceiling must be in [1, 1000] (0: default), got %g", ErrInvalidConfig, c.Ceiling)
	case c.Duration != 0 && c.Duration < 30*time.Second:
		return fmt.Errorf("%w: bench.AdaptConfig.Duration must be ≥ 30s (0: default), got %s", ErrInvalidConfig, c.Duration)
	case c.Runs < 0:
		return fmt.Errorf("%w: bench.AdaptConfig.Runs must be ≥ 1 (0: default), got %d", ErrInvalidConfig, c.Runs)
	case c.Sweep != "" && c.Sweep != "decay" && c.Sweep != "factors":
		return fmt.Errorf("%w: bench.AdaptConfig.Sweep must be decay or factors, got %q", ErrInvalidConfig, c.Sweep)
	}
	for _, name := range c.Models {
		if _, ok := modelByName(name); !ok {
			return fmt.Errorf("%w: bench.AdaptConfig.Models: unknown model %q (known: %s)", ErrInvalidConfig, name, strings.Join(modelNames(), ", "))
		}
	}
	return nil
}

// Model is a fake destination that allows less than the ceiling.
type Model struct {
	Name string
	// Share is the part of the ceiling the destination allows.
	Share float64
	// Burst is a token bucket's capacity; Window, if set, makes it a fixed
	// window instead.
	Burst  int
	Window time.Duration
	// Headers is the rate-limit header family it announces.
	Headers fakedest.HeaderStyle
	// Drop: the allowance drops from Share to DropShare a third into the run
	// and comes back two thirds in.
	Drop      bool
	DropShare float64
}

// rule is the model's fake-destination rule at share s of ceiling c.
func (m Model) rule(c, s float64) fakedest.Rule {
	if m.Window > 0 {
		return fakedest.Rule{Window: m.Window, WindowLimit: int(math.Round(c * s * m.Window.Seconds())), Headers: m.Headers}
	}
	return fakedest.Rule{Rate: c * s, Burst: max(m.Burst, 1), Headers: m.Headers}
}

// allowance is what the model allows at t into a run of length d, in
// requests/s.
func (m Model) allowance(c float64, t, d time.Duration) float64 {
	if m.Drop && t >= d/3 && t < 2*d/3 {
		return c * m.DropShare
	}
	return c * m.Share
}

// Models are the benchmark's destination models: strict spacing (a token
// bucket of capacity 1) at 40 % and 70 % of the ceiling, a token bucket of
// capacity 10 at 50 %, fixed 1-s and 60-s windows at 50 %, each again with
// X-RateLimit-* headers, one with the IETF RateLimit fields, and a limit
// that drops from 80 % to 30 % and comes back (with and without headers).
func Models() []Model {
	base := []Model{
		{Name: "strict-40", Share: 0.4, Burst: 1},
		{Name: "strict-70", Share: 0.7, Burst: 1},
		{Name: "bucket10-50", Share: 0.5, Burst: 10},
		{Name: "window1s-50", Share: 0.5, Window: time.Second},
		{Name: "window60s-50", Share: 0.5, Window: time.Minute},
	}
	out := slices.Clone(base)
	for _, m := range base {
		m.Name += "-xrl"
		m.Headers = fakedest.XRateLimit
		out = append(out, m)
	}
	out = append(out,
		Model{Name: "bucket10-50-ietf", Share: 0.5, Burst: 10, Headers: fakedest.IETF},
		Model{Name: "drop-80-30", Share: 0.8, Burst: 1, Drop: true, DropShare: 0.3},
		Model{Name: "drop-80-30-xrl", Share: 0.8, Burst: 1, Drop: true, DropShare: 0.3, Headers: fakedest.XRateLimit},
	)
	return out
}

func modelByName(name string) (Model, bool) {
	for _, m := range Models() {
		if m.Name == name {
			return m, true
		}
	}
	return Model{}, false
}

func modelNames() []string {
	var out []string
	for _, m := range Models() {
		out = append(out, m.Name)
	}
	return out
}

// Schedule is how a platform adapts: its sources.Platform settings.
type Schedule struct {
	Name       string  `json:"name"`
	Backoff    float64 `json:"backoff_factor"`
	Recovery   float64 `json:"recovery_factor"`
	DecayAfter int     `json:"decay_after"`
	Probe      bool    `json:"probe"`
	Headers    bool    `json:"use_headers"`
	Respace    bool    `json:"respace"`
}

// SeedSchedule is fleetpace before adaptive pacing: ×2 on pressure, ÷2
// after 100 clean responses, no probing, no headers, slots already granted
// used as granted.
var SeedSchedule = Schedule{Name: "seed", Backoff: 2, Recovery: 2, DecayAfter: 100}

// DefaultSchedule is a new platform's: the defaults of package sources.
func DefaultSchedule() Schedule {
	return Schedule{Name: "default", Backoff: sources.DefaultBackoffFactor, Recovery: sources.DefaultRecoveryFactor,
		DecayAfter: sources.DefaultDecayAfter, Probe: true, Headers: true, Respace: true}
}

func (c *AdaptConfig) schedules() []Schedule {
	switch c.Sweep {
	case "decay":
		var out []Schedule
		for _, n := range SweepDecay {
			s := DefaultSchedule()
			s.Name, s.DecayAfter = fmt.Sprintf("n%d", n), n
			out = append(out, s)
		}
		return out
	case "factors":
		var out []Schedule
		for _, f := range SweepBackoff {
			for _, r := range SweepRecovery {
				s := DefaultSchedule()
				s.Name = strings.ReplaceAll(fmt.Sprintf("f%g-r%g", f, r), ".", "_")
				s.Backoff, s.Recovery = f, r
				out = append(out, s)
			}
		}
		return out
	}
	return []Schedule{SeedSchedule, DefaultSchedule()}
}

// AdaptRow is one (model, schedule) cell: medians over the runs.
type AdaptRow struct {
	Model    string `json:"model"`
	Schedule string `json:"schedule"`
	Headers  bool   `json:"headers"`
	// Goodput is successful requests per second in the steady half (for a
	// 60-s window, its whole windows) over what the destination allows.
	Goodput float64 `json:"goodput"`
	// LimitedShare is the share of requests refused (429) in the steady half.
	LimitedShare float64 `json:"limited_share"`
	// Settle is when, counted from the start, every later 5-s span had
	// goodput ≥ 0.75 and a refused share ≤ 10 % (-1: never).
	Settle float64 `json:"settle_s"`
	// OldSpacing is how many requests reached the destination between the
	// first 429 of the run and the end of the Retry-After it sent: requests
	// sent at the old spacing, not held (-1: no 429 at all).
	OldSpacing float64 `json:"old_spacing_requests"`
	// MaxWindow is the largest number of requests in any 1-s window of the
	// run; Bound is ceiling + burst, which it must never exceed.
	MaxWindow int `json:"max_1s_window"`
	Bound     int `json:"bound"`
	// DropStop (drop models) is how long after the drop the 429s stopped
	// (the start of the first 10-s span without one), -1 if they did not.
	DropStop float64 `json:"drop_429s_stop_s,omitempty"`
	// Per-run values, in run order.
	GoodputRuns    []float64 `json:"goodput_runs"`
	SharedRuns     []float64 `json:"limited_share_runs"`
	OldSpacingRuns []float64 `json:"old_spacing_runs"`
	DropStopRuns   []float64 `json:"drop_429s_stop_runs,omitempty"`
}

// AdaptResult is the benchmark's outcome.
type AdaptResult struct {
	Workers     int        `json:"workers"`
	Concurrency int        `json:"concurrency"`
	Ceiling     float64    `json:"ceiling_per_sec"`
	Duration    string     `json:"duration"`
	Runs        int        `json:"runs"`
	Sweep       string     `json:"sweep,omitempty"`
	Schedules   []Schedule `json:"schedules"`
	Rows        []AdaptRow `json:"rows"`
}

// Targets (issue: adaptive pacing). Without headers: goodput ≥ 0.85 and a
// refused share ≤ 3 %; with headers: ≥ 0.95 and ≤ 0.5 %; after a limit
// drop, 429s stop within 5 s; no 1-s window over ceiling + burst.
const (
	AdaptGoodputTarget        = 0.85
	AdaptShareTarget          = 0.03
	AdaptHeaderGoodputTarget  = 0.95
	AdaptHeaderShareTarget    = 0.005
	AdaptDropStopTarget       = 5.0
	adaptSourceInterval       = 2 * time.Second
	adaptSettleSpan           = 5 * time.Second
	adaptSettleGoodput        = 0.75
	adaptSettleShare          = 0.10
	adaptDropQuietSpan        = 10 * time.Second
	adaptProgressEvery        = 10 * time.Second
	adaptMaxPacerWait         = time.Second
	adaptWorkerPollBase       = "200ms"
	adaptWorkerPollMax        = "1s"
	adaptWorkerHeartbeat      = "2s"
	adaptWorkerRateLimitAfter = "2m"
)

// cell is one platform of a run.
type cell struct {
	model    Model
	schedule Schedule
	platform string
}

// Adapt runs the benchmark.
func Adapt(ctx context.Context, cfg AdaptConfig) (*AdaptResult, error) {
	if cfg.DatabaseURL == "" {
		return nil, fmt.Errorf("%w: bench.AdaptConfig.DatabaseURL is required", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	dir, pool, release, err := procEnv(ctx, cfg.DatabaseURL, cfg.Dir, "adapt")
	if err != nil {
		return nil, err
	}
	defer release()

	var cells []cell
	for _, name := range cfg.Models {
		m, _ := modelByName(name)
		for _, s := range cfg.schedules() {
			cells = append(cells, cell{model: m, schedule: s, platform: m.Name + "." + s.Name})
		}
	}
	if cfg.Concurrency == 0 {
		perRun := len(cfg.schedules())
		cfg.Concurrency = max(DefaultAdaptConcurrency,
			int(math.Ceil(1.5*float64(perRun)*cfg.Ceiling*adaptMaxPacerWait.Seconds()/float64(cfg.Workers))))
	}
	res := &AdaptResult{Workers: cfg.Workers, Concurrency: cfg.Concurrency, Ceiling: cfg.Ceiling,
		Duration: cfg.Duration.String(), Runs: cfg.Runs, Sweep: cfg.Sweep, Schedules: cfg.schedules()}
	// One run per model: its schedules side by side on destinations of
	// their own, and nothing else on the machine (a run of every model at
	// once loads two cores enough to blur the strict ones).
	perRun := make([][]AdaptRow, len(cells))
	for run := 1; run <= cfg.Runs; run++ {
		for _, name := range cfg.Models {
			var idx []int
			var group []cell
			for i, c := range cells {
				if c.model.Name == name {
					idx, group = append(idx, i), append(group, c)
				}
			}
			gcfg := cfg
			if m := group[0].model; m.Window > time.Second {
				// Two whole windows in the steady half, at least.
				gcfg.Duration = max(cfg.Duration, 4*m.Window+m.Window/2)
			}
			rows, err := adaptRun(ctx, gcfg, pool, group, filepath.Join(dir, fmt.Sprintf("run-%d-%s", run, name)), run)
			if err != nil {
				return nil, fmt.Errorf("bench adapt: run %d of %s: %w", run, name, err)
			}
			for k, r := range rows {
				perRun[idx[k]] = append(perRun[idx[k]], r)
			}
		}
	}
	for i, c := range cells {
		res.Rows = append(res.Rows, medianRow(c, perRun[i]))
	}
	return res, nil
}

// adaptRun runs every cell once, on fresh tables, with a fresh fleet.
func adaptRun(ctx context.Context, cfg AdaptConfig, pool *pgxpool.Pool, cells []cell, dir string, run int) ([]AdaptRow, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `TRUNCATE fleetpace_source, fleetpace_cooldown, fleetpace_pace, fleetpace_platform, river_job CASCADE`); err != nil {
		return nil, fmt.Errorf("empty the tables: %w", err)
	}
	dest, err := fakedest.New(fakedest.Config{Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	if err := dest.Start(); err != nil {
		return nil, err
	}
	defer dest.Close()

	var csv strings.Builder
	csv.WriteString("platform,url,interval\n")
	perPlatform := int(math.Ceil(cfg.Ceiling * adaptSourceInterval.Seconds() * 1.5))
	for _, c := range cells {
		s := c.schedule
		p := sources.Platform{Name: c.platform, RatePerSec: cfg.Ceiling, Burst: 1,
			BackoffFactor: s.Backoff, RecoveryFactor: s.Recovery, DecayAfter: s.DecayAfter,
			NoProbe: !s.Probe, IgnoreHeaders: !s.Headers, NoRespace: !s.Respace}
		if _, err := sources.SetPlatform(ctx, pool, p); err != nil {
			return nil, err
		}
		if err := dest.SetRule("/"+c.platform+"/", c.model.rule(cfg.Ceiling, c.model.Share)); err != nil {
			return nil, err
		}
		for i := range perPlatform {
			fmt.Fprintf(&csv, "%s,%s/%s/%d,%s\n", c.platform, dest.URL(), c.platform, i, adaptSourceInterval)
		}
	}
	if _, err := sources.Import(ctx, pool, strings.NewReader(csv.String()), sources.ImportOptions{Format: sources.FormatCSV}); err != nil {
		return nil, err
	}

	fleet, err := workers.Start(workers.Config{Executable: cfg.Executable, Dir: dir, N: cfg.Workers, Args: []string{
		"worker", "--database-url", cfg.DatabaseURL, "-q", "--log-level", "warn",
		"--allow-private-networks", "--http-addr", "", "--startup-jitter", "0",
		"--concurrency", fmt.Sprint(cfg.Concurrency), "--max-pacer-wait", adaptMaxPacerWait.String(),
		"--poll-base", adaptWorkerPollBase, "--poll-max", adaptWorkerPollMax, "--heartbeat", adaptWorkerHeartbeat,
		"--rate-limited-after", adaptWorkerRateLimitAfter,
	}})
	if err != nil {
		return nil, err
	}
	defer fleet.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // stopped below; this is the error path
	start := time.Now()
	fmt.Fprintf(cfg.Progress, "run %d: %d platforms, %d workers, %s\n", run, len(cells), cfg.Workers, cfg.Duration)

	drops := map[string]bool{}
	for _, c := range cells {
		if c.model.Drop {
			drops[c.platform] = true
		}
	}
	phase := 0
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	nextProgress := start.Add(adaptProgressEvery)
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case now := <-ticker.C:
			if err := fleet.Exited(); err != nil {
				return nil, err
			}
			el := now.Sub(start)
			if el >= cfg.Duration {
				goto done
			}
			if want := int(3 * el / cfg.Duration); want != phase && want < 3 {
				phase = want
				for _, c := range cells {
					if c.model.Drop {
						share := c.model.Share
						if phase == 1 {
							share = c.model.DropShare
						}
						if err := dest.SetRule("/"+c.platform+"/", c.model.rule(cfg.Ceiling, share)); err != nil {
							return nil, err
						}
					}
				}
			}
			if !now.Before(nextProgress) {
				nextProgress = nextProgress.Add(adaptProgressEvery)
				reqs := dest.Requests()
				limited := 0
				for _, r := range reqs {
					if r.Limited {
						limited++
					}
				}
				fmt.Fprintf(cfg.Progress, "run %d: %3.0fs: %d requests, %d refused\n", run, el.Seconds(), len(reqs), limited)
			}
		}
	}
done:
	if states, err := pacer.States(ctx, pool); err == nil {
		for _, st := range states {
			fmt.Fprintf(cfg.Progress, "run %d: %-24s multiplier %.3f (pressure %.3f), announced %.2f/s, effective %.2f/s (%s), slow-downs %d\n",
				run, st.Platform, st.Multiplier, st.PressureMultiplier, st.AnnouncedRate, st.EffectiveRate, st.PacedBy, st.Slowdowns)
		}
	}
	if os.Getenv("FLEETPACE_BENCH_ADAPT_TRACE") != "" {
		for _, c := range cells {
			prefix := "/" + c.platform + "/"
			var ok, lim []time.Time
			for _, r := range dest.Requests() {
				if strings.HasPrefix(r.Path, prefix) {
					if r.Limited {
						lim = append(lim, r.Time)
					} else {
						ok = append(ok, r.Time)
					}
				}
			}
			okS, limS := fakedest.RateSeries(ok, start, time.Second), fakedest.RateSeries(lim, start, time.Second)
			fmt.Fprintf(cfg.Progress, "run %d: %s per second ok:  %v\n", run, c.platform, okS)
			fmt.Fprintf(cfg.Progress, "run %d: %s per second 429: %v\n", run, c.platform, limS)
		}
	}
	if err := fleet.Stop(ctx); err != nil {
		cfg.Logger.Warn("bench adapt: stopping the workers", "err", err)
	}
	reqs := dest.Requests()
	rows := make([]AdaptRow, len(cells))
	for i, c := range cells {
		var mine []fakedest.Request
		prefix := "/" + c.platform + "/"
		for _, r := range reqs {
			if strings.HasPrefix(r.Path, prefix) {
				mine = append(mine, r)
			}
		}
		rows[i] = analyze(c, mine, start, cfg.Duration, cfg.Ceiling)
	}
	fmt.Fprintf(cfg.Progress, "run %d: done\n", run)
	return rows, nil
}

// analyze computes one cell's figures from what its destination recorded.
func analyze(c cell, reqs []fakedest.Request, start time.Time, d time.Duration, ceiling float64) AdaptRow {
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Time.Before(reqs[j].Time) })
	row := AdaptRow{Model: c.model.Name, Schedule: c.schedule.Name, Headers: c.model.Headers != fakedest.None,
		Bound: int(ceiling) + 1, Settle: -1, OldSpacing: -1}
	if c.model.Drop {
		row.DropStop = -1
	}
	ok := func(r fakedest.Request) bool { return r.Status >= 200 && r.Status < 400 }
	// Goodput and refused share over the steady half; for a fixed window,
	// over its whole windows inside the steady half.
	from, to := start.Add(d/2), start.Add(d)
	if w := c.model.Window; w > time.Second {
		// Whole windows of the steady half; at least the last whole window
		// of the run.
		from, to = from.Add(w-1).Truncate(w), to.Truncate(w)
		if !from.Before(to) {
			from = to.Add(-w)
		}
	}
	var accepted, limited, total int
	allowed := 0.0
	for t := from; t.Before(to); t = t.Add(100 * time.Millisecond) {
		allowed += c.model.allowance(ceiling, t.Sub(start), d) * 0.1
	}
	var times []time.Time
	for _, r := range reqs {
		times = append(times, r.Time)
		if r.Time.Before(from) || !r.Time.Before(to) {
			continue
		}
		total++
		if r.Limited {
			limited++
		} else if ok(r) {
			accepted++
		}
	}
	if allowed > 0 {
		row.Goodput = float64(accepted) / allowed
	}
	if total > 0 {
		row.LimitedShare = float64(limited) / float64(total)
	}
	row.MaxWindow = fakedest.MaxInWindow(times, time.Second)

	// Settle: the first second from which every 5-s span is healthy.
	spans := int((d - adaptSettleSpan) / time.Second)
	healthy := make([]bool, spans+1)
	for k := 0; k <= spans; k++ {
		a, b := start.Add(time.Duration(k)*time.Second), start.Add(time.Duration(k)*time.Second+adaptSettleSpan)
		var acc, lim, tot int
		for _, r := range reqs {
			if r.Time.Before(a) || !r.Time.Before(b) {
				continue
			}
			tot++
			if r.Limited {
				lim++
			} else if ok(r) {
				acc++
			}
		}
		allow := c.model.allowance(ceiling, time.Duration(k)*time.Second, d) * adaptSettleSpan.Seconds()
		healthy[k] = tot > 0 && float64(acc) >= adaptSettleGoodput*allow && float64(lim) <= adaptSettleShare*float64(tot)
	}
	for k := spans; k >= 0 && healthy[k]; k-- {
		row.Settle = float64(k)
	}
	if c.model.Window >= 10*time.Second {
		row.Settle = -1 // a long window is healthy or not only window by window
	}

	// Requests at the old spacing: arrivals after the first 429 within the
	// Retry-After it sent.
	for i, r := range reqs {
		if !r.Limited {
			continue
		}
		ra := time.Second
		if v := r.RateLimit.Get("Retry-After"); v != "" {
			if d, ok := ratelimit.ParseRetryAfter(v, r.Time); ok {
				ra = d
			}
		}
		n := 0
		for _, q := range reqs[i+1:] {
			if q.Time.Sub(r.Time) >= ra {
				break
			}
			n++
		}
		row.OldSpacing = float64(n)
		break
	}

	// After a drop: when the 429s stopped.
	if c.model.Drop {
		drop := start.Add(d / 3)
		last := drop
		for _, r := range reqs {
			if r.Time.Before(drop) || !r.Time.Before(start.Add(2*d/3)) {
				continue
			}
			if r.Limited {
				if r.Time.Sub(last) >= adaptDropQuietSpan {
					break
				}
				last = r.Time
			}
		}
		if start.Add(2*d/3).Sub(last) >= adaptDropQuietSpan {
			row.DropStop = last.Sub(drop).Seconds()
		}
	}
	return row
}

func medianRow(c cell, runs []AdaptRow) AdaptRow {
	row := runs[0]
	var g, s, o, st, ds []float64
	mw := 0
	for _, r := range runs {
		g, s, o, st = append(g, r.Goodput), append(s, r.LimitedShare), append(o, r.OldSpacing), append(st, r.Settle)
		if c.model.Drop {
			ds = append(ds, r.DropStop)
		}
		mw = max(mw, r.MaxWindow)
	}
	row.Goodput, row.LimitedShare, row.OldSpacing, row.Settle = median(g), median(s), median(o), median(st)
	row.MaxWindow = mw
	row.GoodputRuns, row.SharedRuns, row.OldSpacingRuns = g, s, o
	if c.model.Drop {
		row.DropStop, row.DropStopRuns = median(ds), ds
	}
	return row
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Met reports whether a row meets its targets.
func (r AdaptRow) Met() bool {
	if r.MaxWindow > r.Bound {
		return false
	}
	if r.DropStop != 0 && (r.DropStop < 0 || r.DropStop > AdaptDropStopTarget) {
		return false
	}
	if strings.HasPrefix(r.Model, "drop") {
		return true
	}
	if r.Headers {
		return r.Goodput >= AdaptHeaderGoodputTarget && r.LimitedShare <= AdaptHeaderShareTarget
	}
	return r.Goodput >= AdaptGoodputTarget && r.LimitedShare <= AdaptShareTarget
}

// WriteText prints the table.
func (r *AdaptResult) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "bench adapt: %d workers × concurrency %d, ceiling %g/s, %s per run of a model, medians of %d run(s)\n",
		r.Workers, r.Concurrency, r.Ceiling, r.Duration, r.Runs)
	for _, s := range r.Schedules {
		fmt.Fprintf(w, "  schedule %-8s backoff ×%g, recovery ÷%g per %d clean, probe %v, headers %v, respace %v\n",
			s.Name, s.Backoff, s.Recovery, s.DecayAfter, s.Probe, s.Headers, s.Respace)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\tschedule\tgoodput\t429 share\tsettle\told spacing\tmax 1 s\tafter drop\ttargets\t")
	for _, row := range r.Rows {
		settle, old, drop := "-", "-", "-"
		if row.Settle >= 0 {
			settle = fmt.Sprintf("%.0fs", row.Settle)
		}
		if row.OldSpacing >= 0 {
			old = fmt.Sprintf("%.0f", row.OldSpacing)
		}
		if strings.HasPrefix(row.Model, "drop") {
			drop = "never"
			if row.DropStop >= 0 {
				drop = fmt.Sprintf("%.1fs", row.DropStop)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.1f%%\t%s\t%s\t%d/%d\t%s\t%s\t\n", row.Model, row.Schedule, row.Goodput,
			100*row.LimitedShare, settle, old, row.MaxWindow, row.Bound, drop, map[bool]string{true: "met", false: "missed"}[row.Met()])
	}
	return tw.Flush()
}

// WriteJSON prints the result as JSON.
func (r *AdaptResult) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
