package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

// atMax is a pacer that grants every slot and answers every report as if
// the platform were already paced as slowly as it may be.
type atMax struct{ grantAll }

func (atMax) Report(context.Context, string, pacer.Reservation, pacer.Feedback) (pacer.ReportResult, error) {
	return pacer.ReportResult{AtMax: true, Multiplier: 16, MaxMultiplier: 16}, nil
}

// Every check that is not OK records why: a 429 that only slows the fleet
// down keeps its status and Retry-After as its reason (it had none: REASON
// "-" in `sources show`), and one at the slowest pace says so, and its
// cooldown records the rule that started it (cause slowest_pace, the
// Retry-After), which the platform's state names in words.
func TestEveryNonOKCheckHasItsReason(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	answer := fetch.Result{Outcome: fetch.RatePressure, Status: 429, RetryAfter: 10 * time.Second}
	fetcher := fetch.FetcherFunc(func(context.Context, fetch.Request) fetch.Result { return answer })
	work := func(p worker.Pacer, platform string, id int64) {
		t.Helper()
		fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: p, Fetcher: fetcher})
		if err != nil {
			t.Fatal(err)
		}
		job := &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: id, Attempt: 1},
			Args: queue.FetchArgs{SourceID: id, Platform: platform, URL: "https://" + platform + ".example/x"}}
		if err := fw.Work(ctx, job); err != nil {
			t.Fatal(err)
		}
	}
	slowed := storetest.Queued(t, pool, "slowed", 1)[0]
	work(grantAll{}, "slowed", slowed)
	h, err := sources.History(ctx, pool, slowed, 0)
	if err != nil || len(h) != 1 || h[0].Outcome != "rate_pressure" || h[0].Reason != "HTTP 429, Retry-After 10s" {
		t.Fatalf("history of a 429: %+v, %v; want rate_pressure with its status and Retry-After as reason", h, err)
	}

	stopped := storetest.Queued(t, pool, "stopped", 1)[0]
	work(atMax{}, "stopped", stopped)
	h, err = sources.History(ctx, pool, stopped, 0)
	if err != nil || len(h) != 1 || h[0].Outcome != "rate_limited" ||
		h[0].Reason != "HTTP 429, Retry-After 10s at the slowest pace (ceiling ÷ 16, the maximum multiplier)" {
		t.Fatalf("history of a 429 at the slowest pace: %+v, %v", h, err)
	}
	cds, err := sources.ActiveCooldowns(ctx, pool)
	if err != nil || len(cds) != 1 {
		t.Fatalf("cooldowns: %+v, %v; want stopped's", cds, err)
	}
	cd := cds[0]
	if cd.Cause != sources.CauseSlowestPace || cd.RetryAfter != 10*time.Second || cd.Headline() != "max multiplier reached" {
		t.Fatalf("cooldown: %+v; want cause slowest_pace with the 10s Retry-After", cd)
	}
	rule := cd.Rule(sources.DefaultCooldown)
	if want := "a 10s Retry-After came while the platform was paced as slowly as it may be (ceiling ÷ max multiplier) → the platform's 15m cooldown"; rule != want {
		t.Errorf("rule = %q, want %q", rule, want)
	}
	// The fetcher's own rate limit (a Retry-After over its limit) is
	// another rule.
	answer = fetch.Result{Outcome: fetch.RateLimited, Status: 429, RetryAfter: 2 * time.Hour, Reason: "HTTP 429 Too Many Requests with Retry-After 2h0m0s (over 1m0s)"}
	long := storetest.Queued(t, pool, "long", 1)[0]
	work(grantAll{}, "long", long)
	cds, err = sources.ActiveCooldowns(ctx, pool)
	if err != nil || len(cds) != 2 || cds[0].Platform != "long" || cds[0].Cause != sources.CauseRetryAfter || cds[0].Headline() != "Retry-After 2h" ||
		!strings.HasSuffix(cds[0].Rule(sources.DefaultCooldown), "→ the 2h Retry-After (longer than the platform's 15m cooldown)") {
		t.Fatalf("cooldowns: %+v, %v; want long's, from its Retry-After", cds, err)
	}
}

// The fetch metrics: a duration histogram by status class, and the
// fetches in flight while the fetcher has not answered, back to 0 after.
func TestFetchMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	m := worker.NewMetrics(nil, nil, nil, nil)
	inside, release := make(chan struct{}), make(chan struct{})
	statuses := []int{200, 429, 404, 503, 0}
	fetcher := fetch.FetcherFunc(func(_ context.Context, req fetch.Request) fetch.Result {
		if req.SourceID == 0 {
			return fetch.Result{}
		}
		st := statuses[0]
		statuses = statuses[1:]
		if st == 0 {
			inside <- struct{}{}
			<-release
			return fetch.Result{Outcome: fetch.Failed, Reason: "connection refused", Duration: time.Second}
		}
		out := fetch.Outcome(fetch.Failed)
		switch st {
		case 200:
			out = fetch.OK
		case 429, 503:
			out = fetch.RatePressure
		}
		return fetch.Result{Outcome: out, Status: st, Reason: "x", Duration: 20 * time.Millisecond}
	})
	fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: grantAll{}, Fetcher: fetcher, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ids := storetest.Queued(t, pool, "p", 5)
	done := make(chan error, 1)
	for i, id := range ids {
		job := &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: id, Attempt: 1},
			Args: queue.FetchArgs{SourceID: id, Platform: "p", URL: "https://p.example/x"}}
		if i < len(ids)-1 {
			if err := fw.Work(ctx, job); err != nil {
				t.Fatal(err)
			}
			continue
		}
		go func() { done <- fw.Work(ctx, job) }()
	}
	<-inside
	if got := m.InFlight(); got["p"] != 1 {
		t.Errorf("in flight while the fetcher hangs: %v, want p: 1", got)
	}
	if n, err := gauge(m, "fleetpace_fetches_in_flight", "p"); n != 1 || err != nil {
		t.Errorf("fleetpace_fetches_in_flight{platform=p} = %g (%v), want 1", n, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := m.InFlight(); len(got) != 0 {
		t.Errorf("in flight after the answer: %v, want none", got)
	}
	if n, err := gauge(m, "fleetpace_fetches_in_flight", "p"); n != 0 || err != nil {
		t.Errorf("fleetpace_fetches_in_flight{platform=p} after the answer = %g (%v), want 0", n, err)
	}
	for class, n := range map[string]int{"2xx": 1, "429": 1, "4xx": 1, "5xx": 1, "none": 1} {
		got, err := histogramCount(m, class)
		if err != nil || got != uint64(n) {
			t.Errorf("fetch duration count of %s: %d, %v; want %d", class, got, err, n)
		}
	}
}

func histogramCount(m *worker.Metrics, class string) (uint64, error) {
	mfs, err := m.Registry.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != "fleetpace_fetch_duration_seconds" {
			continue
		}
		for _, mm := range mf.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetName() == "status_class" && l.GetValue() == class {
					return mm.GetHistogram().GetSampleCount(), nil
				}
			}
		}
	}
	return 0, nil
}

// gauge is the value of the gauge name{platform} (-1: no such series).
func gauge(m *worker.Metrics, name, platform string) (float64, error) {
	mfs, err := m.Registry.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mm := range mf.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetName() == "platform" && l.GetValue() == platform {
					return mm.GetGauge().GetValue(), nil
				}
			}
		}
	}
	return -1, nil
}
