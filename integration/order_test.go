package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// Sources reach the destination in fair order: never checked first, then the
// longest since checked. The sources are created in the opposite order (ids
// ascending from the most recently checked), so id order alone would give
// the reverse. One worker with --concurrency 1 makes the arrival order the
// job order.
func TestFairOrderAtDestination(t *testing.T) {
	t.Parallel()
	url := newURL(t)
	d := newDest(t, nil)
	setPlatform(t, url, "f", "--rate", "50")
	// Created in this order; ids 1..6.
	paths := []string{"/f/recent-1m", "/f/recent-1h", "/f/old-1d", "/f/old-2d", "/f/never-a", "/f/never-b"}
	importSources(t, url, "f", d.URL(), paths)
	db := pool(t, url)
	ctx := context.Background()
	ages := map[string]string{"recent-1m": "1 minute", "recent-1h": "1 hour", "old-1d": "1 day", "old-2d": "2 days"}
	for suffix, age := range ages {
		// Due now, last checked age ago.
		_, err := db.Exec(ctx, `UPDATE fleetpace_source SET last_checked_at = now() - $2::interval,
		    due_at = now() - interval '1 second' WHERE url LIKE '%' || $1`, "/f/"+suffix, age)
		if err != nil {
			t.Fatal(err)
		}
	}
	w := startWorker(t, url, "w1", "--concurrency", "1")
	waitArrivals(t, d, "/f/", len(paths), 30*time.Second)
	w.stop()

	var got []string
	for _, r := range d.Requests() {
		got = append(got, strings.TrimPrefix(r.Path, "/f/"))
	}
	want := []string{"never-a", "never-b", "old-2d", "old-1d", "recent-1h", "recent-1m"}
	t.Logf("fair order: arrivals %v", got)
	if !slices.Equal(got, want) {
		t.Errorf("arrival order %v, want %v (never checked, then longest since checked)", got, want)
	}
}
