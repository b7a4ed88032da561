package worker

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

// The recorder's sessions commit with synchronous_commit off by default,
// whatever the URL (or the server) says; with RecorderSyncCommit they keep
// the URL's own setting (here "local", which no default gives).
func TestRecorderPoolSyncCommit(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t) + "&synchronous_commit=local"
	for _, tc := range []struct {
		sync bool
		want string
	}{{false, "off"}, {true, "local"}} {
		pc, err := recorderPoolConfig(dbconn.Config{URL: url}, tc.sync)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&got)
		pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want || pc.MaxConns != 2 {
			t.Errorf("RecorderSyncCommit %v: synchronous_commit %q, %d connections; want %q, 2", tc.sync, got, pc.MaxConns, tc.want)
		}
	}
}
