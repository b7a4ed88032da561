// Package adapters proves nested limits through the pacer's adapters —
// pacer.Transport (Transport.Key) and the River middleware
// (riverpace.Config.Key) — with three child processes each (internal/
// testproc) against a fake destination: no key over its rate + burst, the
// platform never over its own, a 429 with Retry-After for one key holding
// that key alone, a cap on open requests kept; per-process limiters (the
// naive model) break the limits in the same setup.
package adapters

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"golang.org/x/time/rate"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/pacetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/internal/testproc"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/pacer/riverpace"
	"github.com/fleetpace/fleetpace/sources"
)

// The load, per process: hotSenders goroutines (River: jobs) on the hot
// key, one per cold key, slowSenders on the capped platform.
const (
	procs       = 3
	apiRate     = 10.0 // platform "api", burst apiBurst
	apiBurst    = 2
	keyRate     = 2.0 // each key of "api", burst 1
	coldKeys    = 8
	hotSenders  = 4
	slowCap     = 3 // platform "slow": at most 3 open, answers in slowDelay
	slowDelay   = 300 * time.Millisecond
	slowSenders = 3
	holdFor     = 3 * time.Second
)

// keyOf is the key of a request to /k/KEY/…: Transport.Key reads it so.
func keyOf(req *http.Request) string {
	rest, ok := strings.CutPrefix(req.URL.Path, "/k/")
	if !ok {
		return ""
	}
	k, _, _ := strings.Cut(rest, "/")
	return k
}

// platformOf maps /k/ to "api" and /s/ to "slow".
func platformOf(path string) string {
	switch {
	case strings.HasPrefix(path, "/k/"):
		return "api"
	case strings.HasPrefix(path, "/s/"):
		return "slow"
	}
	return ""
}

// naiveLimiters are what fleetpace replaces: a limiter per process for
// the platform and for each key, at the same rates.
type naiveLimiters struct {
	mu   sync.Mutex
	lims map[string]*rate.Limiter
	slow chan struct{} // the cap on open requests, per process
}

func newNaive() *naiveLimiters {
	return &naiveLimiters{lims: map[string]*rate.Limiter{"api": rate.NewLimiter(apiRate, apiBurst)}, slow: make(chan struct{}, slowCap)}
}

// wait waits as the naive model would before a request to path; done ends
// the request.
func (n *naiveLimiters) wait(ctx context.Context, path string) (done func(), err error) {
	if platformOf(path) == "slow" {
		select {
		case n.slow <- struct{}{}:
			return func() { <-n.slow }, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	key := strings.SplitN(strings.TrimPrefix(path, "/k/"), "/", 2)[0]
	n.mu.Lock()
	kl, ok := n.lims[key]
	if !ok {
		kl = rate.NewLimiter(keyRate, 1)
		n.lims[key] = kl
	}
	api := n.lims["api"]
	n.mu.Unlock()
	if err := kl.Wait(ctx); err != nil {
		return nil, err
	}
	return func() {}, api.Wait(ctx)
}

// childResult is what a child reports.
type childResult struct {
	Sent int `json:"sent"`
	// NoSlot counts requests the Transport refused unsent (pacer.ErrNoSlot:
	// no slot within the wait allowed), which the sender asks again.
	NoSlot int    `json:"no_slot"`
	Err    string `json:"err,omitempty"`
}

// TestKeysChild is not a test: it is the body of the child processes.
// KEYS_ADAPTER=transport sends from goroutines through an http.Client
// (pacer.Transport with Key in paced mode); river works jobs with the
// riverpace middleware (Config.Key). KEYS_MODE=naive puts per-process
// limiters in the pacer's place.
func TestKeysChild(t *testing.T) {
	if !testproc.IsChild() {
		return
	}
	var res childResult
	var err error
	switch os.Getenv("KEYS_ADAPTER") {
	case "transport":
		res, err = transportChild()
	case "river":
		res, err = riverChild()
	default:
		err = fmt.Errorf("unknown KEYS_ADAPTER %q", os.Getenv("KEYS_ADAPTER"))
	}
	if err != nil {
		res.Err = err.Error()
	}
	testproc.Exit(res)
}

func transportChild() (childResult, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-testproc.Stopped(); cancel() }()
	target := os.Getenv("KEYS_TARGET")
	paced := os.Getenv("KEYS_MODE") == pacetest.Paced
	var rt http.RoundTripper = http.DefaultTransport
	naive := newNaive()
	if paced {
		p, err := pacer.New(ctx, pacer.Config{DatabaseURL: os.Getenv("KEYS_DATABASE_URL"), MinFleetSize: procs}) // a library fleet sets its size (pacer.Config.MinFleetSize)
		if err != nil {
			return childResult{}, err
		}
		defer p.Close()
		tr := &pacer.Transport{Pacer: p, Key: keyOf, Platform: func(r *http.Request) string { return platformOf(r.URL.Path) }}
		if d, err := time.ParseDuration(os.Getenv("KEYS_TRANSPORT_MAX_WAIT")); err == nil {
			tr.MaxWait = d
		}
		rt = tr
	}
	client := &http.Client{Transport: rt}
	var mu sync.Mutex
	var res childResult
	send := func(path string) {
		for n := 0; ctx.Err() == nil; n++ {
			done := func() {}
			if !paced {
				var err error
				if done, err = naive.wait(ctx, path); err != nil {
					return
				}
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, target+path+strconv.Itoa(n), nil)
			req.Header.Set("User-Agent", pacetest.UserAgent(testproc.Index()))
			resp, err := client.Do(req)
			done()
			if errors.Is(err, pacer.ErrNoSlot) {
				mu.Lock()
				res.NoSlot++
				mu.Unlock()
				continue // no slot within the wait allowed: ask again
			}
			if err != nil {
				if ctx.Err() == nil {
					mu.Lock()
					res.Err = err.Error()
					mu.Unlock()
				}
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			res.Sent++
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for _, path := range senders() {
		wg.Go(func() { send(path) })
	}
	wg.Wait()
	return res, nil
}

// senders are the paths (less their sequence number) a process sends to,
// one sender each.
func senders() []string {
	var out []string
	for range hotSenders {
		out = append(out, "/k/hot/")
	}
	for i := range coldKeys {
		out = append(out, fmt.Sprintf("/k/cold%d/", i))
	}
	for range slowSenders {
		out = append(out, "/s/")
	}
	return out
}

// callArgs is the River job: one GET of Path; Platform and Key for the
// middleware (riverpace.ArgsField).
type callArgs struct {
	Path     string `json:"path"`
	Platform string `json:"platform"`
	Key      string `json:"key,omitempty"`
}

func (callArgs) Kind() string { return "keys_call" }

type callWorker struct {
	river.WorkerDefaults[callArgs]
	target, ua string
	naive      *naiveLimiters
	mu         sync.Mutex
	sent       int
}

func (w *callWorker) Work(ctx context.Context, job *river.Job[callArgs]) error {
	if w.naive != nil {
		done, err := w.naive.wait(ctx, job.Args.Path)
		if err != nil {
			return err
		}
		defer done()
	}
	resp, err := pacetest.Get(ctx, w.target+job.Args.Path, w.ua)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.sent++
	w.mu.Unlock()
	if resp.StatusCode == http.StatusTooManyRequests {
		ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		return &riverpace.RateLimitedError{RetryAfter: time.Duration(ra) * time.Second}
	}
	return nil
}

func riverChild() (childResult, error) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("KEYS_DATABASE_URL"))
	if err != nil {
		return childResult{}, err
	}
	defer pool.Close()
	w := &callWorker{target: os.Getenv("KEYS_TARGET"), ua: pacetest.UserAgent(testproc.Index())}
	var mws []rivertype.Middleware
	if os.Getenv("KEYS_MODE") == pacetest.Paced {
		p, err := pacer.New(ctx, pacer.Config{DatabaseURL: os.Getenv("KEYS_DATABASE_URL"), MinFleetSize: procs}) // a library fleet sets its size (pacer.Config.MinFleetSize)
		if err != nil {
			return childResult{}, err
		}
		defer p.Close()
		mw, err := riverpace.New(riverpace.Config{Pacer: p, Platform: riverpace.ArgsField("platform"), Key: riverpace.ArgsField("key")})
		if err != nil {
			return childResult{}, err
		}
		mws = append(mws, mw)
	} else {
		w.naive = newNaive()
	}
	ws := river.NewWorkers()
	river.AddWorker(ws, w)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: hotSenders + coldKeys + slowSenders}},
		Workers:           ws,
		Middleware:        mws,
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return childResult{}, err
	}
	if err := client.Start(ctx); err != nil {
		return childResult{}, err
	}
	<-testproc.Stopped()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = client.StopAndCancel(sctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	return childResult{Sent: w.sent}, err
}

// fleet starts three children of adapter in mode against a fresh
// destination and database.
func fleet(t *testing.T, adapter, mode string) (*fakedest.Server, func()) {
	t.Helper()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.PoolOf(t, url)
	for _, p := range []sources.Platform{
		{Name: "api", RatePerSec: apiRate, Burst: apiBurst, KeyRate: keyRate, KeyBurst: 1},
		{Name: "slow", RatePerSec: 100, Burst: 10, MaxInFlight: slowCap},
	} {
		if _, err := sources.SetPlatform(ctx, pool, p); err != nil {
			t.Fatal(err)
		}
	}
	dest := pacetest.StartDest(t)
	if err := dest.SetRule("/s/", fakedest.Rule{Delay: slowDelay}); err != nil {
		t.Fatal(err)
	}
	if adapter == "river" {
		client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		// Enough jobs for the run, interleaved as the senders are.
		var params []river.InsertManyParams
		for n := range 150 {
			for _, path := range senders() {
				a := callArgs{Path: path + strconv.Itoa(n), Platform: platformOf(path), Key: strings.SplitN(strings.TrimPrefix(path, "/k/"), "/", 2)[0]}
				if a.Platform == "slow" {
					a.Key = ""
				}
				params = append(params, river.InsertManyParams{Args: a})
			}
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			t.Fatal(err)
		}
	}
	g := testproc.Start(t, testproc.Config{Run: "TestKeysChild", N: procs, Env: map[string]string{
		"KEYS_ADAPTER": adapter, "KEYS_MODE": mode, "KEYS_DATABASE_URL": url, "KEYS_TARGET": dest.URL(),
		"KEYS_TRANSPORT_MAX_WAIT": os.Getenv("KEYS_TRANSPORT_MAX_WAIT"),
	}})
	return dest, func() {
		t.Helper()
		out := make([]childResult, procs)
		g.Stop(t, func(i int, b []byte) error { return json.Unmarshal(b, &out[i]) })
		for i, r := range out {
			if r.Err != "" {
				t.Fatalf("process %d: %s", i, r.Err)
			}
		}
		t.Logf("%s %s: per process %+v", adapter, mode, out)
	}
}

// measure is what the destination saw of one run.
type measure struct {
	requests, hotWindow, apiWindow, slowOpen int
	apiRate                                  float64
	holdViolations                           []string
	coldDuringHold                           float64
}

func (m measure) String() string {
	return fmt.Sprintf("%d requests; api %.1f/s, largest 1-s window %d (bound %d); hot key's largest 1-s window %d (bound %d); slow: at most %d open (cap %d); cold keys %.1f/s during the hot key's hold",
		m.requests, m.apiRate, m.apiWindow, int(apiRate)+apiBurst, m.hotWindow, int(keyRate)+1, m.slowOpen, slowCap, m.coldDuringHold)
}

// run runs one fleet; in paced mode the hot key is answered 429 +
// Retry-After: 3 once, halfway.
func run(t *testing.T, adapter, mode string) measure {
	t.Helper()
	dest, stop := fleet(t, adapter, mode)
	pacetest.Poll(t, time.Minute, "60 requests to api", func() bool { return dest.Count("/k/") >= 60 })
	var first429 time.Time
	if mode == pacetest.Paced {
		first429 = pacetest.HoldAfter(t, dest, "/k/hot/", holdFor)
		deadline := time.Now().Add(time.Minute)
		for {
			ts := dest.Arrivals("/k/hot/")
			if len(ts) > 0 && ts[len(ts)-1].After(first429.Add(holdFor)) {
				break
			}
			if time.Now().After(deadline) {
				var seen []string
				for _, r := range dest.Requests() {
					if strings.HasPrefix(r.Path, "/k/hot/") && !r.Time.Before(first429.Add(-time.Second)) {
						seen = append(seen, fmt.Sprintf("%s +%s %d", r.UserAgent, r.Time.Sub(first429).Round(time.Millisecond), r.Status))
					}
				}
				t.Fatalf("the hot key sent nothing after its %s hold (a minute): around the 429: %v; api %d requests", holdFor, seen, dest.Count("/k/"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	pacetest.Poll(t, time.Minute, "160 requests to api", func() bool { return dest.Count("/k/") >= 160 })
	stop()

	var m measure
	var api, hot []time.Time
	var slow []fakedest.Request
	cold := 0
	for _, r := range dest.Requests() {
		m.requests++
		switch {
		case strings.HasPrefix(r.Path, "/k/"):
			api = append(api, r.Time)
			if strings.HasPrefix(r.Path, "/k/hot/") {
				hot = append(hot, r.Time)
				if !first429.IsZero() && r.Time.After(first429.Add(500*time.Millisecond)) && r.Time.Before(first429.Add(holdFor)) {
					m.holdViolations = append(m.holdViolations, fmt.Sprintf("%s +%s", r.UserAgent, r.Time.Sub(first429).Round(time.Millisecond)))
				}
			} else if !first429.IsZero() && r.Time.After(first429.Add(500*time.Millisecond)) && r.Time.Before(first429.Add(holdFor)) {
				cold++
			}
		case strings.HasPrefix(r.Path, "/s/"):
			slow = append(slow, r)
		}
	}
	m.apiWindow = fakedest.MaxInWindow(api, time.Second)
	m.hotWindow = fakedest.MaxInWindow(hot, time.Second)
	if len(api) > 1 {
		m.apiRate = float64(len(api)-1) / api[len(api)-1].Sub(api[0]).Seconds()
	}
	m.slowOpen = maxOpen(slow)
	m.coldDuringHold = float64(cold) / (holdFor - 500*time.Millisecond).Seconds()
	return m
}

// maxOpen is the most requests open at once (arrival to answer; an
// unanswered one until now).
func maxOpen(reqs []fakedest.Request) int {
	most := 0
	for _, a := range reqs {
		n := 0
		for _, b := range reqs {
			end := b.Done
			if end.IsZero() {
				end = time.Now()
			}
			if !b.Time.After(a.Time) && end.After(a.Time) {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

func check(t *testing.T, adapter string) {
	paced := run(t, adapter, pacetest.Paced)
	t.Logf("%s, 3 processes, paced: %s", adapter, paced)
	if paced.apiWindow > int(apiRate)+apiBurst {
		t.Errorf("the platform's ceiling broken: %s", paced)
	}
	if paced.hotWindow > int(keyRate)+1 {
		t.Errorf("the hot key's limit broken: %s", paced)
	}
	if paced.slowOpen > slowCap {
		t.Errorf("the cap on open requests broken: %s", paced)
	}
	if len(paced.holdViolations) > 0 {
		t.Errorf("the hot key was not held for %s: %v", holdFor, paced.holdViolations)
	}
	if paced.apiRate < 0.8*apiRate {
		t.Errorf("the fleet delivered under 80 %% of the platform's ceiling: %s", paced)
	}
	if paced.coldDuringHold < 0.8*apiRate {
		t.Errorf("the other keys slowed during the hot key's hold: %s", paced)
	}
	t.Run("naive per-process limiters break the limits", func(t *testing.T) {
		naive := run(t, adapter, pacetest.Naive)
		t.Logf("%s, 3 processes, naive: %s", adapter, naive)
		if naive.apiWindow <= int(apiRate)+apiBurst || naive.hotWindow <= int(keyRate)+1 || naive.slowOpen <= slowCap {
			t.Errorf("the naive model kept a limit: %s", naive)
		}
	})
}

// Three processes sending through pacer.Transport with Transport.Key.
func TestTransportKeysThreeProcesses(t *testing.T) {
	t.Parallel()
	check(t, "transport")
}

// Three River clients with the riverpace middleware and Config.Key.
func TestRiverKeysThreeProcesses(t *testing.T) {
	t.Parallel()
	check(t, "river")
}
