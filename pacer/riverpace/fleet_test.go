package riverpace_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
	"golang.org/x/time/rate"

	"github.com/fleetpace/fleetpace/internal/pacetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/internal/testproc"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/pacer/riverpace"
	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/fleetpace/fleetpace/sources"
)

// callArgs is the job kind the fleet tests run: one GET of the destination.
type callArgs struct {
	N int `json:"n"`
}

func (callArgs) Kind() string { return "riverpace_call" }

// callWorker GETs its target; a 429 or 503 is rate pressure, with what the
// headers said.
type callWorker struct {
	river.WorkerDefaults[callArgs]
	target, userAgent string
}

func (w *callWorker) Work(ctx context.Context, job *river.Job[callArgs]) error {
	resp, err := pacetest.Get(ctx, w.target, w.userAgent)
	if err != nil {
		return err
	}
	info := ratelimit.Parse(resp.Header, time.Now())
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return riverpace.RateLimitedBy(info)
	case http.StatusOK:
		riverpace.Announce(ctx, info)
		return nil
	}
	return fmt.Errorf("HTTP %d", resp.StatusCode)
}

// riverChild is what a TestRiverChild process reports.
type riverChild struct {
	Worked int         `json:"worked"` // jobs whose Work ran
	Stats  pacer.Stats `json:"stats"`
	Err    string      `json:"err,omitempty"`
}

// TestRiverChild is not a test: it is the body of the processes the fleet
// tests start, each a small River client working callArgs jobs with
// RIVER_WORKERS workers until the parent stops it. RIVER_MODE=paced
// installs the riverpace middleware (platform "dest"); naive, the negative
// control, a per-process golang.org/x/time/rate limiter at the platform's
// rate in its place.
func TestRiverChild(t *testing.T) {
	if !testproc.IsChild() {
		return
	}
	testproc.Exit(runRiverChild())
}

func runRiverChild() (res riverChild) {
	ctx := context.Background()
	ratePerSec, _ := strconv.ParseFloat(os.Getenv("RIVER_RATE"), 64)
	burst, _ := strconv.Atoi(os.Getenv("RIVER_BURST"))
	workers, _ := strconv.Atoi(os.Getenv("RIVER_WORKERS"))
	pool, err := pgxpool.New(ctx, os.Getenv("RIVER_DATABASE_URL"))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer pool.Close()

	var mw rivertype.Middleware
	var p *pacer.Pacer
	switch mode := os.Getenv("RIVER_MODE"); mode {
	case "paced":
		// As a library fleet must (pacer.Config.MinFleetSize): three
		// processes, each at the default of one, paced at half the rate
		// each when a loaded machine's slow connects latched them, and the
		// destination saw 26/s under a ceiling of 20/s.
		if p, err = pacer.New(ctx, pacer.Config{DatabaseURL: os.Getenv("RIVER_DATABASE_URL"), MinFleetSize: fleetProcs}); err != nil {
			res.Err = err.Error()
			return res
		}
		defer p.Close()
		if mw, err = riverpace.New(riverpace.Config{Pacer: p, Platform: riverpace.ByKind(map[string]string{"riverpace_call": "dest"})}); err != nil {
			res.Err = err.Error()
			return res
		}
	case "naive":
		lim := rate.NewLimiter(rate.Limit(ratePerSec), burst)
		mw = river.WorkerMiddlewareFunc(func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
			if err := lim.Wait(ctx); err != nil {
				return err
			}
			return doInner(ctx)
		})
	default:
		res.Err = "unknown RIVER_MODE " + mode
		return res
	}
	var worked countingMiddleware
	ws := river.NewWorkers()
	river.AddWorker(ws, &callWorker{target: os.Getenv("RIVER_TARGET"), userAgent: pacetest.UserAgent(testproc.Index())})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:           ws,
		Middleware:        []rivertype.Middleware{mw, &worked},
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	if err := client.Start(ctx); err != nil {
		res.Err = err.Error()
		return res
	}
	<-testproc.Stopped()
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := client.StopAndCancel(sctx); err != nil {
		res.Err = err.Error()
	}
	res.Worked = int(worked.n.Load())
	if p != nil {
		res.Stats = p.Stats()
	}
	return res
}

const (
	fleetProcs   = 3
	fleetRate    = 20.0
	fleetBurst   = 2
	fleetWorkers = 10
)

// startRiverFleet runs three River client processes working callArgs jobs
// (1000 of them) against a fresh destination, /call; in paced mode, on
// platform "dest".
func startRiverFleet(t *testing.T, mode string) pacetest.Fleet {
	t.Helper()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := newPool(t, url)
	if mode == pacetest.Paced {
		if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: "dest", RatePerSec: fleetRate, Burst: fleetBurst}); err != nil {
			t.Fatal(err)
		}
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	params := make([]river.InsertManyParams, 1000)
	for i := range params {
		params[i] = river.InsertManyParams{Args: callArgs{N: i}}
	}
	insert(t, client, params)
	dest := pacetest.StartDest(t)
	g := testproc.Start(t, testproc.Config{Run: "TestRiverChild", N: fleetProcs, Env: map[string]string{
		"RIVER_MODE":         mode,
		"RIVER_DATABASE_URL": url,
		"RIVER_TARGET":       dest.URL() + "/call",
		"RIVER_RATE":         strconv.FormatFloat(fleetRate, 'f', -1, 64),
		"RIVER_BURST":        strconv.Itoa(fleetBurst),
		"RIVER_WORKERS":      strconv.Itoa(fleetWorkers),
	}})
	return pacetest.Fleet{Dest: dest, Prefix: "/call", N: fleetProcs, Stop: func(t testing.TB) {
		t.Helper()
		out := make([]riverChild, fleetProcs)
		g.Stop(t, func(i int, b []byte) error { return json.Unmarshal(b, &out[i]) })
		for i, r := range out {
			if r.Err != "" {
				t.Fatalf("process %d: %s", i, r.Err)
			}
		}
	}}
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// insert inserts jobs and returns their ids.
func insert(t *testing.T, client *river.Client[pgx.Tx], params []river.InsertManyParams) []int64 {
	t.Helper()
	res, err := client.InsertMany(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, len(res))
	for i, r := range res {
		ids[i] = r.Job.ID
	}
	return ids
}

// Three River client processes with the middleware on a job kind keep the
// destination under the platform's ceiling; per-process limiters at the
// same rate, in the same setup, do not.
func TestThreeRiverClientsShareOneCeiling(t *testing.T) {
	pacetest.RunCeiling(t, fleetRate, fleetBurst, 160, startRiverFleet)
}

// A 429 with Retry-After: 5 answered to one River process's job holds the
// jobs of all three for 5 s, measured at the destination.
func TestRetryAfterHoldsThreeRiverClients(t *testing.T) {
	t.Parallel()
	pacetest.RunHold(t, 5*time.Second, 500*time.Millisecond, startRiverFleet)
}
