package worker_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

// A retried fetch job fetches at most once per queued job, whatever it
// carries: its source's URL, or the source's id alone (a URL with
// credentials, kept out of River's job arguments). River completes jobs in
// batches after Work returns, so a job may run again after its check was
// recorded: its second attempt finds the source no longer queued by it and
// fetches nothing. The control: the same job run again as a first attempt
// (what every attempt was to the job of a URL with credentials before)
// fetches again.
func TestRetriedJobFetchesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t, sources.Platform{Name: "p", RatePerSec: 1000})
	const plainURL, secretURL = "https://p.example/feed", "https://user:hunter2@p.example/private"
	var ids []int64
	for _, u := range []string{plainURL, secretURL} {
		id := storetest.Source(t, pool, sources.NewSource{Platform: "p", URL: u})
		ids = append(ids, id)
	}
	client, err := queue.NewClient(pool, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	queued, err := scan.Enqueue(ctx, pool, client, ids)
	if err != nil || len(queued) != 2 {
		t.Fatalf("enqueue: %v %v", queued, err)
	}

	var mu sync.Mutex
	fetched := map[string]int{}
	fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: grantAll{},
		Fetcher: fetch.FetcherFunc(func(_ context.Context, r fetch.Request) fetch.Result {
			mu.Lock()
			fetched[r.URL]++
			mu.Unlock()
			return fetch.Result{Outcome: fetch.OK, Status: 200}
		})})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT id, args FROM river_job ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type job struct {
		id   int64
		args queue.FetchArgs
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (job, error) {
		var j job
		return j, r.Scan(&j.id, &j.args)
	})
	if err != nil || len(jobs) != 2 {
		t.Fatalf("jobs: %+v %v", jobs, err)
	}
	run := func(j job, attempt int) {
		t.Helper()
		err := fw.Work(ctx, &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: j.id, Attempt: attempt}, Args: j.args})
		if err != nil {
			t.Fatalf("job %d, attempt %d: %v", j.id, attempt, err)
		}
	}
	byID := false
	for _, j := range jobs {
		byID = byID || j.args.URL == ""
		run(j, 1) // fetched, checked
		run(j, 2) // River runs it again: nothing
	}
	if !byID {
		t.Fatal("no job was queued by id alone: the test does not cover that kind")
	}
	for _, url := range []string{plainURL, secretURL} {
		if fetched[url] != 1 {
			t.Errorf("%s fetched %d times by its job and the job's retry, want once", url, fetched[url])
		}
	}
	// The control: without the retry's attempt count, each fetches again.
	for _, j := range jobs {
		run(j, 1)
	}
	for _, url := range []string{plainURL, secretURL} {
		if fetched[url] != 2 {
			t.Errorf("the control: %s fetched %d times, want twice (the guard is the attempt's)", url, fetched[url])
		}
	}
}

// A fetch that sent nothing because its process was paused past the slot's
// SendBy (fetch.ErrLate) costs the job a slot, not a check: the job takes a
// new slot and fetches again, each time bounded by the new slot's SendBy,
// and after two late ones in a row sends the next unbounded (a machine that
// is late every time must still make progress). Each slot given up is
// reported, so the pacer's open-request lease goes back at once.
func TestLateSendTakesANewSlot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// One open request at a time: a slot given up without its report would
	// hold the lease (LeaseTTL) and the next reservation would wait.
	pool := storetest.Pool(t, sources.Platform{Name: "p", RatePerSec: 1000, MaxInFlight: 1})
	p, err := pacer.New(ctx, pacer.Config{DatabaseURL: pool.Config().ConnString(), MaxBlock: 1, LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	for _, tc := range []struct {
		late    int // fetches that answer ErrLate before one is sent
		fetches int
	}{{0, 1}, {1, 2}, {5, 3}} {
		id := storetest.Source(t, pool, sources.NewSource{Platform: "p", URL: "https://p.example/feed"})
		var mu sync.Mutex
		var sendBys []time.Time
		fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: p,
			Fetcher: fetch.FetcherFunc(func(_ context.Context, r fetch.Request) fetch.Result {
				mu.Lock()
				defer mu.Unlock()
				sendBys = append(sendBys, r.SendBy)
				if len(sendBys) <= tc.late && !r.SendBy.IsZero() {
					return fetch.Result{Outcome: fetch.Failed, Reason: "late", Err: fetch.ErrLate}
				}
				return fetch.Result{Outcome: fetch.OK, Status: 200}
			})})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = fw.Work(wctx, &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: id, Attempt: 1},
			Args: queue.FetchArgs{SourceID: id, Platform: "p", URL: "https://p.example/feed"}})
		cancel()
		if err != nil {
			t.Fatalf("%d late: Work: %v", tc.late, err)
		}
		if len(sendBys) != tc.fetches {
			t.Fatalf("%d late: %d fetches, want %d", tc.late, len(sendBys), tc.fetches)
		}
		for i, by := range sendBys {
			if unbounded := i >= 2; by.IsZero() != unbounded {
				t.Errorf("%d late: fetch %d had SendBy %v; want it bounded for the first two slots only", tc.late, i+1, by)
			}
		}
		if s, err := sources.GetSource(ctx, pool, id); err != nil || s.LastOutcome == nil || *s.LastOutcome != fetch.OK {
			t.Fatalf("%d late: the source was not recorded ok: %+v %v", tc.late, s, err)
		}
	}
	if st := p.Stats(); st.Reports < 3 {
		t.Errorf("the pacer had %d reports; want the slots given up reported too", st.Reports)
	}
}

// A fetch the destination never answered (a network error, a timeout) gives
// its open-request lease back at once, like every other: on a platform of
// one open request at a time the next job fetches at once instead of
// waiting for the lease to expire (LeaseTTL).
func TestNoAnswerGivesTheLeaseBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t, sources.Platform{Name: "p", RatePerSec: 1000, MaxInFlight: 1})
	p, err := pacer.New(ctx, pacer.Config{DatabaseURL: pool.Config().ConnString(), MaxBlock: 1, LeaseTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var fetches atomic.Int32
	fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: p,
		Fetcher: fetch.FetcherFunc(func(_ context.Context, r fetch.Request) fetch.Result {
			if fetches.Add(1) == 1 {
				return fetch.Result{Outcome: fetch.Failed, Reason: "connection reset", Sent: time.Now()}
			}
			return fetch.Result{Outcome: fetch.OK, Status: 200, Sent: time.Now()}
		})})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		id := storetest.Source(t, pool, sources.NewSource{Platform: "p", URL: fmt.Sprintf("https://p.example/feed/%d", i)})
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := fw.Work(wctx, &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: id, Attempt: 1},
			Args: queue.FetchArgs{SourceID: id, Platform: "p", URL: fmt.Sprintf("https://p.example/feed/%d", i)}})
		cancel()
		if err != nil {
			t.Fatalf("job %d: Work: %v (the first fetch's lease was not given back)", i+1, err)
		}
	}
	if n := fetches.Load(); n != 2 {
		t.Fatalf("%d fetches, want 2", n)
	}
}
