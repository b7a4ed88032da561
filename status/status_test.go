package status_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

// countingDB counts the status reads (one transaction each).
type countingDB struct {
	*pgxpool.Pool
	reads atomic.Int32
}

func (c *countingDB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	c.reads.Add(1)
	return c.Pool.BeginTx(ctx, opts)
}

// The report has every platform with its pace (every platform has a pace
// row) and the live workers.
func TestRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: "p", RatePerSec: 8}); err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.Beat(ctx, pool, fleet.Self("w1")); err != nil {
		t.Fatal(err)
	}
	rep, err := status.Read(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Platforms) != 1 || rep.Platforms[0].Pace.Platform != "p" || rep.Platforms[0].Pace.Rate != 8 || rep.Platforms[0].Pace.Multiplier != 1 {
		t.Fatalf("platforms = %+v, want p with its pace row", rep.Platforms)
	}
	if rep.Workers != 1 || len(rep.Fleet) != 1 || rep.Fleet[0].ID != "w1" || rep.At.IsZero() {
		t.Fatalf("report = %+v, want worker w1 live", rep)
	}
}

// Concurrent and repeated Gets within MaxAge share one read; the next Get
// after MaxAge reads again and sees what changed.
func TestCacheReadsOncePerMaxAge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := &countingDB{Pool: testdb.Pool(t)}
	clk := clocktest.New()
	cache := status.NewCache(db, 10*time.Second, clk)

	var wg sync.WaitGroup
	reports := make([]*status.Report, 16)
	for i := range reports {
		wg.Go(func() {
			rep, err := cache.Get(ctx)
			if err != nil {
				t.Error(err)
			}
			reports[i] = rep
		})
	}
	wg.Wait()
	if n := db.reads.Load(); n != 1 {
		t.Fatalf("16 concurrent Gets made %d reads, want 1", n)
	}
	for _, r := range reports {
		if r != reports[0] {
			t.Fatal("concurrent Gets returned different reports")
		}
	}

	if _, err := sources.SetPlatform(ctx, db.Pool, sources.Platform{Name: "new", RatePerSec: 1}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(9 * time.Second)
	if rep, err := cache.Get(ctx); err != nil || len(rep.Platforms) != 0 || db.reads.Load() != 1 {
		t.Fatalf("Get 9 s later: %d platforms, %d reads, %v; want the cached report", len(rep.Platforms), db.reads.Load(), err)
	}
	clk.Advance(time.Second)
	if rep, err := cache.Get(ctx); err != nil || len(rep.Platforms) != 1 || db.reads.Load() != 2 {
		t.Fatalf("Get 10 s later: %+v, %d reads, %v; want a new read with the new platform", rep, db.reads.Load(), err)
	}
}
