package worker_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/pacer/riverpace"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/worker"
)

// denyWith is a pacer that denies every reservation with the given wait.
type denyWith struct{ wait time.Duration }

func (d denyWith) Reserve(_ context.Context, platform string, _ time.Duration) (pacer.Reservation, error) {
	return pacer.Reservation{Platform: platform, Wait: d.wait}, nil
}

func (denyWith) Sleep(context.Context, *pacer.Reservation) error { return nil }

func (d denyWith) Acquire(ctx context.Context, platform string, maxWait time.Duration) (pacer.Reservation, error) {
	return pacer.AcquireFrom(ctx, d, clock.Real(), platform, maxWait)
}

func (denyWith) Report(context.Context, string, pacer.Reservation, pacer.Feedback) (pacer.ReportResult, error) {
	return pacer.ReportResult{}, nil
}

type noFetch struct{ t *testing.T }

func (f noFetch) Fetch(context.Context, fetch.Request) fetch.Result {
	f.t.Error("fetched without a slot")
	return fetch.Result{Outcome: fetch.Failed}
}

// A denied reservation snoozes the fetch job by riverpace's rules, those of
// every paced job: at least riverpace.MinSnooze (+10 % jitter), a wait
// longer than River's scheduler lag to within the lag of its end, never
// past pacer.MaxHold, whatever the wait it names: 0 (the job came back at once,
// for ever, with a rate of 1e-300), negative (River panics), or beyond any
// duration.
func TestDeniedReservationSnooze(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tests := []struct {
		wait     time.Duration
		rand     float64
		min, max time.Duration
	}{
		{0, 0, riverpace.MinSnooze, riverpace.MinSnooze},
		{-time.Hour, 0.5, riverpace.MinSnooze, riverpace.MinSnooze * 11 / 10},
		{time.Nanosecond, 0.99, riverpace.MinSnooze, riverpace.MinSnooze * 11 / 10},
		{4 * time.Second, 0.5, 4 * time.Second, 4200 * time.Millisecond},
		// Longer than River's scheduler lag: to within the lag of the end.
		{10 * time.Second, 0, 5 * time.Second, 5 * time.Second},
		{10 * time.Second, 0.99, 5 * time.Second, 6 * time.Second},
		{math.MaxInt64, 0.999, pacer.MaxHold - riverpace.SchedulerLag, pacer.MaxHold},
		{time.Minute, math.NaN(), time.Minute - riverpace.SchedulerLag, time.Minute - riverpace.SchedulerLag},
	}
	for _, tt := range tests {
		w, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: denyWith{tt.wait}, Fetcher: noFetch{t},
			Rand: func() float64 { return tt.rand }})
		if err != nil {
			t.Fatal(err)
		}
		job := &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: 1, Attempt: 1},
			Args: queue.FetchArgs{SourceID: 1, Platform: "p", URL: "https://p.example/"}}
		err = w.Work(context.Background(), job)
		var snooze *rivertype.JobSnoozeError
		if !errors.As(err, &snooze) || snooze.Duration < tt.min || snooze.Duration > tt.max {
			t.Errorf("wait %v: Work = %v, want a snooze in [%v, %v]", tt.wait, err, tt.min, tt.max)
		}
	}
}
