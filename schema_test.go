package fleetpace_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

func TestApplyIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
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
