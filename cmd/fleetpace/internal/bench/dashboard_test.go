package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// TestDashboardBench runs the dashboard benchmark at a tiny size with more
// platforms than a page shows: every page answers, each has its timings,
// the data set has the documented shape, and the output carries the JSON
// fields and the target.
func TestDashboardBench(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	res, err := Dashboard(context.Background(), DashboardConfig{Pool: pool, Sources: 3000, Platforms: 120, Runs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pages) != 4 || res.Platforms != 120 || res.Sources != 3000 || res.Failing < 20 || res.Failing > 40 {
		t.Fatalf("result %+v", res)
	}
	if want := int64(3000 * 3600 / 4200); res.HistoryRows != want {
		t.Errorf("history rows %d, want %d", res.HistoryRows, want)
	}
	for _, p := range res.Pages {
		if p.DBP50 <= 0 || p.TotalP50 < p.DBP50 || p.TotalP95 < p.TotalP50 || p.Bytes < 500 {
			t.Errorf("page %+v", p)
		}
	}
	var names int
	if err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT platform) FROM fleetpace_source WHERE platform LIKE 'bench-___'`).Scan(&names); err != nil || names != 120 {
		t.Errorf("sources on %d platforms named bench-NNN (%v), want 120", names, err)
	}
	var back map[string]any
	text, js := written(t, res, &back)
	if !strings.Contains(text, "SQL < 100 ms") {
		t.Errorf("text:\n%s", text)
	}
	if back["pages"] == nil || back["failing_sources"] == nil {
		t.Errorf("json:\n%s", js)
	}
	if err := (DashboardConfig{Platforms: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "bench.DashboardConfig.Platforms") {
		t.Errorf("Validate: %v", err)
	}
}
