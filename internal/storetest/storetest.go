// Package storetest puts platforms and sources in a test's database
// (package testdb) through the store (package sources), failing the test
// on any error: the few lines every test above the store would repeat.
package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/sources"
)

// Pool returns a pool on a fresh database with the fleetpace schema
// (testdb.Pool) and the platforms ps in it.
func Pool(t testing.TB, ps ...sources.Platform) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t)
	for _, p := range ps {
		Platform(t, pool, p)
	}
	return pool
}

// Platform creates or replaces the platform p.
func Platform(t testing.TB, db sources.DBTX, p sources.Platform) {
	t.Helper()
	if _, err := sources.SetPlatform(context.Background(), db, p); err != nil {
		t.Fatal(err)
	}
}

// Source adds s and returns its id.
func Source(t testing.TB, db sources.DBTX, s sources.NewSource) int64 {
	t.Helper()
	id, _, err := sources.AddSource(context.Background(), db, s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// Queued creates platform (at 1000/s) and n sources on it, each queued for
// the job whose id is its own, as the scan would have queued them, and
// returns their ids.
func Queued(t testing.TB, db sources.DBTX, platform string, n int) []int64 {
	t.Helper()
	Platform(t, db, sources.Platform{Name: platform, RatePerSec: 1000})
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = Source(t, db, sources.NewSource{Platform: platform, URL: fmt.Sprintf("https://%s.example/%d", platform, i)})
	}
	Exec(t, db, `UPDATE fleetpace_source SET queued_at = now(), queued_job_id = id WHERE platform = $1`, platform)
	return ids
}

// Checked counts the sources of ids whose check landed: last outcome ok,
// no longer queued.
func Checked(t testing.TB, db sources.DBTX, ids []int64) int {
	t.Helper()
	var n int
	err := db.QueryRow(context.Background(), `SELECT count(*) FROM fleetpace_source
		WHERE id = ANY($1) AND last_outcome = 'ok' AND queued_at IS NULL`, ids).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Column returns the first column of every row sql returns, as T.
func Column[T any](t testing.TB, db sources.DBTX, sql string, args ...any) []T {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Exec runs one statement.
func Exec(t testing.TB, db sources.DBTX, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

// BreakHistory makes every insert into the fetch history fail (a check
// constraint no row meets), as a full disk or a broken table would.
func BreakHistory(t testing.TB, db sources.DBTX) {
	t.Helper()
	Exec(t, db, `ALTER TABLE fleetpace_check ADD CONSTRAINT test_broken CHECK (false) NOT VALID`)
}

// HistoryRows counts the history rows of a source.
func HistoryRows(t testing.TB, db sources.DBTX, id int64) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM fleetpace_check WHERE source_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// RefuseETag makes the database refuse, with an exception of a trigger,
// any update that stores the ETag "boom": a row only the database finds
// bad.
func RefuseETag(t testing.TB, db sources.DBTX) {
	t.Helper()
	Exec(t, db, `CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
	    IF NEW.etag = '"boom"' THEN RAISE EXCEPTION 'hostile row %', NEW.id; END IF;
	    RETURN NEW;
	END $$`)
	Exec(t, db, `CREATE TRIGGER refuse_boom BEFORE UPDATE ON fleetpace_source FOR EACH ROW EXECUTE FUNCTION refuse_boom()`)
}
