package fleetpace_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

func TestApplyIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	first, err := fleetpace.Apply(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.RiverVersions) == 0 {
		t.Fatal("first apply ran no River migration")
	}
	second, err := fleetpace.Apply(ctx, pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(second.RiverVersions) != 0 {
		t.Fatalf("second apply ran River migrations again: %v", second.RiverVersions)
	}
	for _, table := range []string{"fleetpace_platform", "fleetpace_pace", "fleetpace_cooldown", "fleetpace_source", "fleetpace_worker", "fleetpace_check", "river_job"} {
		var ok bool
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing (err %v)", table, err)
		}
	}
}

// Applying a current schema only reads: it returns Current at once while
// another session holds the schema lock, and runs no DDL (a statement that
// changes nothing still locks its table, and deadlocked with running
// workers).
func TestApplyCurrentTakesNoLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyPool(t)
	if res, err := fleetpace.Apply(ctx, pool, nil); err != nil || res.Current {
		t.Fatalf("first apply: %+v %v, want applied", res, err)
	}
	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock($1)", fleetpace.SchemaLockKey); err != nil {
		t.Fatal(err)
	}
	defer holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", fleetpace.SchemaLockKey) //nolint:errcheck
	// An ACCESS EXCLUSIVE lock on a table the file alters, held by another
	// transaction: any DDL on it would wait.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "LOCK TABLE fleetpace_worker IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := fleetpace.Apply(actx, pool, nil)
	if err != nil || !res.Current || len(res.RiverVersions) != 0 {
		t.Fatalf("apply of a current schema under a held lock: %+v %v, want Current at once", res, err)
	}
	// Another version of the file is applied (under the lock) again.
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_unlock($1)", fleetpace.SchemaLockKey); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE fleetpace_schema SET sql_sha256 = 'older'"); err != nil {
		t.Fatal(err)
	}
	if res, err := fleetpace.Apply(ctx, pool, nil); err != nil || res.Current {
		t.Fatalf("apply over another version: %+v %v, want applied", res, err)
	}
	var v string
	if err := pool.QueryRow(ctx, "SELECT sql_sha256 FROM fleetpace_schema").Scan(&v); err != nil || v != fleetpace.SchemaVersion {
		t.Fatalf("recorded version %q %v, want %q", v, err, fleetpace.SchemaVersion)
	}
}

// emptyPool is a pool on a fresh database without any schema, closed when
// the test ends.
func emptyPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
