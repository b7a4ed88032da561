package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"path/filepath"
	"time"
)

// AdaptConfig configures the adaptive-pacing benchmark: real worker
// processes, the real pacer, destinations that allow less than the
// ceiling (fake ones, or a real nginx with Nginx), every model run with its
// schedules side by side. The zero value means defaults (but for
// DatabaseURL).
type AdaptConfig struct {
	// Processes are the workers (the tables are emptied before every run)
	// and where the benchmark reports: Dir receives nginx's logs too,
	// Progress a line every 10 s and one per run. Workers defaults to
	// DefaultAdaptWorkers; Concurrency to enough job slots that no
	// platform waits for one — every source's job can sleep on the pacer at
	// once (the oracle's up to 5 s): the run's sources / workers, at
	// least 50.
	Processes
	// Ceiling is every platform's configured rate, requests/s. Default 20.
	Ceiling float64
	// Duration is one run of one model (its schedules side by side). Default
	// 2 minutes; a model with a fixed window longer than 1 s runs at least
	// 4.5 of its windows, so the last half holds two whole ones.
	Duration time.Duration
	// Runs is how many runs; every figure is the median. Default 3.
	Runs int
	// Models are the destination models to run: names as in Models() (or
	// NginxModels with Nginx), or path.Match patterns ("window*"). Default:
	// all of them (without headers for a sweep).
	Models []string
	// Sweep replaces the schedules: "" (default, classic, aws and oracle side
	// by side), "decay" (the multiplier with decay_after ∈ SweepDecay) or
	// "factors" (backoff × recovery factors ∈ SweepBackoff ×
	// SweepRecovery). Sweeps run the models without headers.
	Sweep string
	// Nginx runs the models against a real nginx the benchmark starts
	// (NginxModels: limit_req without burst and with burst=5 nodelay, one
	// zone per schedule) instead of the fake destinations.
	Nginx bool
	// NginxRate is nginx's limit_req rate, requests/s (with Nginx).
	// Default DefaultAdaptNginxRate.
	NginxRate int
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
	DefaultAdaptNginxRate   = 8
)

func (c *AdaptConfig) setDefaults() error {
	c.Ceiling = cmp.Or(c.Ceiling, DefaultAdaptCeiling)
	c.Duration = cmp.Or(c.Duration, DefaultAdaptDuration)
	c.Runs = cmp.Or(c.Runs, DefaultAdaptRuns)
	c.NginxRate = cmp.Or(c.NginxRate, DefaultAdaptNginxRate)
	return c.Processes.setDefaults("AdaptConfig", DefaultAdaptWorkers, 0) // Concurrency: Adapt sizes it to the run
}

// knownModels are the models a run may choose from.
func (c AdaptConfig) knownModels() []Model {
	if c.Nginx {
		return NginxModels(cmp.Or(c.NginxRate, DefaultAdaptNginxRate))
	}
	return Models()
}

// models are the models to run.
func (c AdaptConfig) models() ([]Model, error) {
	if len(c.Models) > 0 {
		return selectModels(c.Models, c.knownModels())
	}
	var out []Model
	for _, m := range c.knownModels() {
		if c.Sweep == "" || !m.announces() {
			out = append(out, m)
		}
	}
	return out, nil
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
	case c.Duration > 24*time.Hour:
		return fmt.Errorf("%w: bench.AdaptConfig.Duration must be ≤ 24h, got %s", ErrInvalidConfig, c.Duration)
	case c.Runs < 0:
		return fmt.Errorf("%w: bench.AdaptConfig.Runs must be ≥ 1 (0: default), got %d", ErrInvalidConfig, c.Runs)
	case c.Sweep != "" && c.Sweep != "decay" && c.Sweep != "factors":
		return fmt.Errorf("%w: bench.AdaptConfig.Sweep must be decay or factors, got %q", ErrInvalidConfig, c.Sweep)
	case c.NginxRate < 0 || c.NginxRate > 1000:
		return fmt.Errorf("%w: bench.AdaptConfig.NginxRate must be in [1, 1000] requests/s (0: default), got %d", ErrInvalidConfig, c.NginxRate)
	}
	_, err := c.models()
	return err
}

// cell is one platform of a run: a model under a schedule.
type cell struct {
	model    Model
	schedule Schedule
	platform string
}

// adaptConcurrency is each worker's default concurrency: enough for every
// source's job of a run to sleep on the pacer at once, at least
// DefaultAdaptConcurrency.
func adaptConcurrency(schedules []Schedule, ceiling float64, workers int) int {
	jobs := 0
	for _, sc := range schedules {
		jobs += cell{schedule: sc}.sources(adaptSources(ceiling), workers)
	}
	return max(DefaultAdaptConcurrency, (jobs+workers-1)/workers)
}

// sources is how many sources the cell polls: n, or n per worker for the
// oracle. Its processes pace fixed shares, and River hands a process the
// jobs it fetches first, unevenly (25–31 of a platform's 60 sleeping in
// one process, 0–3 in another, seen in river_job): with the jobs the other
// schedules get, the slots of a process short of jobs went unused and the
// oracle read 0.75–0.90 at 7–14/s with nothing refused. A shared pace has
// no such loss: a slot goes to whichever process asks.
func (c cell) sources(n, workers int) int {
	if c.schedule.Name == ScheduleOracle {
		return n * workers
	}
	return n
}

// prefix is the cell's path prefix at its destination.
func (c cell) prefix() string { return "/" + c.platform + "/" }

// Adapt runs the benchmark: one run per model at a time, its schedules side
// by side on destinations of their own, Runs times.
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
	models, err := cfg.models()
	if err != nil {
		return nil, err
	}
	dir, pool, release, err := cfg.open(ctx, "adapt")
	if err != nil {
		return nil, err
	}
	defer release()

	schedules := cfg.schedules()
	if cfg.Concurrency == 0 {
		cfg.Concurrency = adaptConcurrency(schedules, cfg.Ceiling, cfg.Workers)
	}
	res := &AdaptResult{Workers: cfg.Workers, Concurrency: cfg.Concurrency, Ceiling: cfg.Ceiling,
		Duration: cfg.Duration.String(), Runs: cfg.Runs, Sweep: cfg.Sweep, Nginx: cfg.Nginx, Schedules: schedules,
		LoadBefore: loadAverage()}
	fmt.Fprintf(cfg.Progress, "bench adapt: %d model(s) × %d schedule(s) × %d run(s); load average %s\n", len(models), len(schedules), cfg.Runs, res.LoadBefore)
	type key struct{ model, schedule int }
	runs := map[key][]RunFigures{}
	durations := make([]time.Duration, len(models))
	for run := 1; run <= cfg.Runs; run++ {
		// One model at a time and nothing else on the machine: a run of
		// every model at once loads two cores enough to blur the strict
		// ones.
		for i, m := range models {
			d := cfg.Duration
			if m.Window > time.Second {
				d = max(d, 4*m.Window+m.Window/2) // two whole windows in the last half
			}
			durations[i] = d
			var cells []cell
			for _, s := range schedules {
				cells = append(cells, cell{model: m, schedule: s, platform: m.Name + "." + s.Name})
			}
			figs, err := adaptRun(ctx, cfg, pool, cells, d, filepath.Join(dir, fmt.Sprintf("run-%d-%s", run, m.Name)), run)
			if err != nil {
				return nil, fmt.Errorf("bench adapt: run %d of %s: %w", run, m.Name, err)
			}
			for j := range schedules {
				runs[key{i, j}] = append(runs[key{i, j}], figs[j])
			}
		}
	}
	bound := int(cfg.Ceiling) + 1 // the platforms' burst
	for i, m := range models {
		for j, s := range schedules {
			c := cell{model: m, schedule: s}
			res.Rows = append(res.Rows, medianRow(c, bound, m.allowance(cfg.Ceiling, 0, durations[i]), runs[key{i, j}]))
		}
	}
	res.judge()
	res.LoadAfter = loadAverage()
	return res, nil
}
