package worker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

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
