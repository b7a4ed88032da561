package pacer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/pacetest"
	"github.com/fleetpace/fleetpace/internal/testproc"
)

// transportChild is what a TestTransportChild process reports.
type transportChild struct {
	Sent   int    `json:"sent"`   // answers received
	Failed int    `json:"failed"` // requests that got no answer (other than at the stop)
	Err    string `json:"err,omitempty"`
	Stats  Stats  `json:"stats"`
}

// TestTransportChild is not a test: it is the body of the processes the
// transport's multi-process tests start. Each runs goroutines that GET the
// destination through an http.Client until the parent stops it: with
// pacer.Transport (TRANSPORT_MODE=paced) or, as the negative control, a
// per-process golang.org/x/time/rate limiter at the platform's rate (naive).
func TestTransportChild(t *testing.T) {
	if !testproc.IsChild() {
		return
	}
	testproc.Exit(runTransportChild())
}

func runTransportChild() (res transportChild) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-testproc.Stopped(); cancel() }()
	ratePerSec, _ := strconv.ParseFloat(os.Getenv("TRANSPORT_RATE"), 64)
	burst, _ := strconv.Atoi(os.Getenv("TRANSPORT_BURST"))
	goroutines, _ := strconv.Atoi(os.Getenv("TRANSPORT_GOROUTINES"))
	target := os.Getenv("TRANSPORT_TARGET")

	var rt http.RoundTripper
	var p *Pacer
	switch mode := os.Getenv("TRANSPORT_MODE"); mode {
	case "paced":
		var err error
		p, err = New(ctx, Config{DatabaseURL: os.Getenv("TRANSPORT_DATABASE_URL")})
		if err != nil {
			res.Err = err.Error()
			return res
		}
		defer p.Close()
		rt = &Transport{Pacer: p}
	case "naive":
		rt = &naiveTransport{lim: rate.NewLimiter(rate.Limit(ratePerSec), burst)}
	default:
		res.Err = "unknown TRANSPORT_MODE " + mode
		return res
	}
	client := &http.Client{Transport: rt}

	var mu sync.Mutex
	var wg sync.WaitGroup
	var seq atomic.Int64
	for range goroutines {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/%d-%d", target, testproc.Index(), seq.Add(1)), nil)
				if err != nil {
					mu.Lock()
					res.Err = err.Error()
					mu.Unlock()
					return
				}
				req.Header.Set("User-Agent", pacetest.UserAgent(testproc.Index()))
				resp, err := client.Do(req)
				mu.Lock()
				switch {
				case err == nil:
					res.Sent++
				case ctx.Err() == nil:
					res.Failed++
					res.Err = err.Error()
				}
				mu.Unlock()
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
	if p != nil {
		res.Stats = p.Stats()
	}
	return res
}

// naiveTransport is what fleetpace replaces: a limiter per process.
type naiveTransport struct{ lim *rate.Limiter }

func (n *naiveTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := n.lim.Wait(req.Context()); err != nil {
		return nil, err
	}
	return http.DefaultTransport.RoundTrip(req)
}

const (
	fleetProcs      = 3
	fleetRate       = 20.0
	fleetBurst      = 2
	fleetGoroutines = 8
)

// startTransportFleet runs three processes against a fresh destination:
// each sends GETs to /t from 8 goroutines through the given mode's client.
// The platform (paced mode) is the destination's host, 127.0.0.1.
func startTransportFleet(t *testing.T, mode string) pacetest.Fleet {
	t.Helper()
	env := map[string]string{
		"TRANSPORT_MODE":       mode,
		"TRANSPORT_RATE":       strconv.FormatFloat(fleetRate, 'f', -1, 64),
		"TRANSPORT_BURST":      strconv.Itoa(fleetBurst),
		"TRANSPORT_GOROUTINES": strconv.Itoa(fleetGoroutines),
	}
	if mode == pacetest.Paced {
		url, _ := setup(t, platformSpec{name: "127.0.0.1", rate: fleetRate, burst: fleetBurst, backoff: 1.5, recovery: 1.1})
		env["TRANSPORT_DATABASE_URL"] = url
	}
	dest := pacetest.StartDest(t)
	env["TRANSPORT_TARGET"] = dest.URL() + "/t"
	g := testproc.Start(t, testproc.Config{Run: "TestTransportChild", N: fleetProcs, Env: env})
	return pacetest.Fleet{Dest: dest, Prefix: "/t", N: fleetProcs, Stop: func(t testing.TB) {
		t.Helper()
		out := make([]transportChild, fleetProcs)
		g.Stop(t, func(i int, b []byte) error { return json.Unmarshal(b, &out[i]) })
		for i, r := range out {
			if r.Err != "" {
				t.Fatalf("process %d: %s (%+v)", i, r.Err, r)
			}
		}
	}}
}

// Three processes sending through pacer.Transport keep the destination
// under the platform's ceiling; per-process limiters at the same rate, in
// the same setup, do not.
func TestTransportThreeProcessesShareOneCeiling(t *testing.T) {
	pacetest.RunCeiling(t, fleetRate, fleetBurst, 160, startTransportFleet)
}

// A 429 with Retry-After: 5 answered to one process holds all three for
// 5 s, measured at the destination.
func TestTransportRetryAfterHoldsThreeProcesses(t *testing.T) {
	t.Parallel()
	pacetest.RunHold(t, 5*time.Second, 500*time.Millisecond, startTransportFleet)
}

// newTransportClient is an http.Client through a Transport on p, for the
// in-process tests; the platform is the destination's host, 127.0.0.1.
func newTransportClient(p *Pacer, mod func(*Transport)) *http.Client {
	tr := &Transport{Pacer: p}
	if mod != nil {
		mod(tr)
	}
	return &http.Client{Transport: tr}
}

func get(ctx context.Context, c *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// A request that cannot get a slot before its deadline fails at once with a
// *WaitError saying why, and is not sent; so does one beyond MaxWait, and
// one to a paused platform. A request cancelled while it waits is not sent
// either.
func TestTransportDeadlineShorterThanWait(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	addPlatform(t, pool, platformSpec{name: "127.0.0.1", rate: 0.5, burst: 1}) // one every 2 s
	dest := pacetest.StartDest(t)
	p := newPacer(t, url, nil)
	client := newTransportClient(p, nil)

	if _, err := get(ctx, client, dest.URL()+"/a"); err != nil {
		t.Fatal(err)
	}
	if n := dest.Count(""); n != 1 {
		t.Fatalf("destination saw %d requests, want 1", n)
	}

	dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err := get(dctx, client, dest.URL()+"/b")
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, ErrNoSlot) {
		t.Fatalf("got %v, want a *WaitError wrapping ErrNoSlot", err)
	}
	if dctx.Err() != nil {
		t.Fatalf("the request waited for its deadline instead of failing at once: %v", err)
	}
	if we.Platform != "127.0.0.1" || we.Deadline.IsZero() || we.Wait <= we.MaxWait || we.Wait > 2*time.Second {
		t.Fatalf("WaitError %+v: want platform 127.0.0.1, the deadline, a wait of up to 2 s beyond it", we)
	}
	if !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("the error does not say why: %v", err)
	}

	// Transport.MaxWait bounds a request without a deadline.
	short := newTransportClient(p, func(tr *Transport) { tr.MaxWait = 100 * time.Millisecond })
	if _, err = get(ctx, short, dest.URL()+"/c"); !errors.As(err, &we) || !we.Deadline.IsZero() || we.MaxWait > 100*time.Millisecond {
		t.Fatalf("got %v (%+v), want a *WaitError bounded by MaxWait", err, we)
	}

	// Cancelled while it sleeps until its slot.
	wctx, wcancel := context.WithCancel(ctx)
	granted := p.Stats().Granted
	done := make(chan error, 1)
	go func() { _, err := get(wctx, client, dest.URL()+"/d"); done <- err }()
	pacetest.Poll(t, 10*time.Second, "the request's slot", func() bool { return p.Stats().Granted > granted })
	wcancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}

	// Paused.
	if err := Pause(ctx, pool, "127.0.0.1", time.Time{}, "maintenance"); err != nil {
		t.Fatal(err)
	}
	if _, err = get(ctx, client, dest.URL()+"/e"); !errors.As(err, &we) || !we.Paused || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("got %v, want a *WaitError saying the platform is paused", err)
	}

	if n := dest.Count(""); n != 1 {
		t.Fatalf("destination saw %d requests, want only the first: a request without a slot was sent", n)
	}
}

// A request to a host that is no platform fails unsent (or, with
// CreatePlatform, creates it); a request mapped to "" is sent unpaced.
func TestTransportPlatforms(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	dest := pacetest.StartDest(t)
	p := newPacer(t, url, nil)
	local := strings.Replace(dest.URL(), "127.0.0.1", "localhost", 1)

	_, err := get(ctx, newTransportClient(p, nil), local+"/x")
	if !errors.Is(err, ErrUnknownPlatform) || !strings.Contains(err.Error(), `"localhost"`) {
		t.Fatalf("got %v, want ErrUnknownPlatform naming localhost", err)
	}
	if n := dest.Count(""); n != 0 {
		t.Fatalf("a request to an unknown platform was sent")
	}

	var created []string
	client := newTransportClient(p, func(tr *Transport) {
		tr.CreatePlatform = func(ctx context.Context, name string) error {
			created = append(created, name)
			addPlatform(t, pool, platformSpec{name: name, rate: 5})
			return nil
		}
	})
	if _, err := get(ctx, client, local+"/x"); err != nil {
		t.Fatal(err)
	}
	if len(created) != 1 || created[0] != "localhost" || dest.Count("") != 1 {
		t.Fatalf("created %v, destination saw %d requests; want localhost created and one request", created, dest.Count(""))
	}

	reservations := p.Stats().Reservations
	unpaced := newTransportClient(p, func(tr *Transport) { tr.Platform = func(*http.Request) string { return "" } })
	if _, err := get(ctx, unpaced, dest.URL()+"/y"); err != nil {
		t.Fatal(err)
	}
	if p.Stats().Reservations != reservations || dest.Count("/y") != 1 {
		t.Fatalf("an unpaced request reserved a slot or was not sent")
	}
}

// What each answer tells the pacer: 429 and 503 are pressure, Retry-After
// in the HTTP-date form holds the fleet, quota headers pace it, a 404 is
// clean, a request without an answer neutral.
func TestTransportReports(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	addPlatform(t, pool, platformSpec{name: "127.0.0.1", rate: 50, burst: 1})
	dest := pacetest.StartDest(t)
	p := newPacer(t, url, func(c *Config) { c.CleanBatch = -1 })
	client := newTransportClient(p, nil)

	// A 404 is clean: the streak grows.
	if err := dest.SetRule("/404", fakedest.Rule{Status: http.StatusNotFound}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(ctx, client, dest.URL()+"/404"); err != nil {
		t.Fatal(err)
	}
	if r := readRow(t, pool, "127.0.0.1"); r.streak != 1 || r.mult != 1 {
		t.Fatalf("after a 404: streak %d, multiplier %g; want 1 and 1", r.streak, r.mult)
	}

	// A refused connection is neutral.
	closed := pacetest.StartDest(t)
	gone := closed.URL()
	closed.Close()
	if _, err := get(ctx, client, gone+"/"); err == nil {
		t.Fatal("a request to a closed server succeeded")
	}
	if r := readRow(t, pool, "127.0.0.1"); r.streak != 1 || r.mult != 1 {
		t.Fatalf("after a transport error: streak %d, multiplier %g; want them unchanged", r.streak, r.mult)
	}

	// A 503 is pressure.
	if err := dest.SetRule("/503", fakedest.Rule{Status: http.StatusServiceUnavailable, RetryAfter: fakedest.NoRetryAfter}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(ctx, client, dest.URL()+"/503"); err != nil {
		t.Fatal(err)
	}
	if r := readRow(t, pool, "127.0.0.1"); r.streak != 0 || r.mult != 2 {
		t.Fatalf("after a 503: streak %d, multiplier %g; want 0 and 2", r.streak, r.mult)
	}

	// A 429 with Retry-After as an HTTP-date holds the fleet until then.
	if err := dest.SetRule("/429", fakedest.Rule{Status: http.StatusTooManyRequests, RetryAfter: 5 * time.Second, RetryAfterDate: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(ctx, client, dest.URL()+"/429"); err != nil {
		t.Fatal(err)
	}
	other := newPacer(t, url, nil)
	res, err := other.Reserve(ctx, "127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	// The date has whole seconds: the hold is between 4 and 5 s.
	if res.Granted || res.Wait < 3500*time.Millisecond || res.Wait > 5*time.Second {
		t.Fatalf("another pacer after Retry-After as a date: granted %v, wait %s; want a hold of 4–5 s", res.Granted, res.Wait)
	}

	// Announced quota headers pace the fleet: 5/s under a ceiling of 50/s
	// (on a platform of its own, beyond the hold).
	addPlatform(t, pool, platformSpec{name: "quota", rate: 50, burst: 1})
	if err := dest.SetRule("/quota", fakedest.Rule{Rate: 5, Burst: 1, Headers: fakedest.XRateLimit}); err != nil {
		t.Fatal(err)
	}
	quota := newTransportClient(p, func(tr *Transport) { tr.Platform = func(*http.Request) string { return "quota" } })
	if _, err := get(ctx, quota, dest.URL()+"/quota"); err != nil {
		t.Fatal(err)
	}
	states, err := States(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	announced := 0.0
	for _, st := range states {
		if st.Platform == "quota" {
			announced = st.AnnouncedRate
		}
	}
	if announced <= 0 || announced > 5.5 {
		t.Fatalf("after an announced 5/s: announced rate %g, want 5/s in force (%+v)", announced, states)
	}
}

// Acquire gives up at once when a slow-down elsewhere in the fleet moves its
// slot beyond its bound.
func TestAcquireGivenBackBeyondBound(t *testing.T) {
	url, pool := setup(t)
	ctx := context.Background()
	addPlatform(t, pool, platformSpec{name: "acq", rate: 1, burst: 1})
	p, other := newPacer(t, url, nil), newPacer(t, url, nil)
	if _, err := p.Acquire(ctx, "acq", time.Second); err != nil {
		t.Fatal(err)
	}
	pacetest.Poll(t, 10*time.Second, "the slow-down listener", func() bool { return p.Stats().Listening })
	done := make(chan error, 1)
	go func() { _, err := p.Acquire(ctx, "acq", 2*time.Second); done <- err }()
	pacetest.Poll(t, 10*time.Second, "the second slot", func() bool { return p.Stats().Granted >= 2 })
	r, err := other.Reserve(ctx, "acq", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Report(ctx, "acq", r, Feedback{Kind: Pressure, RetryAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	err = <-done
	var we *WaitError
	if !errors.As(err, &we) || we.Wait < 8*time.Second {
		t.Fatalf("got %v, want a *WaitError with the hold's wait", err)
	}
	if p.Stats().GivenBack == 0 {
		t.Fatalf("the slot was not given back: %+v", p.Stats())
	}
}

// While the database is unreachable, requests through a Transport still go,
// paced locally at rate / (fleet size + 1); a platform never seen gets no
// slot before a short deadline (without a known rate the only safe answer
// is "not now").
func TestTransportWhileTheDatabaseIsDown(t *testing.T) {
	dbURL, pool := setup(t)
	ctx := context.Background()
	addPlatform(t, pool, platformSpec{name: "127.0.0.1", rate: 20, burst: 1})
	addPlatform(t, pool, platformSpec{name: "unseen", rate: 20, burst: 1})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.addr()
	// One slot per statement: a block reserved before the cut would be
	// shared slots used while the database is down (blocks follow the
	// measured round trip, which a loaded machine lengthens).
	p := newPacer(t, u.String(), func(c *Config) { c.PollOnly = true; c.MaxBlock = 1 })
	dest := pacetest.StartDest(t)
	client := newTransportClient(p, nil)
	if _, err := get(ctx, client, dest.URL()+"/shared"); err != nil {
		t.Fatal(err)
	}

	px.setCut(true)
	for range 5 {
		if _, err := get(ctx, client, dest.URL()+"/local"); err != nil {
			t.Fatalf("a request failed while the database was down: %v", err)
		}
	}
	if st := p.Stats(); st.Degraded < 5 {
		t.Fatalf("%d degraded reservations, want 5 (%+v)", st.Degraded, st)
	}
	// Fleet size 1: 20/s / 2 = one every 100 ms.
	arrivals := dest.Arrivals("/local")
	for i := 1; i < len(arrivals); i++ {
		if gap := arrivals[i].Sub(arrivals[i-1]); gap < 80*time.Millisecond {
			t.Fatalf("degraded requests %d and %d %s apart, want about 100 ms", i-1, i, gap)
		}
	}

	unseen := newTransportClient(p, func(tr *Transport) { tr.Platform = func(*http.Request) string { return "unseen" } })
	dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	var we *WaitError
	if _, err := get(dctx, unseen, dest.URL()+"/unseen"); !errors.As(err, &we) || !we.Degraded {
		t.Fatalf("got %v, want a *WaitError decided locally", err)
	}
	if n := dest.Count(""); n != 6 {
		t.Fatalf("destination saw %d requests, want 6", n)
	}
}
