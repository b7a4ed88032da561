package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

// KeysConfig configures `fleetpace bench keys`: what nested limits cost
// and deliver, side by side with the platform alone. The zero value means
// defaults (but for DatabaseURL).
type KeysConfig struct {
	// Processes are the workers of the whole path (below; only it empties
	// fleetpace's tables) and where the benchmark reports (Progress: a
	// line per step).
	Processes

	// Runs of the reservation part; its figures are medians. Default 3.
	Runs int
	// Samples is how many round trips of each kind one run times. Default
	// 1000.
	Samples int
	// ThroughputDuration is one run's throughput measurement of each kind.
	// Default 2 s.
	ThroughputDuration time.Duration
	// Callers of the throughput measurement. Default 4.
	Callers int

	// IdleKeys is how many key rows the memory part makes. Default 10,000.
	IdleKeys int
	// Idle is the idle expiry the memory part prunes with (the scan tick's
	// is pacer.DefaultKeyIdle). Default 3 s.
	Idle time.Duration

	// The whole path: Workers processes at Concurrency each, Keys keys at
	// KeyRate (burst 1) under a platform at Rate (burst Rate / 50), for
	// Duration (the first 8 s and the last second are not counted). 0
	// Duration skips it. Defaults 3, 50, 2,000, 1/s, 500/s, 30 s.
	Keys     int
	KeyRate  float64
	Rate     float64
	Duration time.Duration
	SkipPath bool
}

// Defaults and targets of the keys benchmark.
const (
	DefaultKeysRuns        = 3
	DefaultKeysSamples     = 1000
	DefaultKeysThroughput  = 2 * time.Second
	DefaultKeysCallers     = 4
	DefaultKeysIdleKeys    = 10_000
	DefaultKeysIdle        = 3 * time.Second
	DefaultKeysWorkers     = 3
	DefaultKeysConcurrency = 50
	DefaultKeysKeys        = 2000
	DefaultKeysKeyRate     = 1.0
	DefaultKeysRate        = 500.0
	DefaultKeysDuration    = 30 * time.Second

	KeysP50Target        = 1.3  // keyed p50 ÷ platform-only p50, at most
	KeysThroughputTarget = 0.8  // keyed throughput ÷ platform-only, at least
	KeysDeliveredTarget  = 0.95 // delivered ÷ the smaller of the platform's rate and the keys' together, at least
)

func (c *KeysConfig) setDefaults() error {
	c.Runs = cmp.Or(c.Runs, DefaultKeysRuns)
	c.Samples = cmp.Or(c.Samples, DefaultKeysSamples)
	c.Callers = cmp.Or(c.Callers, DefaultKeysCallers)
	c.IdleKeys = cmp.Or(c.IdleKeys, DefaultKeysIdleKeys)
	c.Keys = cmp.Or(c.Keys, DefaultKeysKeys)
	c.ThroughputDuration = cmp.Or(c.ThroughputDuration, DefaultKeysThroughput)
	c.Idle = cmp.Or(c.Idle, DefaultKeysIdle)
	c.KeyRate = cmp.Or(c.KeyRate, DefaultKeysKeyRate)
	c.Rate = cmp.Or(c.Rate, DefaultKeysRate)
	c.Duration = cmp.Or(c.Duration, DefaultKeysDuration)
	return c.Processes.setDefaults("KeysConfig", DefaultKeysWorkers, DefaultKeysConcurrency)
}

// Validate reports the first invalid field (defaults applied), wrapping
// ErrInvalidConfig. It does not check DatabaseURL.
func (c KeysConfig) Validate() error {
	return c.Processes.check("KeysConfig", c.setDefaults, func(bad badField) error {
		switch {
		case c.Runs < 1 || c.Runs > 100:
			return bad("Runs must be in [1, 100], got %d", c.Runs)
		case c.Samples < 10 || c.Samples > 1_000_000:
			return bad("Samples must be in [10, 1000000], got %d", c.Samples)
		case c.Callers < 1 || c.Callers > 64:
			return bad("Callers must be in [1, 64], got %d", c.Callers)
		case c.ThroughputDuration < 100*time.Millisecond || c.ThroughputDuration > time.Hour:
			return bad("ThroughputDuration must be in [100ms, 1h], got %s", c.ThroughputDuration)
		case c.IdleKeys < 1000 || c.IdleKeys > 1_000_000:
			return bad("IdleKeys must be in [1000, 1000000], got %d", c.IdleKeys)
		case c.Idle < time.Second || c.Idle > time.Hour:
			return bad("Idle must be in [1s, 1h], got %s", c.Idle)
		case c.Keys < 1 || c.Keys > 1_000_000:
			return bad("Keys must be in [1, 1000000], got %d", c.Keys)
		case !(c.KeyRate >= sources.MinRate && c.KeyRate <= sources.MaxRate):
			return bad("KeyRate must be in [%g, %g], got %g", sources.MinRate, sources.MaxRate, c.KeyRate)
		case !(c.Rate > 0 && c.Rate <= 100_000):
			return bad("Rate must be in (0, 100000], got %g", c.Rate)
		case !c.SkipPath && c.Duration <= fleetWarmup+2*time.Second:
			return bad("Duration must be > %s, got %s", fleetWarmup+2*time.Second, c.Duration)
		}
		return nil
	})
}

// KeysResult is the benchmark's outcome.
type KeysResult struct {
	Load string `json:"load_average"` // when it ended

	// Reservations, one caller (p50, ms) and Callers callers (per second),
	// medians of Runs runs: the platform alone, and a key + the platform.
	Runs              int     `json:"runs"`
	PlatformP50       float64 `json:"platform_p50_ms"`
	KeyP50            float64 `json:"key_p50_ms"`
	PlatformTPS       float64 `json:"platform_per_sec"`
	KeyTPS            float64 `json:"key_per_sec"`
	P50Ratio          float64 `json:"p50_ratio"`
	TPSRatio          float64 `json:"throughput_ratio"`
	Callers           int     `json:"callers"`
	PlatformP50Runs   []float64
	KeyP50Runs        []float64
	PlatformTPSRuns   []float64
	KeyTPSRuns        []float64
	ReservationTarget bool `json:"reservation_targets_met"`

	// Idle key rows: bytes per 1,000 (pg_total_relation_size of
	// fleetpace_pace, table and index), how many were pruned before their
	// idle expiry (must be 0) and how long after it the last went.
	IdleKeys        int     `json:"idle_keys"`
	BytesPer1000    float64 `json:"bytes_per_1000_keys"`
	Idle            string  `json:"idle"`
	PrunedEarly     int64   `json:"pruned_early"`
	GoneAfterIdle   float64 `json:"gone_after_idle_s"`
	PruneStatements int     `json:"prune_statements"`

	// The whole path (nil: skipped).
	Path *KeysPath `json:"path,omitempty"`
}

// KeysPath is what the destination saw of the whole path.
type KeysPath struct {
	Workers   int     `json:"workers"`
	Keys      int     `json:"keys"`
	KeyRate   float64 `json:"key_rate_per_sec"`
	Rate      float64 `json:"rate_per_sec"`
	Burst     int     `json:"burst"`
	Delivered float64 `json:"delivered_per_sec"`
	// Limit is what the fleet may deliver: the smaller of the platform's
	// rate and the keys' together (Keys × KeyRate).
	Limit float64 `json:"limit_per_sec"`
	// Ratio is Delivered ÷ Limit.
	Ratio        float64 `json:"delivered_ratio"`
	MaxWindow    int     `json:"max_window"` // the platform's largest 1-s window
	Bound        int     `json:"bound"`
	KeyMaxWindow int     `json:"key_max_window"` // the largest 1-s window of any key
	KeyBound     int     `json:"key_bound"`
	WorstKey     string  `json:"worst_key"`
	Met          bool    `json:"met"`
	// What the workers did: the pacer's reservations granted and denied,
	// jobs snoozed (all workers, the whole run).
	Granted float64 `json:"granted"`
	Denied  float64 `json:"denied"`
	Snoozed float64 `json:"snoozed"`
}

// Keys runs the benchmark.
func Keys(ctx context.Context, cfg KeysConfig) (*KeysResult, error) {
	dir, pool, release, err := prepare(ctx, &cfg, "KeysConfig", "keys")
	if err != nil {
		return nil, err
	}
	defer release()
	res := &KeysResult{Runs: cfg.Runs, Callers: cfg.Callers}
	if err := keysIdle(ctx, cfg, pool, res); err != nil {
		return nil, fmt.Errorf("bench keys: idle keys: %w", err)
	}
	if err := keysReservations(ctx, cfg, pool, res); err != nil {
		return nil, fmt.Errorf("bench keys: reservations: %w", err)
	}
	if !cfg.SkipPath {
		if res.Path, err = keysPath(ctx, cfg, pool, dir); err != nil {
			return nil, fmt.Errorf("bench keys: whole path: %w", err)
		}
	}
	res.Load = loadAverage()
	return res, nil
}

// keysReservations times reservations of the platform alone and of a key
// with its platform, interleaved, on a platform whose ceiling never denies
// (1e9/s) and keys without a rate of their own (so neither is ever denied:
// the figures are the statements'), blocks off (a key's slot is never
// taken from a block).
func keysReservations(ctx context.Context, cfg KeysConfig, pool *pgxpool.Pool, res *KeysResult) error {
	name, remove, err := unlimitedPlatform(ctx, pool, "bench-keys-")
	defer remove()
	if err != nil {
		return err
	}
	p, err := pacer.New(ctx, pacer.Config{DatabaseURL: cfg.DatabaseURL, MaxConns: int32(max(cfg.Callers, 4)), MaxBlock: 1})
	if err != nil {
		return err
	}
	defer p.Close()
	const keys = 1000
	var next atomic.Int64
	ops := []func(context.Context) error{
		func(ctx context.Context) error { return granted(p.Reserve(ctx, name, time.Second)) },
		func(ctx context.Context) error {
			return granted(p.ReserveKey(ctx, name, "k"+strconv.FormatInt(next.Add(1)%keys, 10), time.Second))
		},
	}
	// Make the key rows first: the figures are of keys in use.
	for i := range keys {
		if err := granted(p.ReserveKey(ctx, name, "k"+strconv.Itoa(i), time.Second)); err != nil {
			return err
		}
	}
	for run := 1; run <= cfg.Runs; run++ {
		lat, err := latencies(ctx, ops, 50, cfg.Samples)
		if err != nil {
			return err
		}
		tps, err := throughputs(ctx, ops, run, cfg.Callers, cfg.ThroughputDuration)
		if err != nil {
			return err
		}
		res.PlatformP50Runs = append(res.PlatformP50Runs, percentile(lat[0], 50))
		res.KeyP50Runs = append(res.KeyP50Runs, percentile(lat[1], 50))
		res.PlatformTPSRuns = append(res.PlatformTPSRuns, tps[0])
		res.KeyTPSRuns = append(res.KeyTPSRuns, tps[1])
		fmt.Fprintf(cfg.Progress, "bench keys: run %d: p50 %.3f ms platform, %.3f ms key + platform; %d callers %.0f/s platform, %.0f/s key + platform\n",
			run, percentile(lat[0], 50), percentile(lat[1], 50), cfg.Callers, tps[0], tps[1])
	}
	res.PlatformP50, res.KeyP50 = median(res.PlatformP50Runs), median(res.KeyP50Runs)
	res.PlatformTPS, res.KeyTPS = median(res.PlatformTPSRuns), median(res.KeyTPSRuns)
	res.P50Ratio, res.TPSRatio = res.KeyP50/res.PlatformP50, res.KeyTPS/res.PlatformTPS
	res.ReservationTarget = res.P50Ratio <= KeysP50Target && res.TPSRatio >= KeysThroughputTarget
	return nil
}

// unlimitedPlatform sets up a platform of this process that never denies
// (sources.MaxRate, burst 1), named prefix and the process id, for a part
// of the benchmark. It returns the platform's name and what removes it
// (best effort), to run even when err is not nil.
func unlimitedPlatform(ctx context.Context, pool *pgxpool.Pool, prefix string) (name string, remove func(), err error) {
	name = prefix + strconv.Itoa(os.Getpid())
	remove = func() {
		pool.Exec(context.WithoutCancel(ctx), `DELETE FROM fleetpace_platform WHERE name = $1`, name) //nolint:errcheck // best effort
	}
	_, err = sources.SetPlatform(ctx, pool, sources.Platform{Name: name, RatePerSec: sources.MaxRate, Burst: 1})
	return name, remove, err
}

// granted is the error of a reservation that cannot be denied: r must be
// granted, without degrading.
func granted(r pacer.Reservation, err error) error {
	if err == nil && (!r.Granted || r.Degraded) {
		err = fmt.Errorf("a reservation that cannot be denied was not granted: %+v", r)
	}
	return err
}

// keysIdle makes IdleKeys key rows through the pacer (as first uses make
// them), measures the table's growth, then prunes as the scan tick does
// (pacer.PruneKeys, the tick's batch) with an idle expiry of cfg.Idle:
// none may go before it, all should go soon after.
func keysIdle(ctx context.Context, cfg KeysConfig, pool *pgxpool.Pool, res *KeysResult) error {
	name, remove, err := unlimitedPlatform(ctx, pool, "bench-keys-idle-")
	defer remove()
	if err != nil {
		return err
	}
	// Keys idle from before this run would be pruned with these.
	if _, err := pacer.PruneKeys(ctx, pool, time.Nanosecond, math.MaxInt32); err != nil {
		return err
	}
	// VACUUM FULL: the table compacted (at its fillfactor), so the
	// difference is the rows', not free space they filled.
	size := func() (int64, error) {
		if _, err := pool.Exec(ctx, `VACUUM FULL fleetpace_pace`); err != nil {
			return 0, err
		}
		var n int64
		err := pool.QueryRow(ctx, `SELECT pg_total_relation_size('fleetpace_pace')`).Scan(&n)
		return n, err
	}
	before, err := size()
	if err != nil {
		return err
	}
	p, err := pacer.New(ctx, pacer.Config{DatabaseURL: cfg.DatabaseURL, MaxBlock: 1})
	if err != nil {
		return err
	}
	defer p.Close()
	fmt.Fprintf(cfg.Progress, "bench keys: %d key rows\n", cfg.IdleKeys)
	used := make(map[string]time.Time, cfg.IdleKeys) // each key's last use
	for i := range cfg.IdleKeys {
		key := "idle-key-" + strconv.Itoa(i)
		// Before the statement: the database stamps the key's use later
		// than this, so a key gone earlier than this + the expiry went
		// early (after it, a round trip would read as a prune too soon).
		sent := time.Now()
		if err := granted(p.ReserveKey(ctx, name, key, time.Second)); err != nil {
			return err
		}
		used[key] = sent
	}
	lastUse := time.Now()
	after, err := size()
	if err != nil {
		return err
	}
	res.IdleKeys = cfg.IdleKeys
	res.BytesPer1000 = float64(after-before) / float64(cfg.IdleKeys) * 1000
	res.Idle = cfg.Idle.String()
	// Prune every 500 ms, as ticks would, from now until all are gone; a
	// key gone before its own last use + the idle expiry went early.
	batch := sources.DefaultPruneBatch
	for {
		if _, err := pacer.PruneKeys(ctx, pool, cfg.Idle, batch); err != nil {
			return err
		}
		res.PruneStatements++
		since := time.Since(lastUse)
		rows, err := pool.Query(ctx, `SELECT key FROM fleetpace_pace WHERE platform = $1 AND key <> ''`, name)
		if err != nil {
			return err
		}
		still, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		present := make(map[string]bool, len(still))
		for _, k := range still {
			present[k] = true
		}
		for k, at := range used {
			if !present[k] {
				if time.Since(at) < cfg.Idle {
					res.PrunedEarly++
				}
				delete(used, k)
			}
		}
		left := len(still)
		if left == 0 {
			res.GoneAfterIdle = (since - cfg.Idle).Seconds()
			return nil
		}
		if since > cfg.Idle+time.Minute {
			return fmt.Errorf("%d key rows still there %s after their idle expiry", left, since-cfg.Idle)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// keysPath runs the whole path: worker processes, Keys keys at KeyRate
// under a platform at Rate, sources spread round-robin over the keys, a
// destination counting what arrives per key and in all.
func keysPath(ctx context.Context, cfg KeysConfig, pool *pgxpool.Pool, dir string) (*KeysPath, error) {
	burst := max(1, int(math.Ceil(cfg.Rate/50)))
	out := &KeysPath{Workers: cfg.Workers, Keys: cfg.Keys, KeyRate: cfg.KeyRate, Rate: cfg.Rate, Burst: burst,
		Bound: int(cfg.Rate) + burst}
	if err := emptyTables(ctx, pool); err != nil {
		return nil, err
	}
	dest, err := startDest(cfg.Logger, nil)
	if err != nil {
		return nil, err
	}
	defer dest.Close()
	if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: "f", RatePerSec: cfg.Rate, Burst: burst, KeyRate: cfg.KeyRate, KeyBurst: 1}); err != nil {
		return nil, err
	}
	var csv strings.Builder
	csv.WriteString("platform,url,interval,key\n")
	n := int(math.Ceil(cfg.Rate * cfg.Duration.Seconds() * 1.5))
	for i := range n {
		k := i % cfg.Keys
		fmt.Fprintf(&csv, "f,%s/k/%d/%d,1h,key-%d\n", dest.URL(), k, i, k)
	}
	if err := importCSV(ctx, pool, csv.String()); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "bench keys: whole path, %d workers, %d keys at %g/s under %g/s, %d sources, %s\n",
		cfg.Workers, cfg.Keys, cfg.KeyRate, cfg.Rate, n, cfg.Duration)
	logs := filepath.Join(dir, "path")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	args := workerArgs(cfg.DatabaseURL, "info", "127.0.0.1:0", cfg.Concurrency)
	start, m, err := runWorkers(ctx, workers.Config{Executable: cfg.Executable, Dir: logs, N: cfg.Workers, Args: args},
		cfg.Duration, cfg.Logger, "bench keys")
	if err != nil {
		return nil, err
	}
	out.Granted = m[`fleetpace_pacer_reservations_total{result="granted"}`]
	out.Denied = m[`fleetpace_pacer_reservations_total{result="denied"}`]
	out.Snoozed = m["fleetpace_job_snoozes_total"]
	from, to := start.Add(fleetWarmup), start.Add(cfg.Duration-time.Second)
	var all []time.Time
	byKey := map[string][]time.Time{}
	steady := 0
	for _, r := range dest.Requests() {
		all = append(all, r.Time)
		key, _, _ := strings.Cut(strings.TrimPrefix(r.Path, "/k/"), "/")
		byKey[key] = append(byKey[key], r.Time)
		if !r.Time.Before(from) && r.Time.Before(to) && r.Status < 400 {
			steady++
		}
	}
	out.Delivered = float64(steady) / to.Sub(from).Seconds()
	out.Limit = math.Min(cfg.Rate, float64(cfg.Keys)*cfg.KeyRate)
	out.Ratio = out.Delivered / out.Limit
	out.MaxWindow = fakedest.MaxInWindow(all, time.Second)
	for k, ts := range byKey {
		if w := fakedest.MaxInWindow(ts, time.Second); w > out.KeyMaxWindow {
			out.KeyMaxWindow, out.WorstKey = w, k
		}
	}
	// The bound a key can be held to at the destination is rate + burst in
	// any 1-s window: 2 at 1/s burst 1.
	out.KeyBound = int(math.Ceil(cfg.KeyRate)) + 1
	out.Met = out.Ratio >= KeysDeliveredTarget && out.MaxWindow <= out.Bound && out.KeyMaxWindow <= out.KeyBound
	return out, nil
}

// WriteText prints the result.
func (r *KeysResult) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "bench keys (load average %s)\n\n", r.Load)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "reservation (medians of %d)\tp50 ms\t%d callers /s\t\n", r.Runs, r.Callers)
	fmt.Fprintf(tw, "platform only\t%.3f\t%.0f\t\n", r.PlatformP50, r.PlatformTPS)
	fmt.Fprintf(tw, "key + platform\t%.3f\t%.0f\t\n", r.KeyP50, r.KeyTPS)
	fmt.Fprintf(tw, "ratio\t%.2f× (≤ %.1f)\t%.2f× (≥ %.1f)\t\n", r.P50Ratio, KeysP50Target, r.TPSRatio, KeysThroughputTarget)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "reservation targets: %s (runs: p50 %v / %v ms, throughput %v / %v per s)\n\n", metOrMissed(r.ReservationTarget),
		fmtFloats(r.PlatformP50Runs, 3), fmtFloats(r.KeyP50Runs, 3), fmtFloats(r.PlatformTPSRuns, 0), fmtFloats(r.KeyTPSRuns, 0))
	fmt.Fprintf(w, "idle key rows: %d made; %.0f bytes per 1,000 in the database (fleetpace_pace, table and index, fillfactor 50); pruned with an idle expiry of %s: %d before it (must be 0), the last %.1f s after it (%d prune statements)\n",
		r.IdleKeys, r.BytesPer1000, r.Idle, r.PrunedEarly, r.GoneAfterIdle, r.PruneStatements)
	if p := r.Path; p != nil {
		fmt.Fprintf(w, "\nwhole path: %d workers, %d keys at %g/s (burst 1) under %g/s (burst %d): delivered %.1f/s = %.3f × %s (≥ %.2f); largest 1-s window %d (bound %d); largest 1-s window of a key %d (%s; bound %d): %s\n",
			p.Workers, p.Keys, p.KeyRate, p.Rate, p.Burst, p.Delivered, p.Ratio, p.limitName(), KeysDeliveredTarget, p.MaxWindow, p.Bound,
			p.KeyMaxWindow, p.WorstKey, p.KeyBound, metOrMissed(p.Met))
		fmt.Fprintf(w, "  the workers' pacer granted %.0f reservations and denied %.0f over the run; %.0f jobs snoozed\n",
			p.Granted, p.Denied, p.Snoozed)
	}
	return nil
}

// limitName says which limit binds the whole path.
func (p *KeysPath) limitName() string {
	if p.Limit < p.Rate {
		return fmt.Sprintf("the keys' %g/s together", p.Limit)
	}
	return "the ceiling"
}

// fmtFloats formats a run's figures in brackets, prec decimals each.
func fmtFloats(xs []float64, prec int) string { return "[" + joinFloats(xs, prec) + "]" }

// WriteJSON prints the result as JSON.
func (r *KeysResult) WriteJSON(w io.Writer) error { return writeJSON(w, r) }
