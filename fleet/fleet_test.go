package fleet_test

import (
	"context"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

// Workers join with a beat, count as live while they beat within
// LiveWindow, leave with their row, and long-gone rows are pruned.
func TestFleet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	a, b := fleet.Self("a"), fleet.Self("b")
	for i, w := range []fleet.Worker{a, b} {
		n, err := fleet.Beat(ctx, pool, w)
		if err != nil || n != i+1 {
			t.Fatalf("beat %s: %d live, %v; want %d", w.ID, n, err, i+1)
		}
	}
	live, err := fleet.Live(ctx, pool)
	if err != nil || len(live) != 2 {
		t.Fatalf("live = %+v, %v; want a and b", live, err)
	}
	if w := live[0]; w.ID != "a" || w.PID != os.Getpid() || w.Hostname != a.Hostname || w.Version != "dev" || w.SeenAt.IsZero() {
		t.Fatalf("live[0] = %+v, want this process as a, version dev", w)
	}

	// b stops beating: after LiveWindow it no longer counts.
	exec(t, pool, `UPDATE fleetpace_worker SET seen_at = now() - interval '1 minute' WHERE id = 'b'`)
	if n, err := fleet.Beat(ctx, pool, a); err != nil || n != 1 {
		t.Fatalf("beat with b silent: %d live, %v; want 1", n, err)
	}
	if err := fleet.Leave(ctx, pool, "a"); err != nil {
		t.Fatal(err)
	}
	if live, err := fleet.Live(ctx, pool); err != nil || len(live) != 0 {
		t.Fatalf("live after a left and b went silent = %+v, %v", live, err)
	}

	// Prune deletes b's row once it is older than PruneAfter.
	if err := fleet.Prune(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if n := rows(t, pool); n != 1 {
		t.Fatalf("%d rows after pruning a recent row, want b's kept", n)
	}
	exec(t, pool, `UPDATE fleetpace_worker SET seen_at = now() - interval '2 hours'`)
	if err := fleet.Prune(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if n := rows(t, pool); n != 0 {
		t.Fatalf("%d rows after pruning, want none", n)
	}
}

func exec(t *testing.T, db fleet.DBTX, sql string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

func rows(t *testing.T, db fleet.DBTX) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM fleetpace_worker`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
