package bench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/sources"
)

// SoakConfig configures the soak benchmark: a fleet under sustained load
// for minutes, several platforms at their ceilings, every source due again
// every interval; what the destination saw in its busiest second, how late
// sources were fetched, and whether the workers' memory grew. The zero
// value means defaults (but for DatabaseURL).
type SoakConfig struct {
	// Processes are the workers, 3 at concurrency 30 by default, and where
	// the soak reports (Progress: a line a minute).
	Processes
	// Platforms is how many platforms. Default 5.
	Platforms int
	// Rate and Burst are every platform's. Default 40/s, burst 1.
	Rate  float64
	Burst int
	// Sources is how many sources in all, spread evenly; each is due again
	// Interval after its check. Default 7,500 every minute (125/s of the
	// 200/s the platforms allow).
	Sources  int
	Interval time.Duration
	// Duration is the soak's length. Default 6 minutes; at least 5.
	Duration time.Duration
}

// Defaults of SoakConfig.
const (
	DefaultSoakWorkers     = 3
	DefaultSoakConcurrency = 30
	DefaultSoakPlatforms   = 5
	DefaultSoakRate        = 40.0
	DefaultSoakBurst       = 1
	DefaultSoakSources     = 7500
	DefaultSoakInterval    = time.Minute
	DefaultSoakDuration    = 6 * time.Minute
	MinSoakDuration        = 5 * time.Minute
	soakSampleEvery        = 10 * time.Second
	soakWarmup             = time.Minute // staleness and memory count from here
)

func (c *SoakConfig) setDefaults() error {
	c.Platforms = cmp.Or(c.Platforms, DefaultSoakPlatforms)
	c.Rate = cmp.Or(c.Rate, DefaultSoakRate)
	c.Burst = cmp.Or(c.Burst, DefaultSoakBurst)
	c.Sources = cmp.Or(c.Sources, DefaultSoakSources)
	c.Interval = cmp.Or(c.Interval, DefaultSoakInterval)
	c.Duration = cmp.Or(c.Duration, DefaultSoakDuration)
	return c.Processes.setDefaults("SoakConfig", DefaultSoakWorkers, DefaultSoakConcurrency)
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig. It does not check DatabaseURL.
func (c SoakConfig) Validate() error {
	return c.Processes.check("SoakConfig", c.setDefaults, func(bad badField) error {
		switch {
		case c.Platforms < 1 || c.Platforms > 100:
			return bad("Platforms must be 1–100, got %d", c.Platforms)
		case !(c.Rate > 0 && c.Rate <= 10_000):
			return bad("Rate must be in (0, 10000], got %g", c.Rate)
		case c.Burst < 1:
			return bad("Burst must be ≥ 1, got %d", c.Burst)
		case c.Sources < c.Platforms:
			return bad("Sources must be ≥ Platforms (%d), got %d", c.Platforms, c.Sources)
		case c.Interval < time.Second:
			return bad("Interval must be ≥ 1s, got %s", c.Interval)
		case c.Duration < MinSoakDuration:
			return bad("Duration must be ≥ %s, got %s", MinSoakDuration, c.Duration)
		}
		return nil
	})
}

// SoakPlatform is one platform's figures.
type SoakPlatform struct {
	Name      string  `json:"name"`
	Requests  int     `json:"requests"`
	PerSec    float64 `json:"per_sec"`    // over the run after the warm-up
	MaxWindow int     `json:"max_window"` // largest number of requests in any 1-s window
	Bound     int     `json:"bound"`      // rate + burst
}

// SoakResult is the soak's outcome.
type SoakResult struct {
	Workers     int            `json:"workers"`
	Concurrency int            `json:"concurrency"`
	Rate        float64        `json:"rate_per_sec"`
	Burst       int            `json:"burst"`
	Sources     int            `json:"sources"`
	Interval    string         `json:"interval"`
	Duration    string         `json:"duration"`
	Platforms   []SoakPlatform `json:"platforms"`
	// StaleMax is the largest lateness of a due source seen in any sample
	// after the warm-up (every 10 s), seconds; StaleP95 the 95th percentile
	// of the samples' largest lateness.
	StaleMax float64 `json:"stale_max_sec"`
	StaleP95 float64 `json:"stale_p95_sec"`
	// RSS of each worker, MiB: after the warm-up and at the end.
	RSSStart []float64 `json:"rss_start_mib"`
	RSSEnd   []float64 `json:"rss_end_mib"`
}

// Met reports whether no platform's busiest second exceeded rate + burst.
func (r *SoakResult) Met() bool {
	for _, p := range r.Platforms {
		if p.MaxWindow > p.Bound {
			return false
		}
	}
	return true
}

// Soak runs the soak benchmark.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakResult, error) {
	dir, pool, release, err := prepare(ctx, &cfg, "SoakConfig", "soak")
	if err != nil {
		return nil, err
	}
	defer release()
	if err := emptyTables(ctx, pool); err != nil {
		return nil, fmt.Errorf("bench soak: %w", err)
	}
	dest, err := startDest(cfg.Logger, nil)
	if err != nil {
		return nil, err
	}
	defer dest.Close()
	names := make([]string, cfg.Platforms)
	for i := range names {
		names[i] = fmt.Sprintf("soak%d", i+1)
		if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: names[i], RatePerSec: cfg.Rate, Burst: cfg.Burst}); err != nil {
			return nil, err
		}
	}
	var csv strings.Builder
	csv.WriteString("platform,url,interval\n")
	for i := range cfg.Sources {
		p := names[i%len(names)]
		fmt.Fprintf(&csv, "%s,%s/%s/%d,%s\n", p, dest.URL(), p, i, cfg.Interval)
	}
	if err := importCSV(ctx, pool, csv.String()); err != nil {
		return nil, err
	}
	fleet, err := workers.Start(workers.Config{Executable: cfg.Executable, Dir: dir, N: cfg.Workers,
		Args: workerArgs(cfg.DatabaseURL, "warn", "", cfg.Concurrency)})
	if err != nil {
		return nil, err
	}
	defer fleet.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // stopped below; this is the error path
	start := time.Now()
	res := &SoakResult{Workers: cfg.Workers, Concurrency: cfg.Concurrency, Rate: cfg.Rate, Burst: cfg.Burst,
		Sources: cfg.Sources, Interval: cfg.Interval.String(), Duration: cfg.Duration.String()}
	var stale []float64
	tick := time.NewTicker(soakSampleEvery)
	defer tick.Stop()
	nextProgress := start.Add(time.Minute)
	for time.Since(start) < cfg.Duration {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		if err := fleet.Exited(); err != nil {
			return nil, err
		}
		el := time.Since(start)
		if el < soakWarmup {
			continue
		}
		if res.RSSStart == nil {
			res.RSSStart = rss(fleet.Pids())
		}
		counts, err := sources.Counts(ctx, pool)
		if err != nil {
			return nil, err
		}
		worst := 0.0
		for _, c := range counts {
			worst = max(worst, c.StaleMax.Seconds())
		}
		stale = append(stale, worst)
		if time.Now().After(nextProgress) {
			nextProgress = nextProgress.Add(time.Minute)
			fmt.Fprintf(cfg.Progress, "bench soak: %s: %d requests, most overdue source %.1f s late\n", el.Round(time.Second), dest.Count("/"), worst)
		}
	}
	res.RSSEnd = rss(fleet.Pids())
	if err := fleet.Stop(ctx); err != nil {
		cfg.Logger.Warn("bench soak: stopping the workers", "err", err)
	}
	if len(stale) > 0 {
		res.StaleMax = slices.Max(stale)
		res.StaleP95 = percentile(stale, 95)
	}
	from := start.Add(soakWarmup)
	span := time.Since(from).Seconds()
	for _, name := range names {
		times := dest.Arrivals("/" + name + "/")
		after := 0
		for _, t := range times {
			if !t.Before(from) {
				after++
			}
		}
		res.Platforms = append(res.Platforms, SoakPlatform{Name: name, Requests: len(times), PerSec: float64(after) / span,
			MaxWindow: fakedest.MaxInWindow(times, time.Second), Bound: int(cfg.Rate) + cfg.Burst})
	}
	return res, nil
}

// rss reads each process's resident set size, MiB (0 if unreadable).
func rss(pids []int) []float64 {
	out := make([]float64, len(pids))
	for i, pid := range pids {
		f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
				out[i] = kb / 1024
			}
		}
		f.Close()
	}
	return out
}

// WriteText prints the result.
func (r *SoakResult) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "bench soak: %d workers × concurrency %d, %d platforms at %g/s burst %d, %d sources every %s, %s\n",
		r.Workers, r.Concurrency, len(r.Platforms), r.Rate, r.Burst, r.Sources, r.Interval, r.Duration)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "platform\trequests\tper s\tlargest 1 s\tbound\t")
	for _, p := range r.Platforms {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%d\t%d\t\n", p.Name, p.Requests, p.PerSec, p.MaxWindow, p.Bound)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "most overdue source (samples every %s after %s): max %.1f s, p95 %.1f s\n", soakSampleEvery, soakWarmup, r.StaleMax, r.StaleP95)
	fmt.Fprintf(w, "worker RSS, MiB, after %s → end: ", soakWarmup)
	for i := range r.RSSEnd {
		if i > 0 {
			fmt.Fprint(w, ", ")
		}
		start := 0.0
		if i < len(r.RSSStart) {
			start = r.RSSStart[i]
		}
		fmt.Fprintf(w, "%.1f → %.1f", start, r.RSSEnd[i])
	}
	fmt.Fprintf(w, "\ntarget: no platform's largest 1-s window above rate + burst: %s\n", metOrMissed(r.Met()))
	return nil
}

// WriteJSON prints the result as JSON.
func (r *SoakResult) WriteJSON(w io.Writer) error { return writeJSON(w, r) }
