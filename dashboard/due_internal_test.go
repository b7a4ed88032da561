package dashboard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

// The dashboard counts as due what `sources list --due` lists and status
// counts (the schema's one definition): nothing on a platform cooling down
// or paused, only enabled, unqueued sources past due_at elsewhere.
func TestDueCountsAsTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	for _, p := range []string{"cool", "paused", "open"} {
		storetest.Platform(t, pool, sources.Platform{Name: p, RatePerSec: 10})
		for i := range 3 {
			storetest.Source(t, pool, sources.NewSource{Platform: p, URL: fmt.Sprintf("https://%s.example/%d", p, i)})
		}
	}
	storetest.Exec(t, pool, `UPDATE fleetpace_source SET queued_at = now(), queued_job_id = id WHERE url = 'https://open.example/0'`)
	storetest.Exec(t, pool, `UPDATE fleetpace_source SET due_at = now() + interval '1 hour' WHERE url = 'https://open.example/1'`)
	if _, _, err := control.CoolDown(ctx, pool, "cool", sources.CauseStop, time.Minute, "stop", 0.5); err != nil {
		t.Fatal(err)
	}
	if err := pacer.Pause(ctx, pool, "paused", time.Time{}, "maintenance"); err != nil {
		t.Fatal(err)
	}
	platforms, err := sources.ListPlatforms(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	h := &Handler{}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	rows, err := h.platformRows(ctx, tx, platforms, true)
	if err != nil {
		t.Fatal(err)
	}
	counts, err := sources.Counts(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]int64{}
	for _, c := range counts {
		status[c.Platform] = c.Due
	}
	want := map[string]int64{"cool": 0, "paused": 0, "open": 1}
	for _, r := range rows {
		if r.Counts.Due != want[r.Platform.Name] || status[r.Platform.Name] != want[r.Platform.Name] {
			t.Errorf("platform %s: the dashboard counts %d due, status %d, want %d", r.Platform.Name, r.Counts.Due, status[r.Platform.Name], want[r.Platform.Name])
		}
	}
}
