package scan_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/scan"
)

// A paused platform is left out of the due query and the tick (which says
// so) until its pause ends; its expiry needs no resume.
func TestPausedPlatformSkipped(t *testing.T) {
	t.Parallel()
	f := setup(t, "a", "b")
	a := f.source(t, "a", "https://a.example/1", nil)
	b := f.source(t, "b", "https://b.example/1", nil)
	if err := pacer.Pause(f.ctx, f.pool, "a", time.Time{}, "maintenance"); err != nil {
		t.Fatal(err)
	}
	got, err := scan.SelectDue(f.ctx, f.pool, scan.DueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids(got)) != fmt.Sprint([]int64{b}) {
		t.Fatalf("due = %v, want only b=%d (a=%d paused)", ids(got), b, a)
	}
	res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Enqueued != 1 || res.ByPlatform["b"] != 1 || fmt.Sprint(res.Paused) != "[a]" {
		t.Fatalf("tick = %+v, want b queued, a paused", res)
	}
	// A pause that has ended (its time has passed) filters nothing.
	f.exec(t, `UPDATE fleetpace_pace SET paused_until = date_part('epoch', now()) - 1 WHERE platform = 'a'`)
	res, err = scan.Tick(f.ctx, f.pool, f.client, scan.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Enqueued != 1 || res.ByPlatform["a"] != 1 || len(res.Paused) != 0 {
		t.Fatalf("tick after the pause = %+v, want a queued", res)
	}
}

// Every tick prunes the history beyond the retention; NoHistory keeps none.
func TestTickPrunesHistory(t *testing.T) {
	t.Parallel()
	f := setup(t, "a")
	f.exec(t, `INSERT INTO fleetpace_check (source_id, platform, checked_at, outcome)
		SELECT 1, 'a', now() - make_interval(hours => g), 'ok' FROM generate_series(0, 9) g`) // 0 to 9 hours old
	left := func() int {
		var n int
		if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM fleetpace_check`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{HistoryRetention: 5*time.Hour + time.Minute})
	if err != nil || res.Pruned != 4 || left() != 6 {
		t.Fatalf("tick with 5 h retention: %+v, %v, %d left; want 4 pruned, 6 left", res, err, left())
	}
	res, err = scan.Tick(f.ctx, f.pool, f.client, scan.Config{})
	if err != nil || res.Pruned != 0 || left() != 6 {
		t.Fatalf("tick with the default retention: %+v, %v, %d left; want nothing pruned", res, err, left())
	}
	res, err = scan.Tick(f.ctx, f.pool, f.client, scan.Config{HistoryRetention: scan.NoHistory, PruneBatch: 5})
	if err != nil || res.Pruned != 5 || left() != 1 {
		t.Fatalf("tick with NoHistory, batch 5: %+v, %v, %d left; want 5 pruned", res, err, left())
	}
	if err := (scan.Config{HistoryRetention: -time.Hour}).Validate(); err == nil {
		t.Fatal("a negative retention validated")
	}
}
