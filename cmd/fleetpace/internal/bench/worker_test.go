package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// TestWorkerBench runs the worker benchmark at a tiny size and checks that
// both sides completed every job, the figures are consistent, the output
// carries the documented JSON fields, and the benchmark removed what it
// created (its platform, sources and jobs).
func TestWorkerBench(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	var progress bytes.Buffer
	res, err := Worker(context.Background(), WorkerConfig{DatabaseURL: url, Workers: 3, Jobs: 60, Runs: 2, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.FleetpaceRuns) != 2 || len(res.RiverRuns) != 2 {
		t.Fatalf("runs: fleetpace %v, river %v; want 2 each", res.FleetpaceRuns, res.RiverRuns)
	}
	for _, r := range append(res.FleetpaceRuns, res.RiverRuns...) {
		if r <= 0 {
			t.Fatalf("a run measured %v jobs/s", r)
		}
	}
	if res.FleetpaceJobsPerSec <= 0 || res.RiverJobsPerSec <= 0 || res.Workers != 3 || res.Jobs != 60 {
		t.Fatalf("result %+v", res)
	}
	if got := res.FleetpaceJobsPerSec / res.RiverJobsPerSec; got != res.Ratio {
		t.Errorf("ratio %v, want %v", res.Ratio, got)
	}
	// Every check was recorded with its history row, and the table's size
	// per million checks is reported.
	if !res.History || res.HistoryRows != 60*2 || res.HistoryBytesPerMillion <= 0 {
		t.Errorf("history: %v, %d rows, %.0f bytes per million; want 120 rows and a size", res.History, res.HistoryRows, res.HistoryBytesPerMillion)
	}
	if n := strings.Count(progress.String(), "jobs/s"); n != 4 {
		t.Errorf("progress has %d run lines, want 4:\n%s", n, progress.String())
	}

	var m map[string]any
	text, js := written(t, res, &m)
	for _, k := range []string{"fleetpace_jobs_per_sec", "river_jobs_per_sec", "ratio", "workers"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, js)
		}
	}
	if !strings.Contains(text, "ratio") {
		t.Errorf("text output lacks the ratio:\n%s", text)
	}

	// Every fetch job completed through the fetch path (a job that failed or
	// snoozed ends Worker with an error); what the run created is gone.
	db, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	var platforms, srcs, jobs, history, changes int
	if err := db.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM fleetpace_platform), (SELECT count(*) FROM fleetpace_source),
		(SELECT count(*) FROM river_job), (SELECT count(*) FROM fleetpace_check), (SELECT count(*) FROM fleetpace_due_change)`).Scan(&platforms, &srcs, &jobs, &history, &changes); err != nil {
		t.Fatal(err)
	}
	if platforms+srcs+jobs+history+changes != 0 {
		t.Errorf("left behind: %d platforms, %d sources, %d jobs, %d history rows, %d due-log rows", platforms, srcs, jobs, history, changes)
	}
}
