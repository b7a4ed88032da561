package riverpace_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/pacer/riverpace"
	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/fleetpace/fleetpace/sources"
)

// SyncArgs is a River job that calls an API.
type SyncArgs struct {
	Account string `json:"account"`
}

func (SyncArgs) Kind() string { return "sync_account" }

// SyncWorker calls the API. On a 429 or 503 it returns
// riverpace.RateLimitedBy: the whole fleet slows down, every process holds
// for the Retry-After, and the job is snoozed until then without using up
// an attempt.
type SyncWorker struct {
	river.WorkerDefaults[SyncArgs]
	API string
}

func (w *SyncWorker) Work(ctx context.Context, job *river.Job[SyncArgs]) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.API+"/accounts/"+job.Args.Account, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		return riverpace.RateLimitedBy(ratelimit.Parse(resp.Header, time.Now()))
	}
	// … use the answer …
	return nil
}

// Rate-limit any River job: the pacer, the middleware and one field of
// river.Config are what a River application adds. Every process, every
// client sharing the database then holds platform "api" to 2 requests a
// second in all.
func Example() {
	ctx := context.Background()
	databaseURL, drop, err := testdb.Open() // your DATABASE_URL, with fleetpace's schema (fleetpace schema apply)
	if err != nil {
		log.Fatal(err)
	}
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	api := startAPI() // stands in for the API: it would allow 4 requests a second
	defer api.Close()

	// The platform and its fleet-wide ceiling, once (or: fleetpace platforms set api --rate 2).
	if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: "api", RatePerSec: 2}); err != nil {
		log.Fatal(err)
	}

	// The lines a River application adds: a pacer, the middleware …
	p, err := pacer.New(ctx, pacer.Config{DatabaseURL: databaseURL})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close() // deferred first, so it runs after the client has stopped
	if err := p.Ping(ctx); err != nil {
		log.Fatal(err) // a wrong role or port shows here, not as local pacing later
	}
	// Strict: a kind missing from the map fails its job rather than run it unpaced.
	paced, err := riverpace.New(riverpace.Config{Pacer: p,
		StrictPlatform: riverpace.StrictByKind(map[string]string{"sync_account": "api"})})
	if err != nil {
		log.Fatal(err)
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, &SyncWorker{API: api.URL()})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
		Workers:    workers,
		Middleware: []rivertype.Middleware{paced}, // … and this field.
	})
	if err != nil {
		log.Fatal(err)
	}

	completed, stop := client.Subscribe(river.EventKindJobCompleted)
	defer stop()
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	for _, account := range []string{"ada", "bob", "cy", "dee"} {
		if _, err := client.Insert(ctx, SyncArgs{Account: account}, nil); err != nil {
			log.Fatal(err)
		}
	}
	for range 4 {
		<-completed
	}
	if err := client.Stop(ctx); err != nil {
		log.Fatal(err)
	}

	arrivals := api.Arrivals("/accounts/")
	gap := time.Hour
	for i := 1; i < len(arrivals); i++ {
		gap = min(gap, arrivals[i].Sub(arrivals[i-1]))
	}
	fmt.Println("requests:", len(arrivals))
	fmt.Println("at least 400 ms apart:", gap >= 400*time.Millisecond)
	// Output:
	// requests: 4
	// at least 400 ms apart: true
}

// startAPI starts the fake destination of fleetpace's tests, allowing 4
// requests a second.
func startAPI() *fakedest.Server {
	api, err := fakedest.New(fakedest.Config{Rules: map[string]fakedest.Rule{"": {Rate: 4, Burst: 1}}})
	if err != nil {
		log.Fatal(err)
	}
	if err := api.Start(); err != nil {
		log.Fatal(err)
	}
	return api
}
