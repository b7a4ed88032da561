package status_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/storetest"
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
	pool := storetest.Pool(t, sources.Platform{Name: "p", RatePerSec: 8})
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

	storetest.Platform(t, db.Pool, sources.Platform{Name: "new", RatePerSec: 1})
	clk.Advance(9 * time.Second)
	if rep, err := cache.Get(ctx); err != nil || len(rep.Platforms) != 0 || db.reads.Load() != 1 {
		t.Fatalf("Get 9 s later: %d platforms, %d reads, %v; want the cached report", len(rep.Platforms), db.reads.Load(), err)
	}
	clk.Advance(time.Second)
	if rep, err := cache.Get(ctx); err != nil || len(rep.Platforms) != 1 || db.reads.Load() != 2 {
		t.Fatalf("Get 10 s later: %+v, %d reads, %v; want a new read with the new platform", rep, db.reads.Load(), err)
	}
}

// The report's JSON: every duration in seconds under a key that says so,
// the platform's settings beside its pace, cooldown, counts and recent
// fetches (from the history); and it reads back.
func TestReportJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t, sources.Platform{Name: "p", RatePerSec: 8})
	id := storetest.Source(t, pool, sources.NewSource{Platform: "p", URL: "https://p.example/1"})
	for _, c := range []sources.Check{{Outcome: "ok"}, {Outcome: "failed", Error: "HTTP 500"}, {Outcome: "rate_limited"}} {
		if err := sources.RecordCheck(ctx, pool, id, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := control.CoolDown(ctx, pool, "p", sources.CauseStop, time.Minute, "stop", 0.5); err != nil {
		t.Fatal(err)
	}
	rep, err := status.Read(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	p := rep.Platforms[0]
	if p.Recent.Total() != 3 || p.Recent.Checks["failed"] != 1 || p.Recent.Window != status.RecentWindow || p.Cooldown == nil {
		t.Fatalf("platform = %+v, want 3 recent fetches and a cooldown", p)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	js := string(b)
	for _, key := range []string{`"name":"p"`, `"cooldown_s":900`, `"remaining_s":`, `"stale_max_s":`, `"stale_p95_s":`,
		`"hold_s":`, `"effective_rate_per_sec":`, `"window_s":60`, `"requests_per_sec":0.05`, `"failing":1`, `"pace":`} {
		if !strings.Contains(js, key) {
			t.Errorf("status JSON lacks %s:\n%s", key, js)
		}
	}
	for _, bad := range []string{`"cooldown":9`, `"remaining":`, `"stale_max":`, `"interval":`} {
		if strings.Contains(js, bad) {
			t.Errorf("status JSON has a duration without its unit (%s):\n%s", bad, js)
		}
	}
	var back status.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	q := back.Platforms[0]
	if q.Name != "p" || q.Cooldown == nil || q.Cooldown.Remaining != p.Cooldown.Remaining || q.Recent.Total() != 3 ||
		q.Pace.Rate != 8 || q.Counts.Sources != 1 || q.Platform.Cooldown != 15*time.Minute {
		t.Fatalf("read back %+v, want %+v", q, p)
	}
}
