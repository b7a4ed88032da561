package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/syncbuf"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

// lines are the lines of b that hold substr.
func lines(b *syncbuf.Buffer, substr string) []string {
	var out []string
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// Every failed fetch is logged once at warn with its source, its URL
// without credentials and the reason; a platform's rate limiting once per
// episode (a clean response ends it); the history row gets the fetch's
// duration, size and the worker's name.
func TestFetchWorkerLogs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	var logs syncbuf.Buffer
	results := map[string][]fetch.Result{
		"feeds":   {{Outcome: fetch.Failed, Status: 404, Reason: "HTTP 404 Not Found"}, {Outcome: fetch.Failed, Reason: "refused: 127.0.0.1 is a loopback address"}},
		"limited": {{Outcome: fetch.RatePressure, Status: 429}, {Outcome: fetch.RatePressure, Status: 429}, {Outcome: fetch.OK, Status: 200}, {Outcome: fetch.RatePressure, Status: 503}},
		"stop":    {{Outcome: fetch.RateLimited, Status: 429, Reason: "stop"}, {Outcome: fetch.RateLimited, Status: 429, Reason: "stop"}},
	}
	var mu sync.Mutex
	fetcher := fetch.FetcherFunc(func(_ context.Context, req fetch.Request) fetch.Result {
		mu.Lock()
		defer mu.Unlock()
		r := results[req.Platform][0]
		results[req.Platform] = results[req.Platform][1:]
		r.Duration, r.Bytes = 42_000_000, 99 // 42 ms
		return r
	})
	fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: grantAll{}, Fetcher: fetcher, Worker: "w-test",
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	run := func(platform string, ids []int64, url string) {
		for _, id := range ids {
			job := &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: id, Attempt: 1},
				Args: queue.FetchArgs{SourceID: id, Platform: platform, URL: url}}
			if err := fw.Work(ctx, job); err != nil {
				t.Fatal(err)
			}
		}
	}
	feeds := storetest.Queued(t, pool, "feeds", 2)
	run("feeds", feeds, "https://user:secret@feeds.example/x")
	limited := storetest.Queued(t, pool, "limited", 4)
	run("limited", limited, "https://limited.example/x")
	run("stop", storetest.Queued(t, pool, "stop", 2), "https://stop.example/x")

	failed := lines(&logs, `msg="fetch failed"`)
	if len(failed) != 2 {
		t.Fatalf("%d 'fetch failed' lines, want 2:\n%s", len(failed), strings.Join(lines(&logs, ""), "\n"))
	}
	for i, want := range []string{fmt.Sprintf("source=%d", feeds[0]), "HTTP 404 Not Found"} {
		if !strings.Contains(failed[0], want) {
			t.Errorf("line %q lacks %q (%d)", failed[0], want, i)
		}
	}
	if !strings.Contains(failed[1], "loopback address") || !strings.Contains(failed[0], "level=WARN") {
		t.Errorf("second failure: %q", failed[1])
	}
	all := strings.Join(lines(&logs, ""), "\n")
	if strings.Contains(all, "secret") || !strings.Contains(failed[0], "https://user:xxxxx@feeds.example/x") {
		t.Errorf("the URL's credentials are not redacted:\n%s", all)
	}
	if n := len(lines(&logs, `msg="platform is rate limiting"`)); n != 3 {
		t.Errorf("%d 'rate limiting' lines for three episodes (429, 429, ok, 503 on one platform; 429, 429 on another), want 3:\n%s", n, all)
	}
	if n := len(lines(&logs, `msg="platform cooling down"`)); n != 1 {
		t.Errorf("%d 'cooling down' lines for one cooldown extended by a second answer, want 1:\n%s", n, all)
	}
	h, err := sources.History(ctx, pool, feeds[0], 0)
	if err != nil || len(h) != 1 || h[0].Worker != "w-test" || h[0].Bytes != 99 || h[0].Duration.Milliseconds() != 42 {
		t.Fatalf("history: %+v, %v; want the fetch's duration, size and worker", h, err)
	}
}

// A job queued by id alone (the scan queues a source whose URL carries
// credentials that way) loads the source and fetches its URL, credentials
// and validators included.
func TestFetchWorkerLoadsSourceQueuedByID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t, sources.Platform{Name: "auth", RatePerSec: 1000})
	const url = "https://reader:hunter2@auth.example/feed"
	id := storetest.Source(t, pool, sources.NewSource{Platform: "auth", URL: url})
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_source SET queued_at = now(), queued_job_id = id, etag = '"v1"' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	var got []fetch.Request
	fetcher := fetch.FetcherFunc(func(_ context.Context, req fetch.Request) fetch.Result {
		got = append(got, req)
		return fetch.Result{Outcome: fetch.OK, Status: 200}
	})
	fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: grantAll{}, Fetcher: fetcher, Worker: "w-test"})
	if err != nil {
		t.Fatal(err)
	}
	job := &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: id, Attempt: 1},
		Args: queue.FetchArgs{SourceID: id, Platform: "auth"}}
	if err := fw.Work(ctx, job); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].URL != url || got[0].ETag != `"v1"` {
		t.Fatalf("fetched %+v, want one fetch of %s with its ETag", got, url)
	}
	if o := outcome(t, pool, id); o == "" {
		t.Errorf("the check of source %d was not recorded", id)
	}
	// Its history row has the multiplier the slot was reserved under.
	var mult float64
	if err := pool.QueryRow(ctx, `SELECT multiplier FROM fleetpace_check WHERE source_id = $1`, id).Scan(&mult); err != nil || mult != grantAllMultiplier {
		t.Errorf("history multiplier %g (%v), want the reservation's %g", mult, err, grantAllMultiplier)
	}
}
