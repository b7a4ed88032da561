package pacer

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/pacetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

// TestMain runs the tests on one embedded cluster and then checks that no
// goroutine of the package is left running (timers, listeners, pools).
func TestMain(m *testing.M) {
	// The simulations keep one CPU busy; the tests of several processes
	// mostly wait on real time.
	testdb.ParallelByDefault(3)
	code := testdb.Run(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// setup returns a fresh database (URL and an admin pool) with the schema
// and platforms (addPlatform).
func setup(t *testing.T, platforms ...platformSpec) (string, *pgxpool.Pool) {
	t.Helper()
	url := testdb.URL(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for _, p := range platforms {
		addPlatform(t, pool, p)
	}
	return url, pool
}

// platformSpec is a platform for a test. Its adaptation defaults to the
// seed's schedule (×2 on pressure, ÷2 after decay_after clean, no probing),
// which the older tests assert exactly; probe sets the probing controller
// with backoff and recovery factors.
type platformSpec struct {
	name       string
	rate       float64
	burst      int
	maxMult    float64
	decayAfter int
	backoff    float64 // default 2
	recovery   float64 // default 2
	probe      bool
	noHeaders  bool
	noRespace  bool
	// adapt is the platform's adaptation: "multiplier" (the default here:
	// the older tests assert the multiplier's schedule) or "estimate".
	adapt string
}

func addPlatform(t *testing.T, pool *pgxpool.Pool, s platformSpec) {
	t.Helper()
	if s.burst == 0 {
		s.burst = 1
	}
	if s.maxMult == 0 {
		s.maxMult = 16
	}
	if s.decayAfter == 0 {
		s.decayAfter = 100
	}
	if s.backoff == 0 {
		s.backoff = 2
	}
	if s.recovery == 0 {
		s.recovery = 2
	}
	if s.adapt == "" {
		s.adapt = "multiplier"
	}
	_, err := pool.Exec(context.Background(),
		`INSERT INTO fleetpace_platform (name, rate_per_sec, burst, max_multiplier, decay_after,
		     backoff_factor, recovery_factor, probe, use_headers, respace, adapt)
		 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		s.name, s.rate, s.burst, s.maxMult, s.decayAfter, s.backoff, s.recovery, s.probe, !s.noHeaders, !s.noRespace, s.adapt)
	if err != nil {
		t.Fatal(err)
	}
}

func newPacer(t *testing.T, url string, mod func(*Config)) *Pacer {
	t.Helper()
	cfg := Config{DatabaseURL: url}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// paceRow reads the raw shared state of a platform.
type paceRow struct {
	cursor, mult, hold, doubledAt float64
	streak                        int
}

func readRow(t *testing.T, pool *pgxpool.Pool, platform string) paceRow {
	t.Helper()
	var r paceRow
	err := pool.QueryRow(context.Background(),
		`SELECT cursor_at, multiplier, hold_until, doubled_at, clean_streak FROM fleetpace_pace WHERE platform = $1`, platform).
		Scan(&r.cursor, &r.mult, &r.hold, &r.doubledAt, &r.streak)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func span(ts []time.Time) time.Duration {
	if len(ts) < 2 {
		return 0
	}
	lo, hi := ts[0], ts[0]
	for _, t := range ts {
		if t.Before(lo) {
			lo = t
		}
		if t.After(hi) {
			hi = t
		}
	}
	return hi.Sub(lo)
}

// ceilingViolations checks a merged timeline of granted times against a
// fleet-wide ceiling: no 1-s window above rate+burst, and a span of at least
// (n - burst) / rate × 0.95. It returns the violations (none: nil).
func ceilingViolations(ts []time.Time, ratePerSec float64, burst int) []string {
	var out []string
	if w, limit := fakedest.MaxInWindow(ts, time.Second), int(ratePerSec)+burst; w > limit {
		out = append(out, fmt.Sprintf("a 1-s window holds %d grants, ceiling+burst is %d", w, limit))
	}
	minSpan := time.Duration(float64(len(ts)-burst) / ratePerSec * 0.95 * float64(time.Second))
	if s := span(ts); s < minSpan {
		out = append(out, fmt.Sprintf("%d grants spanned %s, at %g/s they need at least %s (delivered %.1f/s)",
			len(ts), s, ratePerSec, minSpan, float64(len(ts)-1)/s.Seconds()))
	}
	return out
}

// --- child processes -------------------------------------------------------

const helperEnv = "FLEETPACE_PACER_HELPER"

// childResult is what a helper process prints.
type childResult struct {
	Fires    []int64 `json:"fires"`    // unix nanos of granted requests (after the sleep)
	Degraded []bool  `json:"degraded"` // per fire: paced locally
	Dials    []int64 `json:"dials"`    // unix nanos of TCP dials to the database
	Stats    Stats   `json:"stats"`
	Err      string  `json:"err,omitempty"`
}

func (r childResult) fireTimes() []time.Time {
	out := make([]time.Time, len(r.Fires))
	for i, n := range r.Fires {
		out[i] = time.Unix(0, n)
	}
	return out
}

// TestHelperProcess is not a test: it is the body of the child processes the
// multi-process tests start by re-executing the test binary.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		return
	}
	res := runHelper()
	b, _ := json.Marshal(res)
	fmt.Fprintf(os.Stdout, "\nRESULT %s\n", b)
	os.Exit(0)
}

func envInt(name string) int64 {
	n, _ := strconv.ParseInt(os.Getenv(name), 10, 64)
	return n
}

func runHelper() (res childResult) {
	ctx := context.Background()
	mode := os.Getenv("PACER_MODE")
	url := os.Getenv("PACER_URL")
	platform := os.Getenv("PACER_PLATFORM")
	count := int(envInt("PACER_COUNT"))
	start := time.Unix(0, envInt("PACER_START"))
	deadline := start.Add(time.Duration(envInt("PACER_DURATION")))
	ratePerSec, _ := strconv.ParseFloat(os.Getenv("PACER_RATE"), 64)
	burst := int(envInt("PACER_BURST"))
	fleet := int(envInt("PACER_FLEET"))

	var mu sync.Mutex
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	dial := pc.ConnConfig.DialFunc
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		res.Dials = append(res.Dials, time.Now().UnixNano())
		mu.Unlock()
		return dial(ctx, network, addr)
	}
	p, err := New(ctx, Config{PoolConfig: pc})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer p.Close()
	if fleet > 0 {
		p.SetFleetSize(fleet)
	}
	more := func(i int) bool {
		if count > 0 {
			return i < count
		}
		return time.Now().Before(deadline)
	}
	time.Sleep(time.Until(start))

	switch mode {
	case "pace":
		for i := 0; more(i); i++ {
			r, err := p.Wait(ctx, platform)
			if err != nil {
				res.Err = err.Error()
				break
			}
			now := time.Now()
			if count == 0 && !now.Before(deadline) {
				break
			}
			res.Fires = append(res.Fires, now.UnixNano())
			res.Degraded = append(res.Degraded, r.Degraded)
		}
	case "naive":
		lim := rate.NewLimiter(rate.Limit(ratePerSec), burst)
		for i := 0; more(i); i++ {
			if err := lim.Wait(ctx); err != nil {
				res.Err = err.Error()
				break
			}
			res.Fires = append(res.Fires, time.Now().UnixNano())
		}
	case "report":
		r, err := p.Reserve(ctx, platform, time.Hour)
		if err != nil {
			res.Err = err.Error()
			break
		}
		for range count {
			if _, err := p.Report(ctx, platform, r, Feedback{Kind: Clean}); err != nil {
				res.Err = err.Error()
				break
			}
		}
	default:
		res.Err = "unknown PACER_MODE " + mode
	}
	res.Stats = p.Stats()
	return res
}

// runChildren starts n helper processes with env (plus per-child extras) and
// returns their results once all have exited.
func runChildren(t *testing.T, n int, env map[string]string) []childResult {
	t.Helper()
	pacetest.SkipShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type proc struct {
		cmd *exec.Cmd
		out *strings.Builder
	}
	procs := make([]proc, n)
	for i := range procs {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnv+"=1")
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		out := &strings.Builder{}
		cmd.Stdout = out
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = proc{cmd, out}
	}
	results := make([]childResult, n)
	for i, pr := range procs {
		if err := pr.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, pr.out)
		}
		found := false
		sc := bufio.NewScanner(strings.NewReader(pr.out.String()))
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
				if err := json.Unmarshal([]byte(line), &results[i]); err != nil {
					t.Fatalf("child %d: %v", i, err)
				}
				found = true
			}
		}
		if !found {
			t.Fatalf("child %d printed no result:\n%s", i, pr.out)
		}
		if results[i].Err != "" {
			t.Fatalf("child %d: %s", i, results[i].Err)
		}
	}
	return results
}

func merged(rs []childResult) []time.Time {
	var out []time.Time
	for _, r := range rs {
		out = append(out, r.fireTimes()...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// proxy is a loopback TCP proxy to the database that a test can cut (all
// connections closed, new ones refused) and restore, to simulate an outage
// without stopping the shared test server.
type proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	cut      bool
	conns    []net.Conn
	accepted int
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go p.serve()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.accepted++
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		go func() { _, _ = copyConn(u, c); u.Close(); c.Close() }()
		go func() { _, _ = copyConn(c, u); u.Close(); c.Close() }()
	}
}

func copyConn(dst, src net.Conn) (int64, error) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if err != nil {
			return n, err
		}
	}
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

func (p *proxy) acceptedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// paceCrosses is when the adaptive pace first passes share × est (the
// estimate and its upper reading one), seconds after the estimate was set
// (fleetpace_pace_adaptive, under a ceiling of 100/s).
func paceCrosses(t *testing.T, pool *pgxpool.Pool, tune tuning, est, share float64) float64 {
	t.Helper()
	return boundCrosses(t, pool, tune, est, est, share)
}

// boundCrosses is paceCrosses from est towards a bound estMax: when the
// pace first passes share × estMax.
func boundCrosses(t *testing.T, pool *pgxpool.Pool, tune tuning, est, estMax, share float64) float64 {
	t.Helper()
	return plateauCrosses(t, pool, tune, est, estMax, 0, share)
}

// plateauCrosses is boundCrosses with the row's est_plateau (seconds).
func plateauCrosses(t *testing.T, pool *pgxpool.Pool, tune tuning, est, estMax, plateau, share float64) float64 {
	t.Helper()
	var at float64
	err := pool.QueryRow(context.Background(), `SELECT min(s) FROM generate_series(0, 600, 0.05) AS s
		WHERE 1 / fleetpace_pace_adaptive('estimate', 100, 1, $1, $2, $5, s, $3) > $4 * $2`,
		est, estMax, tune.array(), share, plateau).Scan(&at)
	if err != nil {
		t.Fatal(err)
	}
	return at
}
