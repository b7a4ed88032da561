package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/fakedest"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

// PacerChildURLEnv carries the database URL to pacer-child processes, so a
// password never appears in a process listing.
const PacerChildURLEnv = "FLEETPACE_BENCH_DATABASE_URL"

// PacerConfig configures the pacer benchmark. The zero value of every field
// but DatabaseURL and Spawn means its default.
type PacerConfig struct {
	// DatabaseURL is the database to measure; it must have the schema. The
	// benchmark creates platforms named "bench-pacer-…" and removes them.
	// Required.
	DatabaseURL string
	// Spawn returns a command that runs PacerChild with args (the CLI maps it
	// to `fleetpace bench pacer-child ARGS…`). Stdout and Stderr are set by the
	// benchmark. Required.
	Spawn func(args []string) *exec.Cmd
	// LatencySamples is how many round trips of each kind the latency
	// measurement takes with one caller. Default 2000.
	LatencySamples int
	// ThroughputDuration is how long each throughput measurement runs.
	// Default 3 s.
	ThroughputDuration time.Duration
	// Ceiling is the rate of the accuracy measurement, per second. Default 50.
	Ceiling float64
	// Burst is the burst of the accuracy measurement. Default 2.
	Burst int
	// Processes and Goroutines shape the accuracy measurement's fleet.
	// Defaults 4 and 8.
	Processes  int
	Goroutines int
	// AccuracyDuration is how long the accuracy measurement runs. Default 20 s.
	AccuracyDuration time.Duration
	// Progress receives progress lines. Default: none.
	Progress io.Writer
}

// Defaults of PacerConfig.
const (
	DefaultPacerSamples            = 2000
	DefaultPacerThroughputDuration = 3 * time.Second
	DefaultPacerCeiling            = 50.0
	DefaultPacerBurst              = 2
	DefaultPacerProcesses          = 4
	DefaultPacerGoroutines         = 8
	DefaultPacerAccuracyDuration   = 20 * time.Second
)

func (c *PacerConfig) setDefaults() {
	c.LatencySamples = cmp.Or(c.LatencySamples, DefaultPacerSamples)
	c.ThroughputDuration = cmp.Or(c.ThroughputDuration, DefaultPacerThroughputDuration)
	c.Ceiling = cmp.Or(c.Ceiling, DefaultPacerCeiling)
	c.Burst = cmp.Or(c.Burst, DefaultPacerBurst)
	c.Processes = cmp.Or(c.Processes, DefaultPacerProcesses)
	c.Goroutines = cmp.Or(c.Goroutines, DefaultPacerGoroutines)
	c.AccuracyDuration = cmp.Or(c.AccuracyDuration, DefaultPacerAccuracyDuration)
	c.Progress = cmp.Or(c.Progress, io.Discard)
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig. It
// does not check DatabaseURL and Spawn (Pacer does).
func (c PacerConfig) Validate() error {
	for _, f := range []struct {
		name     string
		negative bool
		value    any
	}{
		{"LatencySamples", c.LatencySamples < 0, c.LatencySamples},
		{"ThroughputDuration", c.ThroughputDuration < 0, c.ThroughputDuration},
		{"Ceiling", c.Ceiling < 0, c.Ceiling},
		{"Burst", c.Burst < 0, c.Burst},
		{"Processes", c.Processes < 0, c.Processes},
		{"Goroutines", c.Goroutines < 0, c.Goroutines},
		{"AccuracyDuration", c.AccuracyDuration < 0, c.AccuracyDuration},
	} {
		if f.negative {
			return fmt.Errorf("%w: bench.PacerConfig.%s must be > 0 (0: default), got %v", ErrInvalidConfig, f.name, f.value)
		}
	}
	// The accuracy platform is a platform: sources' bounds (NaN too).
	switch {
	case c.Ceiling != 0 && !(c.Ceiling >= sources.MinRate && c.Ceiling <= sources.MaxRate):
		return fmt.Errorf("%w: bench.PacerConfig.Ceiling must be in [%g, %g] (0: default), got %v", ErrInvalidConfig, sources.MinRate, sources.MaxRate, c.Ceiling)
	case c.Burst > sources.MaxBurst:
		return fmt.Errorf("%w: bench.PacerConfig.Burst must be at most %d, got %d", ErrInvalidConfig, sources.MaxBurst, c.Burst)
	}
	return nil
}

// PacerResult is the outcome of the pacer benchmark (latencies in ms,
// throughputs in operations per second).
type PacerResult struct {
	Select1P50 float64 `json:"select1_p50_ms"`
	Select1P99 float64 `json:"select1_p99_ms"`
	UpsertP50  float64 `json:"upsert_p50_ms"`
	UpsertP99  float64 `json:"upsert_p99_ms"`
	ReserveP50 float64 `json:"reserve_p50_ms"`
	ReserveP99 float64 `json:"reserve_p99_ms"`

	Select1TPS1  float64 `json:"select1_tps_1"`
	Select1TPS4  float64 `json:"select1_tps_4"`
	Select1TPS16 float64 `json:"select1_tps_16"`
	UpsertTPS1   float64 `json:"upsert_tps_1"`
	UpsertTPS4   float64 `json:"upsert_tps_4"`
	UpsertTPS16  float64 `json:"upsert_tps_16"`
	ReserveTPS1  float64 `json:"reserve_tps_1"`
	ReserveTPS4  float64 `json:"reserve_tps_4"`
	ReserveTPS16 float64 `json:"reserve_tps_16"`

	// The same reservations with blocks on (the pacer's default): a
	// statement takes up to pacer.DefaultMaxBlock slots when the interval is
	// shorter than a round trip, and later calls take the rest without one.
	BlockP50   float64 `json:"reserve_block_p50_ms"`
	BlockP99   float64 `json:"reserve_block_p99_ms"`
	BlockTPS1  float64 `json:"reserve_block_tps_1"`
	BlockTPS4  float64 `json:"reserve_block_tps_4"`
	BlockTPS16 float64 `json:"reserve_block_tps_16"`

	// ReserveUpsertP50Ratio is reserve_p50 / upsert_p50 (target ≤ 1.5).
	ReserveUpsertP50Ratio float64 `json:"reserve_upsert_p50_ratio"`
	// ReserveUpsertTPS4Ratio is reserve_tps_4 / upsert_tps_4 (target ≥ 0.8).
	ReserveUpsertTPS4Ratio float64 `json:"reserve_upsert_tps_4_ratio"`

	Ceiling         float64 `json:"ceiling"`
	Burst           int     `json:"burst"`
	Processes       int     `json:"processes"`
	Goroutines      int     `json:"goroutines"`
	AccuracySeconds float64 `json:"accuracy_seconds"`
	Granted         int     `json:"accuracy_granted"`
	DeliveredRate   float64 `json:"delivered_per_sec"`
	// AccuracyRatio is delivered rate / ceiling (target ≥ 0.97).
	AccuracyRatio float64 `json:"accuracy_ratio"`
	// MaxWindow is the most grants in any 1-s window (target ≤ ceiling + burst).
	MaxWindow int `json:"max_window"`

	TargetsMet bool `json:"targets_met"`
}

// pacerBenchUpsertSQL is the bare single-row upsert of the reservation's
// shape: same table, same conflict target, one read-modify-write of the
// cursor from the database clock (read the same, cheapest way), RETURNING —
// without the GCRA arithmetic and bookkeeping.
const pacerBenchUpsertSQL = `
INSERT INTO fleetpace_pace AS s (platform, cursor_at)
VALUES ($1, date_part('epoch', clock_timestamp()))
ON CONFLICT (platform, key) DO UPDATE SET cursor_at = GREATEST(s.cursor_at, EXCLUDED.cursor_at) + 0.000001
RETURNING s.cursor_at`

// Pacer runs the pacer benchmark: latency and throughput of SELECT 1 (the
// floor), a bare single-row upsert (the physical limit of one row) and a
// pacer reservation at an effectively unlimited rate; then the accuracy of
// the shared ceiling with a fleet of real processes.
func Pacer(ctx context.Context, cfg PacerConfig) (*PacerResult, error) {
	switch {
	case cfg.DatabaseURL == "":
		return nil, fmt.Errorf("%w: bench.PacerConfig.DatabaseURL is required", ErrInvalidConfig)
	case cfg.Spawn == nil:
		return nil, fmt.Errorf("%w: bench.PacerConfig.Spawn is required", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("bench pacer: database URL: %w", err)
	}
	pc.MaxConns = 20
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	// The session settings of the pacer's own pool, so the upsert runs as
	// the reservation does.
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("bench pacer: %w", err)
	}
	defer pool.Close()
	// The upsert gets a pool of its own, as the pacer has: sharing SELECT 1's
	// connections would hand it backends warmed a moment before, which the
	// reservation's never are (15 µs of a 160 µs round trip measured).
	upc := pc.Copy()
	upc.MaxConns = 16
	upsertPool, err := pgxpool.NewWithConfig(ctx, upc)
	if err != nil {
		return nil, fmt.Errorf("bench pacer: %w", err)
	}
	defer upsertPool.Close()

	suffix := strconv.Itoa(os.Getpid())
	unlimited, upsert, accuracy := "bench-pacer-unlimited-"+suffix, "bench-pacer-upsert-"+suffix, "bench-pacer-accuracy-"+suffix
	names := []string{unlimited, upsert, accuracy}
	defer pacerBenchCleanup(context.WithoutCancel(ctx), pool, names)
	for _, p := range []struct {
		name  string
		rate  float64
		burst int
	}{{unlimited, 1e9, 1}, {upsert, 1e9, 1}, {accuracy, cfg.Ceiling, cfg.Burst}} {
		if _, err := pool.Exec(ctx, `
			INSERT INTO fleetpace_platform (name, rate_per_sec, burst) VALUES ($1, $2, $3)
			ON CONFLICT (name) DO UPDATE SET rate_per_sec = EXCLUDED.rate_per_sec, burst = EXCLUDED.burst`,
			p.name, p.rate, p.burst); err != nil {
			return nil, fmt.Errorf("bench pacer: create platform: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, `DELETE FROM fleetpace_pace WHERE platform = ANY($1)`, names); err != nil {
		return nil, fmt.Errorf("bench pacer: reset: %w", err)
	}

	// The figures of the issue are per statement: blocks off.
	pc16, err := pacer.New(ctx, pacer.Config{DatabaseURL: cfg.DatabaseURL, MaxConns: 16, MaxBlock: 1})
	if err != nil {
		return nil, err
	}
	defer pc16.Close()
	blocks, err := pacer.New(ctx, pacer.Config{DatabaseURL: cfg.DatabaseURL, MaxConns: 16})
	if err != nil {
		return nil, err
	}
	defer blocks.Close()

	// A reservation at the unlimited rate, through p.
	reserve := func(p *pacer.Pacer) func(context.Context) error {
		return func(ctx context.Context) error {
			r, err := p.Reserve(ctx, unlimited, time.Second)
			if err == nil && (!r.Granted || r.Degraded) {
				err = fmt.Errorf("reservation at an unlimited rate not granted: %+v", r)
			}
			return err
		}
	}
	ops := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"select 1", func(ctx context.Context) error {
			var one int
			return pool.QueryRow(ctx, `SELECT 1`).Scan(&one)
		}},
		{"bare upsert", func(ctx context.Context) error {
			var c float64
			return upsertPool.QueryRow(ctx, pacerBenchUpsertSQL, upsert).Scan(&c)
		}},
		{"reservation", reserve(pc16)},
		{"reservation in blocks", reserve(blocks)},
	}

	// Each kind's errors say which kind failed.
	fns := make([]func(context.Context) error, len(ops))
	for i, op := range ops {
		fns[i] = func(ctx context.Context) error {
			if err := op.fn(ctx); err != nil {
				return fmt.Errorf("%s: %w", op.name, err)
			}
			return nil
		}
	}

	// Latency, one caller, the kinds interleaved so drift hits all alike,
	// in an order that turns every round so none always follows another.
	fmt.Fprintf(cfg.Progress, "bench pacer: latency, %d round trips of each kind\n", cfg.LatencySamples)
	lat, err := latencies(ctx, fns, 100, cfg.LatencySamples) // 100 warm-up rounds
	if err != nil {
		return nil, fmt.Errorf("bench pacer: %w", err)
	}
	res := &PacerResult{
		Select1P50: percentile(lat[0], 50), Select1P99: percentile(lat[0], 99),
		UpsertP50: percentile(lat[1], 50), UpsertP99: percentile(lat[1], 99),
		ReserveP50: percentile(lat[2], 50), ReserveP99: percentile(lat[2], 99),
		BlockP50: percentile(lat[3], 50), BlockP99: percentile(lat[3], 99),
	}

	// Throughput: each measurement is split into rounds, the kinds
	// interleaved round by round, and the median round is reported, so a
	// burst of load from elsewhere on a shared machine does not decide a ratio.
	// Eight rounds: every kind goes first twice.
	const rounds = 8
	tps := map[string]map[int]float64{}
	for _, callers := range []int{1, 4, 16} {
		fmt.Fprintf(cfg.Progress, "bench pacer: throughput, %d callers, %d rounds of %s per kind\n", callers, rounds, cfg.ThroughputDuration/rounds)
		samples := make([][]float64, len(ops))
		for r := 0; r < rounds; r++ {
			round, err := throughputs(ctx, fns, r, callers, cfg.ThroughputDuration/rounds) // turning order, as above
			if err != nil {
				return nil, fmt.Errorf("bench pacer: %w", err)
			}
			for k, n := range round {
				samples[k] = append(samples[k], n)
			}
		}
		for k, op := range ops {
			if tps[op.name] == nil {
				tps[op.name] = map[int]float64{}
			}
			tps[op.name][callers] = percentile(samples[k], 50)
		}
	}
	res.Select1TPS1, res.Select1TPS4, res.Select1TPS16 = tps["select 1"][1], tps["select 1"][4], tps["select 1"][16]
	res.UpsertTPS1, res.UpsertTPS4, res.UpsertTPS16 = tps["bare upsert"][1], tps["bare upsert"][4], tps["bare upsert"][16]
	res.ReserveTPS1, res.ReserveTPS4, res.ReserveTPS16 = tps["reservation"][1], tps["reservation"][4], tps["reservation"][16]
	res.BlockTPS1, res.BlockTPS4, res.BlockTPS16 = tps["reservation in blocks"][1], tps["reservation in blocks"][4], tps["reservation in blocks"][16]
	res.ReserveUpsertP50Ratio = res.ReserveP50 / res.UpsertP50
	res.ReserveUpsertTPS4Ratio = res.ReserveTPS4 / res.UpsertTPS4

	fmt.Fprintf(cfg.Progress, "bench pacer: accuracy, ceiling %g/s, %d processes × %d goroutines, %s\n",
		cfg.Ceiling, cfg.Processes, cfg.Goroutines, cfg.AccuracyDuration)
	if err := pacerAccuracy(ctx, cfg, accuracy, res); err != nil {
		return nil, err
	}
	res.TargetsMet = res.ReserveUpsertP50Ratio <= 1.5 && res.ReserveUpsertTPS4Ratio >= 0.8 &&
		res.AccuracyRatio >= 0.97 && float64(res.MaxWindow) <= res.Ceiling+float64(res.Burst)
	return res, nil
}

// pacerAccuracy runs the fleet of child processes against the ceiling and
// fills the accuracy figures of res.
func pacerAccuracy(ctx context.Context, cfg PacerConfig, platform string, res *PacerResult) error {
	start := time.Now().Add(2 * time.Second) // let every child start and connect
	args := []string{
		"-platform", platform,
		"-goroutines", strconv.Itoa(cfg.Goroutines),
		"-start", strconv.FormatInt(start.UnixNano(), 10),
		"-duration", cfg.AccuracyDuration.String(),
	}
	type child struct {
		cmd            *exec.Cmd
		stdout, stderr bytes.Buffer
	}
	children := make([]*child, cfg.Processes)
	for i := range children {
		c := &child{cmd: cfg.Spawn(args)}
		c.cmd.Env = append(pacerEnviron(c.cmd.Env), PacerChildURLEnv+"="+cfg.DatabaseURL)
		c.cmd.Stdout, c.cmd.Stderr = &c.stdout, &c.stderr
		if err := c.cmd.Start(); err != nil {
			for _, started := range children[:i] {
				_ = started.cmd.Process.Kill()
				_ = started.cmd.Wait()
			}
			return fmt.Errorf("bench pacer: start child: %w", err)
		}
		children[i] = c
	}
	stop := context.AfterFunc(ctx, func() {
		for _, c := range children {
			_ = c.cmd.Process.Kill()
		}
	})
	defer stop()

	var fires []time.Time
	var errs []error
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("bench pacer: child %d: %w: %s", i, err, strings.TrimSpace(c.stderr.String())))
			continue
		}
		sc := bufio.NewScanner(&c.stdout)
		for sc.Scan() {
			n, err := strconv.ParseInt(strings.TrimSpace(sc.Text()), 10, 64)
			if err != nil {
				continue // comments, test-binary chatter
			}
			fires = append(fires, time.Unix(0, n))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("bench pacer: %w", ctx.Err())
	}
	end := start.Add(cfg.AccuracyDuration)
	var in []time.Time
	for _, f := range fires {
		if !f.Before(start) && f.Before(end) {
			in = append(in, f)
		}
	}
	res.Ceiling, res.Burst = cfg.Ceiling, cfg.Burst
	res.Processes, res.Goroutines = cfg.Processes, cfg.Goroutines
	res.AccuracySeconds = cfg.AccuracyDuration.Seconds()
	res.Granted = len(in)
	res.DeliveredRate = float64(len(in)) / cfg.AccuracyDuration.Seconds()
	res.AccuracyRatio = res.DeliveredRate / cfg.Ceiling
	res.MaxWindow = fakedest.MaxInWindow(in, time.Second)
	return nil
}

func pacerEnviron(env []string) []string {
	if env == nil {
		return os.Environ()
	}
	return env
}

// PacerChild is the body of one accuracy process (`fleetpace bench
// pacer-child`): its own pacer, -goroutines callers reserving the platform
// from -start (unix ns) for -duration; it writes the time of every granted
// request, one unix-ns integer a line, to out. The database URL comes from
// -database-url or the FLEETPACE_BENCH_DATABASE_URL environment variable.
func PacerChild(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("pacer-child", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dbURL := fs.String("database-url", os.Getenv(PacerChildURLEnv), "database URL")
	platform := fs.String("platform", "", "platform to reserve")
	goroutines := fs.Int("goroutines", 8, "concurrent callers")
	startNS := fs.Int64("start", 0, "start time, unix ns (default: now)")
	duration := fs.Duration("duration", 20*time.Second, "how long to run")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("bench pacer-child: %w", err)
	}
	switch {
	case *dbURL == "":
		return errors.New("bench pacer-child: -database-url (or " + PacerChildURLEnv + ") is required")
	case *platform == "":
		return errors.New("bench pacer-child: -platform is required")
	case *goroutines < 1:
		return fmt.Errorf("bench pacer-child: -goroutines must be at least 1 (got %d)", *goroutines)
	}
	start := time.Now()
	if *startNS != 0 {
		start = time.Unix(0, *startNS)
	}
	deadline := start.Add(*duration)

	p, err := pacer.New(ctx, pacer.Config{DatabaseURL: *dbURL})
	if err != nil {
		return err
	}
	defer p.Close()
	// Connect before the start so the first grants are not late.
	if _, err := p.States(ctx); err != nil {
		return err
	}
	if err := clock.Sleep(ctx, clock.Real(), time.Until(start)); err != nil {
		return err
	}

	var mu sync.Mutex
	var fires []int64
	g, gctx := errgroup.WithContext(ctx)
	for range *goroutines {
		g.Go(func() error {
			for {
				remaining := time.Until(deadline)
				if remaining <= 0 {
					return nil
				}
				r, err := p.Reserve(gctx, *platform, remaining)
				if err != nil {
					return err
				}
				if err := clock.Sleep(gctx, clock.Real(), min(r.Wait, remaining)); err != nil {
					return err
				}
				if !r.Granted {
					continue
				}
				now := time.Now()
				if !now.Before(deadline) {
					return nil
				}
				mu.Lock()
				fires = append(fires, now.UnixNano())
				mu.Unlock()
			}
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("bench pacer-child: %w", err)
	}
	w := bufio.NewWriter(out)
	for _, f := range fires {
		fmt.Fprintln(w, f)
	}
	st, _ := json.Marshal(p.Stats())
	fmt.Fprintf(w, "# stats %s\n", st)
	return w.Flush()
}

func pacerBenchCleanup(ctx context.Context, pool *pgxpool.Pool, names []string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, _ = pool.Exec(ctx, `DELETE FROM fleetpace_pace WHERE platform = ANY($1)`, names)
	_, _ = pool.Exec(ctx, `DELETE FROM fleetpace_platform WHERE name = ANY($1)`, names)
}

// WriteText prints the result as a table with the targets.
func (r *PacerResult) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "bench pacer: one database, one run")
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "ROUND TRIP\tP50 ms\tP99 ms\t1 CALLER /s\t4 CALLERS /s\t16 CALLERS /s")
	fmt.Fprintf(tw, "SELECT 1 (floor)\t%.3f\t%.3f\t%.0f\t%.0f\t%.0f\n", r.Select1P50, r.Select1P99, r.Select1TPS1, r.Select1TPS4, r.Select1TPS16)
	fmt.Fprintf(tw, "bare single-row upsert\t%.3f\t%.3f\t%.0f\t%.0f\t%.0f\n", r.UpsertP50, r.UpsertP99, r.UpsertTPS1, r.UpsertTPS4, r.UpsertTPS16)
	fmt.Fprintf(tw, "pacer reservation (unlimited rate, one statement)\t%.3f\t%.3f\t%.0f\t%.0f\t%.0f\n", r.ReserveP50, r.ReserveP99, r.ReserveTPS1, r.ReserveTPS4, r.ReserveTPS16)
	fmt.Fprintf(tw, "pacer reservation (unlimited rate, in blocks)\t%.3f\t%.3f\t%.0f\t%.0f\t%.0f\n", r.BlockP50, r.BlockP99, r.BlockTPS1, r.BlockTPS4, r.BlockTPS16)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tTARGET\tMET")
	fmt.Fprintf(tw, "reservation / upsert, median latency\t%.2f×\t≤ 1.5×\t%s\n", r.ReserveUpsertP50Ratio, pacerYes(r.ReserveUpsertP50Ratio <= 1.5))
	fmt.Fprintf(tw, "reservation / upsert, throughput at 4 callers\t%.2f×\t≥ 0.8×\t%s\n", r.ReserveUpsertTPS4Ratio, pacerYes(r.ReserveUpsertTPS4Ratio >= 0.8))
	fmt.Fprintf(tw, "delivered / ceiling (%d processes × %d goroutines, %.0f s, %d granted)\t%.3f (%.2f/s of %g/s)\t≥ 0.97\t%s\n",
		r.Processes, r.Goroutines, r.AccuracySeconds, r.Granted, r.AccuracyRatio, r.DeliveredRate, r.Ceiling, pacerYes(r.AccuracyRatio >= 0.97))
	fmt.Fprintf(tw, "largest 1-s window\t%d\t≤ %g (ceiling + burst %d)\t%s\n", r.MaxWindow, r.Ceiling+float64(r.Burst), r.Burst,
		pacerYes(float64(r.MaxWindow) <= r.Ceiling+float64(r.Burst)))
	return tw.Flush()
}

// WriteJSON prints the result as one JSON object.
func (r *PacerResult) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

func pacerYes(ok bool) string {
	if ok {
		return "yes"
	}
	return "NO"
}
