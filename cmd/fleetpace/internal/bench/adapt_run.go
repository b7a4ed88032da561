package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/nginxrun"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

// Settings of the workers and sources of a run.
const (
	adaptSourceInterval       = 2 * time.Second
	adaptProgressEvery        = 10 * time.Second
	adaptMaxPacerWait         = time.Second
	adaptWorkerPollBase       = "200ms"
	adaptWorkerPollMax        = "1s"
	adaptWorkerHeartbeat      = "2s"
	adaptWorkerRateLimitAfter = "2m"
)

// destination is where a run's requests go: one path prefix per cell.
type destination interface {
	url() string
	// arrivals are the requests under prefix so far.
	arrivals(prefix string) ([]arrival, error)
	close() error
}

// fakeDestination is fakedest, one rule per cell.
type fakeDestination struct{ srv *fakedest.Server }

func (f fakeDestination) url() string  { return f.srv.URL() }
func (f fakeDestination) close() error { return f.srv.Close() }

func (f fakeDestination) arrivals(prefix string) ([]arrival, error) {
	var out []arrival
	for _, r := range f.srv.Requests() {
		if !strings.HasPrefix(r.Path, prefix) {
			continue
		}
		a := arrival{At: r.Time, Status: r.Status, Limited: r.Limited}
		if v := r.RateLimit.Get("Retry-After"); v != "" {
			if d, ok := ratelimit.ParseRetryAfter(v, r.Time); ok {
				a.RetryAfter = d
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// nginxDestination is a real nginx, one location and limit_req zone per
// cell, judged from its access log.
type nginxDestination struct{ srv *nginxrun.Server }

func (n nginxDestination) url() string  { return n.srv.URL() }
func (n nginxDestination) close() error { return n.srv.Stop() }

func (n nginxDestination) arrivals(prefix string) ([]arrival, error) {
	entries, err := n.srv.Entries()
	if err != nil {
		return nil, err
	}
	var out []arrival
	for _, e := range entries {
		if strings.HasPrefix(e.URI, prefix) {
			out = append(out, arrival{At: e.Time, Status: e.Status, Limited: e.Status == 429})
		}
	}
	return out, nil
}

// openDestination starts a run's destination: nginx for nginx models,
// else fakedest with each cell's rule at its model's starting share.
func openDestination(ctx context.Context, cfg AdaptConfig, cells []cell, dir string, files int) (destination, error) {
	if cells[0].model.nginx() {
		var locs []nginxrun.Location
		for _, c := range cells {
			locs = append(locs, nginxrun.Location{Prefix: c.prefix(), Rate: c.model.NginxRate, Burst: c.model.NginxBurst, Files: files})
		}
		ndir := filepath.Join(dir, "nginx")
		if err := os.MkdirAll(ndir, 0o755); err != nil {
			return nil, err
		}
		srv, err := nginxrun.Start(ctx, nginxrun.Config{Dir: ndir, Locations: locs})
		if err != nil {
			return nil, err
		}
		return nginxDestination{srv}, nil
	}
	srv, err := fakedest.New(fakedest.Config{Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	for _, c := range cells {
		if err := srv.SetRule(c.prefix(), c.model.rule(cfg.Ceiling, c.model.Share)); err != nil {
			return nil, err
		}
	}
	if err := srv.Start(); err != nil {
		return nil, err
	}
	return fakeDestination{srv}, nil
}

// adaptSources is how many sources a platform polls (the oracle: that
// many per worker): 1.5 × what the ceiling takes at adaptSourceInterval.
func adaptSources(ceiling float64) int {
	return int(math.Ceil(ceiling * adaptSourceInterval.Seconds() * 1.5))
}

// adaptRun runs one model's cells once, side by side, on fresh tables with
// a fresh fleet, for d, and returns each cell's figures.
func adaptRun(ctx context.Context, cfg AdaptConfig, pool *pgxpool.Pool, cells []cell, d time.Duration, dir string, run int) ([]RunFigures, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `TRUNCATE fleetpace_source, fleetpace_cooldown, fleetpace_pace, fleetpace_platform, river_job CASCADE`); err != nil {
		return nil, fmt.Errorf("empty the tables: %w", err)
	}
	perPlatform := adaptSources(cfg.Ceiling)
	dest, err := openDestination(ctx, cfg, cells, dir, perPlatform*cfg.Workers)
	if err != nil {
		return nil, err
	}
	defer dest.close() //nolint:errcheck // closed below; this is the error path

	var csv strings.Builder
	csv.WriteString("platform,url,interval\n")
	for _, c := range cells {
		if _, err := sources.SetPlatform(ctx, pool, c.schedule.platform(c.platform, cfg.Ceiling)); err != nil {
			return nil, err
		}
		for i := range c.sources(perPlatform, cfg.Workers) {
			fmt.Fprintf(&csv, "%s,%s%s%d,%s\n", c.platform, dest.url(), c.prefix(), i, adaptSourceInterval)
		}
	}
	if _, err := sourcefile.Import(ctx, pool, strings.NewReader(csv.String()), sourcefile.Options{Format: sourcefile.FormatCSV}); err != nil {
		return nil, err
	}

	// The run starts now: the model's steps and the oracle's follow this
	// instant, by the wall clock.
	start := time.Now()
	args := []string{
		"worker", "--database-url", cfg.DatabaseURL, "-q", "--log-level", "warn",
		"--allow-private-networks", "--http-addr", "", "--startup-jitter", "0",
		"--concurrency", fmt.Sprint(cfg.Concurrency), "--max-pacer-wait", adaptMaxPacerWait.String(),
		"--poll-base", adaptWorkerPollBase, "--poll-max", adaptWorkerPollMax, "--heartbeat", adaptWorkerHeartbeat,
		"--rate-limited-after", adaptWorkerRateLimitAfter,
	}
	perProcess := func(i int) []string {
		var out []string
		for _, c := range cells {
			if spec := c.localPacer(cfg.Ceiling, cfg.Workers, i, start, d); spec != "" {
				out = append(out, "--bench-local-pacer", spec)
			}
		}
		return out
	}
	fleet, err := workers.Start(workers.Config{Executable: cfg.Executable, Dir: dir, N: cfg.Workers, Args: args, ArgsEach: perProcess})
	if err != nil {
		return nil, err
	}
	defer fleet.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // stopped below; this is the error path
	fmt.Fprintf(cfg.Progress, "run %d %s: %d platforms, %d workers, %s\n", run, cells[0].model.Name, len(cells), cfg.Workers, d)

	stopSteps, stepErr := scheduleSteps(cfg, dest, cells, start, d)
	defer stopSteps()
	tracing := os.Getenv(traceEnv) != ""
	stopTrace := func() []string { return nil }
	if tracing {
		stopTrace = traceEstimates(ctx, pool, run, cells, start)
	}
	err = waitRun(ctx, cfg, fleet, dest, cells, start, d, run)
	for _, line := range stopTrace() {
		fmt.Fprintln(cfg.Progress, line)
	}
	if err != nil {
		return nil, err
	}
	if err := stepErr(); err != nil {
		return nil, err
	}
	if states, err := pacer.States(ctx, pool); err == nil {
		for _, st := range states {
			if strings.HasSuffix(st.Platform, "."+ScheduleAWS) || strings.HasSuffix(st.Platform, "."+ScheduleOracle) {
				continue // paced in the processes, not by the shared pacer
			}
			fmt.Fprintf(cfg.Progress, "run %d: %-28s multiplier %.3f (pressure %.3f), announced %.2f/s, effective %.2f/s (%s), slow-downs %d\n",
				run, st.Platform, st.Multiplier, st.PressureMultiplier, st.AnnouncedRate, st.EffectiveRate, st.PacedBy, st.Slowdowns)
		}
	}
	if err := fleet.Stop(ctx); err != nil {
		cfg.Logger.Warn("bench adapt: stopping the workers", "err", err)
	}
	figs := make([]RunFigures, len(cells))
	for i, c := range cells {
		reqs, err := dest.arrivals(c.prefix())
		if err != nil {
			return nil, err
		}
		if tracing {
			trace(cfg, run, c, reqs, start)
		}
		figs[i] = analyze(c.model, reqs, start, d, cfg.Ceiling)
	}
	if err := dest.close(); err != nil {
		cfg.Logger.Warn("bench adapt: stopping the destination", "err", err)
	}
	fmt.Fprintf(cfg.Progress, "run %d %s: done\n", run, cells[0].model.Name)
	return figs, nil
}

// scheduleSteps moves each fake destination's limit at its model's steps;
// stop cancels the steps to come, err reports a step that failed.
func scheduleSteps(cfg AdaptConfig, dest destination, cells []cell, start time.Time, d time.Duration) (stop func(), err func() error) {
	fd, ok := dest.(fakeDestination)
	var (
		mu     sync.Mutex
		failed error
		timers []*time.Timer
	)
	for _, c := range cells {
		if !ok {
			break
		}
		for _, st := range c.model.Steps {
			rule := c.model.rule(cfg.Ceiling, st.Share)
			timers = append(timers, time.AfterFunc(time.Until(start.Add(stepAt(st, d))), func() {
				if e := fd.srv.SetRule(c.prefix(), rule); e != nil {
					mu.Lock()
					failed = fmt.Errorf("move the limit of %s: %w", c.platform, e)
					mu.Unlock()
				}
			}))
		}
	}
	return func() {
			for _, t := range timers {
				t.Stop()
			}
		}, func() error {
			mu.Lock()
			defer mu.Unlock()
			return failed
		}
}

// waitRun waits until the run has lasted d, watching the workers and
// printing each cell's last 10 s every 10 s.
func waitRun(ctx context.Context, cfg AdaptConfig, fleet *workers.Fleet, dest destination, cells []cell, start time.Time, d time.Duration, run int) error {
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	next := start.Add(adaptProgressEvery)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-ticker.C:
			if err := fleet.Exited(); err != nil {
				return err
			}
			if now.Sub(start) >= d {
				return nil
			}
			if now.Before(next) {
				continue
			}
			from := next.Add(-adaptProgressEvery)
			var parts []string
			for _, c := range cells {
				reqs, err := dest.arrivals(c.prefix())
				if err != nil {
					return err
				}
				var ok, limited int
				for _, r := range reqs {
					if r.At.Before(from) || !r.At.Before(next) {
						continue
					}
					if r.Limited {
						limited++
					} else if r.ok() {
						ok++
					}
				}
				parts = append(parts, fmt.Sprintf("%s %.1f/s ok %d×429", c.schedule.Name, float64(ok)/adaptProgressEvery.Seconds(), limited))
			}
			fmt.Fprintf(cfg.Progress, "run %d %s: %3.0fs (allows %.3g/s): %s\n", run, cells[0].model.Name, next.Sub(start).Seconds(),
				cells[0].model.allowance(cfg.Ceiling, from.Sub(start), d), strings.Join(parts, ", "))
			next = next.Add(adaptProgressEvery)
		}
	}
}
