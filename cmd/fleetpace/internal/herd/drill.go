package herd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/poller"
)

// Defaults for DrillConfig.
const (
	DefaultDrillPollers        = 2000
	DefaultDrillMaxConnections = 100
	DefaultDrillClaimTime      = 50 * time.Millisecond
	DefaultDrillWindow         = 20 * time.Second
	DefaultSampleEvery         = 100 * time.Millisecond
)

// drillApp is the application_name of the pollers' connections, which the
// sampler counts.
const drillApp = "fleetpace-drill"

// DrillConfig configures Drill. The zero value drills 2,000 pollers against
// a throwaway embedded cluster with max_connections 100.
type DrillConfig struct {
	// DatabaseURL is the server to drill. Default: a throwaway embedded
	// cluster started with max_connections = MaxConnections. The drill
	// creates nothing in the database; it takes an advisory lock.
	DatabaseURL string

	// MaxConnections is the embedded cluster's max_connections. Default:
	// 100. Ignored with DatabaseURL (the server's own limit is read).
	MaxConnections int

	// Pollers is how many pollers run, each with its own pool of one
	// connection. Default: 2,000.
	Pollers int

	// ClaimTime is how long a claim works once it has its lock (pg_sleep).
	// Default: 50 ms.
	ClaimTime time.Duration

	// Base, Max and JitterRatio are the pollers' schedule (poller.Config).
	// Defaults: the poller package's (1 s, 30 s, 0.5).
	Base, Max   time.Duration
	JitterRatio float64

	// Warmup is how long the pollers run before the window. Default:
	// Max + 10 s (every fleetpace poller has started).
	Warmup time.Duration

	// Window is how long the database is saturated. Default: 20 s.
	Window time.Duration

	// After is how long the pollers run after the window. Default: Max ×
	// (1 + JitterRatio) + 5 s: longer than any fleetpace sleep.
	After time.Duration

	// RetryDelay and RetryFor are the baseline's retry-on-acquire: a
	// refused poller tries again every RetryDelay for RetryFor before its
	// cycle fails. Defaults: DefaultRetryDelay, DefaultRetryFor (100 ms,
	// 10 s).
	RetryDelay, RetryFor time.Duration

	// ConnectTimeout bounds one connection attempt. Default:
	// dbconn.DefaultConnectTimeout.
	ConnectTimeout time.Duration

	// SampleEvery is how often pg_stat_activity is sampled. Default: 100 ms.
	SampleEvery time.Duration

	// Seed seeds the fleetpace pollers' jitter. Default: DefaultSeed.
	Seed uint64

	// Logger receives progress. Default: discard.
	Logger *slog.Logger
}

func (c DrillConfig) withDefaults() DrillConfig {
	c.MaxConnections = cmp.Or(c.MaxConnections, DefaultDrillMaxConnections)
	c.Pollers = cmp.Or(c.Pollers, DefaultDrillPollers)
	orDefault(&c.ClaimTime, DefaultDrillClaimTime)
	orDefault(&c.Base, poller.DefaultBase)
	orDefault(&c.Max, poller.DefaultMax)
	c.JitterRatio = cmp.Or(c.JitterRatio, poller.DefaultJitterRatio)
	orDefault(&c.Warmup, c.Max+10*time.Second)
	orDefault(&c.Window, DefaultDrillWindow)
	orDefault(&c.After, time.Duration(float64(c.Max)*(1+c.JitterRatio))+5*time.Second)
	orDefault(&c.RetryDelay, DefaultRetryDelay)
	orDefault(&c.RetryFor, DefaultRetryFor)
	orDefault(&c.ConnectTimeout, dbconn.DefaultConnectTimeout)
	orDefault(&c.SampleEvery, DefaultSampleEvery)
	c.Seed = cmp.Or(c.Seed, DefaultSeed)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c DrillConfig) Validate() error {
	d := c.withDefaults()
	switch {
	case c.MaxConnections < 0 || (c.DatabaseURL == "" && d.MaxConnections < 5):
		return invalid("MaxConnections %d must be ≥ 5", c.MaxConnections)
	case c.Pollers < 0 || d.Pollers > 10_000:
		return invalid("Pollers %d must be in 1..10000", c.Pollers)
	}
	if err := checkPolling(c.ClaimTime, c.Base, c.Max, d.Base, d.Max, c.JitterRatio); err != nil {
		return err
	}
	switch {
	case c.Warmup < 0, c.Window < 0, c.After < 0:
		return invalid("Warmup, Window and After must be > 0")
	case c.RetryDelay < 0 || c.RetryFor < 0:
		return invalid("RetryDelay and RetryFor must be > 0")
	case c.ConnectTimeout < 0 || c.SampleEvery < 0:
		return invalid("ConnectTimeout and SampleEvery must be > 0")
	}
	return nil
}

// DrillModes are the drill's two modes: fleetpace and the outage's
// baseline.
var DrillModes = []Mode{Fleetpace, Baseline}

// RecoveryBound is how soon after the window fleetpace must stop being
// refused: its longest sleep, Max × (1 + JitterRatio). A poller refused at
// the window's last instant polls again within it.
func (c DrillConfig) RecoveryBound() time.Duration {
	c = c.withDefaults()
	return time.Duration(float64(c.Max) * (1 + c.JitterRatio))
}

// DrillResult is what Drill measured.
type DrillResult struct {
	Config         DrillConfig       `json:"-"`
	MaxConnections int               `json:"max_connections"`
	Modes          []DrillModeResult `json:"modes"`
}

// DrillModeResult is one mode's figures. Times are seconds since the
// pollers started.
type DrillModeResult struct {
	Mode Mode   `json:"-"`
	Name string `json:"mode"`

	// PeakActive is the most of the pollers' backends active (running or
	// blocked in a claim) in any sample; PeakActiveAfter the same from the
	// window's end on (from a second and a claim time after it, when the
	// claims it blocked are done); PeakConnections counts idle ones too.
	PeakActive      int `json:"active_backends_peak"`
	PeakActiveAfter int `json:"active_backends_peak_after_window"`
	PeakConnections int `json:"connections_peak"`

	// Refused is every failed connection attempt; RefusedBy splits it by
	// SQLSTATE (53300: too many connections) or "timeout" / "other" for
	// errors without one; RefusedAfter counts those after the window.
	Refused      int64            `json:"refused"`
	RefusedBy    map[string]int64 `json:"refused_by"`
	RefusedAfter int64            `json:"refused_after_window"`

	// Polls is cycles run; Claims the claims that got a connection.
	Polls  int64 `json:"polls"`
	Claims int64 `json:"claims"`

	// RecoverySeconds is from the window's end to the start of the last
	// refused attempt (0 if none). Recovered says the run went on without a refusal for a
	// whole longest sleep (RecoveryBound) after it, so a herd coming back
	// would have shown.
	RecoverySeconds float64 `json:"recovery_seconds"`
	Recovered       bool    `json:"recovered"`

	// FirstPollSpread is the time between the 5th and the 95th percentile
	// of the pollers' first polls: ~0 when they start together, ~0.9 × Max
	// with startup jitter.
	FirstPollSpread float64 `json:"first_poll_spread_seconds"`

	WindowStart float64 `json:"window_start_seconds"`
	WindowEnd   float64 `json:"window_end_seconds"`
	Samples     int     `json:"samples"`

	// ActivePerSecond is the most active backends sampled in each second;
	// RefusedPerSecond the refused attempts in each.
	ActivePerSecond  []int   `json:"active_max_per_second"`
	RefusedPerSecond []int64 `json:"refused_per_second"`
}

// Mode returns the result of mode m, if it was drilled.
func (r *DrillResult) Mode(m Mode) (DrillModeResult, bool) {
	for _, mr := range r.Modes {
		if mr.Mode == m {
			return mr, true
		}
	}
	return DrillModeResult{}, false
}

// Drill runs the saturation drill once per mode of DrillModes, one after
// the other on the same server: Pollers pollers run poller.Run loops on the
// real clock, each claim taking a connection of the poller's own fail-fast
// dbconn pool and closing it afterwards (a connection per claim, as behind
// a transaction pooler); after Warmup, for Window, an advisory lock blocks
// every claim, so the claims in flight hold their connections and the
// server reaches max_connections; pg_stat_activity is sampled every
// SampleEvery.
func Drill(ctx context.Context, cfg DrillConfig) (*DrillResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	url := cfg.DatabaseURL
	if url == "" {
		cfg.Logger.Info("drill: starting a throwaway embedded PostgreSQL", "max_connections", cfg.MaxConnections)
		c, err := pgembed.Start(ctx, pgembed.Config{Logger: cfg.Logger,
			Settings: map[string]string{"max_connections": strconv.Itoa(cfg.MaxConnections)}})
		if err != nil {
			return nil, err
		}
		defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
		url = c.URL("postgres")
	}
	pc, err := dbconn.PoolConfig(dbconn.Config{URL: url, ConnectTimeout: cfg.ConnectTimeout, MaxConns: 1})
	if err != nil {
		return nil, err
	}
	res := &DrillResult{Config: cfg}
	for _, m := range DrillModes {
		r, maxConns, err := drillMode(ctx, cfg, pc, m)
		if err != nil {
			return nil, fmt.Errorf("drill %s: %w", m, err)
		}
		res.MaxConnections = maxConns
		res.Modes = append(res.Modes, *r)
	}
	return res, nil
}

// openOne opens a one-connection pool named app and takes its connection,
// for the sampler and the window's lock holder. These are the drill's own
// instruments, not pollers under test: between two modes the server may
// still be full of the last mode's backends on their way out, or slow to
// answer on a loaded machine (a monitor connection timed out after 2 s on
// CI), so each attempt may take instrumentConnectTimeout and a refused or
// timed-out one is tried again until instrumentWait has passed.
func openOne(ctx context.Context, base *pgxpool.Config, app string) (*pgxpool.Pool, *pgxpool.Conn, error) {
	pc := base.Copy()
	pc.ConnConfig.RuntimeParams["application_name"] = app
	pc.ConnConfig.ConnectTimeout = max(pc.ConnConfig.ConnectTimeout, instrumentConnectTimeout)
	deadline := time.Now().Add(instrumentWait)
	for {
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return nil, nil, err
		}
		c, err := pool.Acquire(ctx)
		if err == nil {
			return pool, c, nil
		}
		pool.Close()
		if ctx.Err() != nil || time.Now().After(deadline) {
			return nil, nil, err
		}
		select {
		case <-ctx.Done():
			return nil, nil, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// How long the drill's instruments may take to connect (see openOne).
const (
	instrumentConnectTimeout = 10 * time.Second
	instrumentWait           = 30 * time.Second
)

// drillCounters are the pollers' shared counters.
type drillCounters struct {
	t0          time.Time
	polls       atomic.Int64
	claims      atomic.Int64
	refusedSec  []atomic.Int64
	lastRefused atomic.Int64 // ns since t0
	windowOver  atomic.Bool
	afterWindow atomic.Int64 // refused attempts after the window closed
	mu          sync.Mutex
	refusedBy   map[string]int64
}

// refused counts an attempt that began at start and was refused. It is
// timed by its start, when the poller knocked: on a loaded machine a
// refusal takes a while to come back (a backend forked, then turned away),
// and recovery is about when pollers knock.
func (dc *drillCounters) refused(start time.Time, err error) {
	at := start.Sub(dc.t0)
	dc.refusedSec[min(int(at/time.Second), len(dc.refusedSec)-1)].Add(1)
	if dc.windowOver.Load() {
		dc.afterWindow.Add(1)
	}
	for {
		last := dc.lastRefused.Load()
		if int64(at) <= last || dc.lastRefused.CompareAndSwap(last, int64(at)) {
			break
		}
	}
	kind := "other"
	var pgErr *pgconn.PgError
	var netErr net.Error
	switch {
	case errors.As(err, &pgErr):
		kind = pgErr.Code
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		kind = "timeout"
	}
	dc.mu.Lock()
	dc.refusedBy[kind]++
	dc.mu.Unlock()
}

func drillMode(ctx context.Context, cfg DrillConfig, base *pgxpool.Config, m Mode) (*DrillModeResult, int, error) {
	log := cfg.Logger.With("mode", m.String())
	monPool, mon, err := openOne(ctx, base, drillApp+"-monitor")
	if err != nil {
		return nil, 0, fmt.Errorf("monitor connection: %w", err)
	}
	defer monPool.Close()
	defer mon.Release()
	var maxConns int
	if err := mon.QueryRow(ctx, maxConnectionsSQL).Scan(&maxConns); err != nil {
		return nil, 0, err
	}
	lockPool, lockConn, err := openOne(ctx, base, drillApp+"-window")
	if err != nil {
		return nil, 0, fmt.Errorf("window connection: %w", err)
	}
	defer lockPool.Close()
	defer lockConn.Release()
	lockKey := rand.Int64()

	pools := make([]*pgxpool.Pool, cfg.Pollers)
	defer func() {
		for _, p := range pools {
			if p != nil {
				p.Close()
			}
		}
	}()
	for i := range pools {
		pc := base.Copy()
		pc.ConnConfig.RuntimeParams["application_name"] = drillApp
		if pools[i], err = pgxpool.NewWithConfig(ctx, pc); err != nil {
			return nil, 0, err
		}
	}

	total := cfg.Warmup + cfg.Window + cfg.After
	secs := int(total/time.Second) + 2
	dc := &drillCounters{refusedSec: make([]atomic.Int64, secs), refusedBy: map[string]int64{}}
	var (
		samples          []drillSample
		winStart, winEnd time.Duration
	)
	log.Info("drill: pollers starting", "pollers", cfg.Pollers, "max_connections", maxConns)
	dc.t0 = time.Now()
	runCtx, cancel := context.WithDeadline(ctx, dc.t0.Add(total))
	defer cancel()
	g, gctx := errgroup.WithContext(runCtx)

	// The sampler.
	g.Go(func() error {
		t := time.NewTicker(cfg.SampleEvery)
		defer t.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-t.C:
			}
			var s drillSample
			s.at = time.Since(dc.t0)
			// Not cancelled with the run: a query cut short closes the
			// connection, which waitGone still needs.
			qctx, qcancel := context.WithTimeout(context.WithoutCancel(gctx), 10*time.Second)
			err := mon.QueryRow(qctx, sampleSQL, drillApp).Scan(&s.active, &s.total)
			qcancel()
			if err != nil {
				return fmt.Errorf("sampling pg_stat_activity: %w", err)
			}
			samples = append(samples, s)
		}
	})

	// The window: an exclusive advisory lock every claim waits for.
	g.Go(func() error {
		if clock.Sleep(gctx, clock.Real(), time.Until(dc.t0.Add(cfg.Warmup))) != nil {
			return nil
		}
		winStart = time.Since(dc.t0)
		log.Info("drill: saturation window opens")
		if _, err := lockConn.Exec(gctx, windowLockSQL, lockKey); err != nil {
			if gctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("window lock: %w", err)
		}
		sleepErr := clock.Sleep(gctx, clock.Real(), time.Until(dc.t0.Add(cfg.Warmup+cfg.Window)))
		// Unlock even when stopping, so no claim stays blocked.
		if _, err := lockConn.Exec(context.WithoutCancel(ctx), windowUnlockSQL, lockKey); err != nil {
			return fmt.Errorf("window unlock: %w", err)
		}
		winEnd = time.Since(dc.t0)
		dc.windowOver.Store(true)
		log.Info("drill: saturation window closes")
		_ = sleepErr
		return nil
	})

	claimSecs := cfg.ClaimTime.Seconds()
	firstPoll := make([]time.Duration, len(pools)) // each written by its poller only
	for i, pool := range pools {
		pcfg := poller.Config{Base: cfg.Base, Max: cfg.Max, JitterRatio: cfg.JitterRatio,
			Rand: rand.New(rand.NewPCG(cfg.Seed, uint64(i))).Float64}
		if !m.StartupJitter {
			pcfg.StartupJitter = poller.NoStartupJitter
		}
		if !m.CycleJitter {
			pcfg.JitterRatio = poller.NoJitter
		}
		g.Go(func() error {
			first := true
			return poller.Run(gctx, pcfg, func(ctx context.Context) (bool, error) {
				if first {
					firstPoll[i], first = time.Since(dc.t0), false
				}
				dc.polls.Add(1)
				c, err := acquire(ctx, pool, m.Retry, cfg.RetryDelay, cfg.RetryFor, dc)
				if err != nil {
					return false, err
				}
				dc.claims.Add(1)
				conn := c.Hijack()
				defer func() {
					cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
					_ = conn.Close(cctx)
					ccancel()
				}()
				_, err = conn.Exec(ctx, claimSQL, lockKey, claimSecs)
				return false, err
			})
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, err
	}
	for _, p := range pools {
		p.Close()
	}
	if err := waitGone(ctx, mon); err != nil {
		return nil, 0, err
	}

	r := &DrillModeResult{Mode: m, Name: m.Label(), Polls: dc.polls.Load(), Claims: dc.claims.Load(),
		RefusedBy: dc.refusedBy, WindowStart: winStart.Seconds(), WindowEnd: winEnd.Seconds(), Samples: len(samples)}
	// The claims blocked by the window end within a claim time of it.
	settle := cfg.ClaimTime + time.Second
	r.ActivePerSecond = make([]int, int(total/time.Second))
	r.RefusedPerSecond = make([]int64, len(r.ActivePerSecond))
	for _, s := range samples {
		r.PeakActive = max(r.PeakActive, s.active)
		r.PeakConnections = max(r.PeakConnections, s.total)
		if s.at >= winEnd+settle {
			r.PeakActiveAfter = max(r.PeakActiveAfter, s.active)
		}
		if i := int(s.at / time.Second); i < len(r.ActivePerSecond) {
			r.ActivePerSecond[i] = max(r.ActivePerSecond[i], s.active)
		}
	}
	for i := range dc.refusedSec {
		n := dc.refusedSec[i].Load()
		r.Refused += n
		if i < len(r.RefusedPerSecond) {
			r.RefusedPerSecond[i] = n
		}
	}
	r.RefusedAfter = dc.afterWindow.Load()
	slices.Sort(firstPoll)
	n := len(firstPoll)
	r.FirstPollSpread = (firstPoll[n*95/100] - firstPoll[n*5/100]).Seconds()
	last := time.Duration(dc.lastRefused.Load())
	if last > winEnd {
		r.RecoverySeconds = (last - winEnd).Seconds()
	}
	r.Recovered = max(last, winEnd)+cfg.RecoveryBound() <= total

	log.Info("drill: mode done", "refused", r.Refused, "peak_active", r.PeakActive)
	return r, maxConns, nil
}

type drillSample struct {
	at            time.Duration
	active, total int
}

// acquire takes a connection: one attempt (fail-fast), or, with retry,
// attempts every delay for up to budget while the database is unavailable
// — the baseline's retry-on-acquire.
func acquire(ctx context.Context, pool *pgxpool.Pool, retry bool, delay, budget time.Duration, dc *drillCounters) (*pgxpool.Conn, error) {
	deadline := time.Now().Add(budget)
	for {
		start := time.Now()
		c, err := pool.Acquire(ctx)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		dc.refused(start, err)
		if !retry || !dbconn.IsUnavailable(err) || time.Now().Add(delay).After(deadline) {
			return nil, err
		}
		if clock.Sleep(ctx, clock.Real(), delay) != nil {
			return nil, err
		}
	}
}

// waitGone waits until the server has no drill connection left (closing
// connections end on the server a little after the client closes them), so
// the next mode starts on an empty server.
func waitGone(ctx context.Context, mon *pgxpool.Conn) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var active, total int
		if err := mon.QueryRow(ctx, sampleSQL, drillApp).Scan(&active, &total); err != nil {
			return err
		}
		if total == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d drill connections still open 30 s after the pollers stopped", total)
		}
		if err := clock.Sleep(ctx, clock.Real(), 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// sortedKinds returns the keys of RefusedBy in order.
func sortedKinds(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// WriteText prints the drill's figures, fleetpace first.
func (r *DrillResult) WriteText(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "simulate drill: %d pollers against max_connections %d; claim %s; poll %s→%s; "+
		"window of %s after %s (an advisory lock blocks every claim), %s after it; sampled every %s\n\n",
		c.Pollers, r.MaxConnections, c.ClaimTime, c.Base, c.Max, c.Window, c.Warmup, c.After, c.SampleEvery)
	for _, m := range r.Modes {
		fmt.Fprintf(w, "%s\n", m.Name)
		fmt.Fprintf(w, "  active backends, peak: %d of %d (after the window: %d); connections, peak: %d\n",
			m.PeakActive, r.MaxConnections, m.PeakActiveAfter, m.PeakConnections)
		fmt.Fprintf(w, "  refused connection attempts: %d (after the window: %d)", m.Refused, m.RefusedAfter)
		for _, k := range sortedKinds(m.RefusedBy) {
			fmt.Fprintf(w, "; %s: %d", k, m.RefusedBy[k])
		}
		fmt.Fprintf(w, "\n  polls %d, claims served %d; first polls spread over %.1f s (5th–95th percentile)\n", m.Polls, m.Claims, m.FirstPollSpread)
		rec := fmt.Sprintf("%.1f s after the window", m.RecoverySeconds)
		if !m.Recovered {
			rec = fmt.Sprintf("not recovered: refused %.1f s after the window, less than %s before the end", m.RecoverySeconds, c.RecoveryBound())
		}
		fmt.Fprintf(w, "  recovered (last refused attempt): %s\n", rec)
		scale := 1
		for _, v := range m.ActivePerSecond {
			scale = max(scale, v)
		}
		fmt.Fprintf(w, "  active/s  %s (█ = %d; window %.0f–%.0f s)\n", Sparkline(m.ActivePerSecond, 1, scale), scale, m.WindowStart, m.WindowEnd)
		ref := make([]int, len(m.RefusedPerSecond))
		rscale := 1
		for i, v := range m.RefusedPerSecond {
			ref[i] = int(v)
			rscale = max(rscale, int(v))
		}
		fmt.Fprintf(w, "  refused/s %s (█ = %d)\n\n", Sparkline(ref, 1, rscale), rscale)
	}
	fmt.Fprintf(w, "fleetpace's bound: no attempt refused later than %s (its longest sleep) after the window.\n", c.RecoveryBound())
	return nil
}

// WriteJSON prints the drill's figures as one JSON object.
func (r *DrillResult) WriteJSON(w io.Writer) error {
	c := r.Config
	out := struct {
		Pollers        int               `json:"pollers"`
		MaxConnections int               `json:"max_connections"`
		ClaimTime      float64           `json:"claim_time_seconds"`
		Base           float64           `json:"poll_base_seconds"`
		Max            float64           `json:"poll_max_seconds"`
		Warmup         float64           `json:"warmup_seconds"`
		Window         float64           `json:"window_seconds"`
		After          float64           `json:"after_seconds"`
		RecoveryBound  float64           `json:"fleetpace_recovery_bound_seconds"`
		Modes          []DrillModeResult `json:"modes"`
	}{c.Pollers, r.MaxConnections, c.ClaimTime.Seconds(), c.Base.Seconds(), c.Max.Seconds(), c.Warmup.Seconds(),
		c.Window.Seconds(), c.After.Seconds(), c.RecoveryBound().Seconds(), r.Modes}
	return writeJSON(w, out)
}
