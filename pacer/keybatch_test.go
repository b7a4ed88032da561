package pacer

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/clocktest"
)

// lockPlatformRow holds platform's pace row locked, as a reservation in
// flight elsewhere would, until the returned function is called.
func lockPlatformRow(t *testing.T, pool *pgxpool.Pool, platform string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM fleetpace_pace WHERE platform = $1 AND key = '' FOR UPDATE`, platform); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// pendingKeys is how many keyed reservations of platform wait to be sent.
func (p *Pacer) pendingKeys(platform string) int {
	p.keyMu.Lock()
	defer p.keyMu.Unlock()
	if q := p.keyQueues[platform]; q != nil {
		return len(q.pending)
	}
	return 0
}

// reserveKeysAtOnce has one caller per key reserve at the same time while
// the platform's row is locked elsewhere, and returns their reservations
// once the lock is gone, with the key statements and round trips it took.
func reserveKeysAtOnce(t *testing.T, p *Pacer, pool *pgxpool.Pool, keys []string) (res []Reservation, errs []error, statements, batches uint64) {
	t.Helper()
	before := p.Stats()
	release := lockPlatformRow(t, pool, "api")
	res, errs = make([]Reservation, len(keys)), make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() { res[i], errs[i] = p.ReserveKey(context.Background(), "api", key, time.Minute) })
	}
	// Every caller has sent its statement or waits in the queue behind the
	// first batch, which waits for the lock.
	waitFor(t, "every caller asked", func() bool {
		return int(p.Stats().KeyStatements-before.KeyStatements)+p.pendingKeys("api") == len(keys)
	})
	release()
	wg.Wait()
	after := p.Stats()
	return res, errs, after.KeyStatements - before.KeyStatements, after.KeyBatches - before.KeyBatches
}

// platformCursor is the platform's own pace row's cursor.
func platformCursor(t *testing.T, pool *pgxpool.Pool, platform string) float64 {
	t.Helper()
	var c float64
	if err := pool.QueryRow(context.Background(),
		`SELECT cursor_at FROM fleetpace_pace WHERE platform = $1 AND key = ''`, platform).Scan(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// Keyed reservations that callers of one process make at the same time go
// out together: one round trip and transaction for those that queued
// behind a statement in flight, where each took its own (and waited in the
// platform row's lock queue for the others'). The slots are the ones
// single statements give: every one granted, the platform's spacing
// between them.
func TestKeyReservationsGoOutTogether(t *testing.T) {
	t.Parallel()
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	for _, tc := range []struct {
		name        string
		maxKeyBatch int
		maxBatches  uint64 // round trips for the 10
		minBatches  uint64
	}{
		{"batched", 0, 2, 1},
		{"one statement each (control)", 1, 10, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url, pool, clk := keyed(t, "api", 100, 1)
			p := fakePacer(t, url, clk, func(c *Config) { c.MaxKeyBatch = tc.maxKeyBatch })
			for _, key := range keys { // the key rows exist
				if r, err := p.ReserveKey(context.Background(), "api", key, time.Minute); err != nil || !r.Granted {
					t.Fatalf("%s: %+v %v", key, r, err)
				}
			}
			clk.Advance(2 * time.Second)

			res, errs, statements, batches := reserveKeysAtOnce(t, p, pool, keys)
			if statements != 10 || batches < tc.minBatches || batches > tc.maxBatches {
				t.Fatalf("10 keyed reservations at once: %d statements in %d round trips, want 10 in [%d, %d]",
					statements, batches, tc.minBatches, tc.maxBatches)
			}
			var slots []time.Time
			for i, r := range res {
				if errs[i] != nil || !r.Granted {
					t.Fatalf("%s: %+v %v", keys[i], r, errs[i])
				}
				slots = append(slots, r.Slot)
			}
			slices.SortFunc(slots, time.Time.Compare)
			for i := 1; i < len(slots); i++ {
				if gap := slots[i].Sub(slots[i-1]); gap < 9900*time.Microsecond {
					t.Fatalf("slots %d and %d %v apart, want the platform's spacing (10 ms): %v", i-1, i, gap, slots)
				}
			}
		})
	}
}

// A batch is one transaction: when one of its statements fails, nothing of
// it is booked — the rows that came back for the others included — and
// each of its callers reserves again alone. The others get their slots,
// the platform's cursor moves by their slots only, and the failing one
// gets its error.
func TestKeyBatchRollsBackAsOne(t *testing.T) {
	t.Parallel()
	url, pool, clk := keyed(t, "api", 100, 1)
	p := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	keys := []string{"k0", "k1", "k2", "k3", "k4", "poison"}
	for _, key := range keys {
		if r, err := p.ReserveKey(ctx, "api", key, time.Minute); err != nil || !r.Granted {
			t.Fatalf("%s: %+v %v", key, r, err)
		}
	}
	// From now on, any slot booked for "poison" breaks a constraint.
	if _, err := pool.Exec(ctx, `ALTER TABLE fleetpace_pace ADD CONSTRAINT poison CHECK (key <> 'poison' OR cursor_at < 0) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	start := platformCursor(t, pool, "api")

	before := p.Stats()
	release := lockPlatformRow(t, pool, "api")
	res, errs := make([]Reservation, len(keys)), make([]error, len(keys))
	var wg sync.WaitGroup
	reserve := func(i int) { res[i], errs[i] = p.ReserveKey(ctx, "api", keys[i], time.Minute) }
	wg.Go(func() { reserve(0) }) // the first batch, alone, waits for the lock
	waitFor(t, "k0 sent", func() bool { return p.Stats().KeyStatements-before.KeyStatements == 1 })
	for i := 1; i < len(keys); i++ {
		wg.Go(func() { reserve(i) })
	}
	waitFor(t, "the rest queued", func() bool { return p.pendingKeys("api") == len(keys)-1 })
	release()
	wg.Wait()

	for i, key := range keys {
		if key == "poison" {
			if errs[i] == nil || res[i].Granted {
				t.Fatalf("poison: %+v %v, want the constraint's error", res[i], errs[i])
			}
			continue
		}
		if errs[i] != nil || !res[i].Granted {
			t.Fatalf("%s: %+v %v", key, res[i], errs[i])
		}
	}
	// Five slots booked, at the platform's spacing from the first: the
	// batch's rows that came back before poison failed were not booked
	// twice (the cursor would be 4 slots further).
	var slots []float64
	for i := range 5 {
		slots = append(slots, float64(res[i].Slot.UnixNano())/1e9)
	}
	slices.Sort(slots)
	spacing := (slots[4] - slots[0]) / 4
	if spacing < 0.0099 || spacing > 0.011 {
		t.Fatalf("slots %v: spacing %.6f, want the platform's (10 ms)", slots, spacing)
	}
	if got, want := platformCursor(t, pool, "api"), slots[4]+spacing; math.Abs(got-want) > 1e-5 {
		t.Fatalf("platform cursor %.6f, want %.6f (the last of 5 slots + one spacing; it was %.6f before)", got, want, start)
	}
	st := p.Stats()
	if got := st.KeyStatements - before.KeyStatements; got != 1+5+5 {
		t.Fatalf("%d key statements, want 11: k0, the batch of 5, each of them again alone", got)
	}
}

// Keyed reservations in a batch when the database becomes unreachable: the
// batch's failure is an outage for each of its callers, who pace locally
// (degraded), none gets an error.
func TestKeyBatchDuringAnOutage(t *testing.T) {
	t.Parallel()
	dbURL, _, clk := keyed(t, "api", 100, 1)
	p, px := proxiedPacer(t, dbURL, clk)
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	for _, key := range keys { // shared: the platform's rate is known locally
		if r, err := p.ReserveKey(context.Background(), "api", key, time.Minute); err != nil || !r.Granted || r.Degraded {
			t.Fatalf("%s: %+v %v", key, r, err)
		}
	}
	px.setCut(true)
	res, errs := make([]Reservation, len(keys)), make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() { res[i], errs[i] = p.ReserveKey(context.Background(), "api", key, time.Minute) })
	}
	wg.Wait()
	for i, key := range keys {
		if errs[i] != nil || !res[i].Degraded || !res[i].Granted {
			t.Fatalf("%s with the database cut: %+v %v, want a degraded (local) slot", key, res[i], errs[i])
		}
	}
}

// A platform that caps its open requests, or whose keys are capped, gets
// no local slot while the database is unreachable: the other processes'
// leases are counted in the database alone. The control is a platform
// without a cap, paced locally as usual.
func TestCappedPlatformGetsNoLocalSlot(t *testing.T) {
	t.Parallel()
	dbURL, pool := setup(t)
	for _, spec := range []struct {
		name                string
		maxInFlight, keyCap int
		keyed               bool
	}{{"capped", 2, 0, false}, {"keycapped", 0, 2, true}, {"open", 0, 0, false}} {
		addPlatform(t, pool, platformSpec{name: spec.name, rate: 100})
		setKeyLimits(t, pool, spec.name, 0, 1, spec.maxInFlight, spec.keyCap)
	}
	p, px := proxiedPacer(t, dbURL, clocktest.New())
	reserve := func(platform string) (Reservation, error) {
		if platform == "keycapped" {
			return p.ReserveKey(context.Background(), platform, "k", time.Minute)
		}
		return p.Reserve(context.Background(), platform, time.Minute)
	}
	for _, platform := range []string{"capped", "keycapped", "open"} {
		if r, err := reserve(platform); err != nil || !r.Granted || r.Degraded {
			t.Fatalf("%s, shared: %+v %v", platform, r, err)
		}
	}
	px.setCut(true)
	for _, platform := range []string{"capped", "keycapped", "open"} {
		r, err := reserve(platform)
		if err != nil || !r.Degraded {
			t.Fatalf("%s with the database cut: %+v %v, want a degraded answer", platform, r, err)
		}
		if want := platform == "open"; r.Granted != want {
			t.Errorf("%s with the database cut: granted %v, want %v (%+v)", platform, r.Granted, want, r)
		}
	}
}

// While the database is unreachable a key is paced locally at its own rate
// ÷ (fleet size + 1), not only at its platform's: two local slots of a key
// limited to 2/s, in a fleet of one, are 1 s apart (the platform's, 100/s,
// would space them 20 ms). A key never seen of a platform that limits its
// keys gets no local slot, as a platform never seen gets none.
func TestDegradedKeyKeepsItsRate(t *testing.T) {
	t.Parallel()
	dbURL, _, clk := keyed(t, "api", 100, 2)
	p, px := proxiedPacer(t, dbURL, clk)
	ctx := context.Background()
	if r, err := p.ReserveKey(ctx, "api", "k0", time.Minute); err != nil || !r.Granted || r.Degraded {
		t.Fatalf("shared: %+v %v", r, err)
	}
	px.setCut(true)
	var waits []time.Duration
	for range 2 {
		r, err := p.ReserveKey(ctx, "api", "k0", time.Minute)
		if err != nil || !r.Granted || !r.Degraded {
			t.Fatalf("with the database cut: %+v %v, want a degraded (local) slot", r, err)
		}
		waits = append(waits, r.Wait)
	}
	if gap := waits[1] - waits[0]; gap < time.Second-time.Millisecond {
		t.Errorf("two local slots of a key at 2/s, fleet of one, %s apart; want 1 s (its rate ÷ 2)", gap)
	}
	if r, err := p.ReserveKey(ctx, "api", "never-seen", time.Minute); err != nil || r.Granted || !r.Degraded {
		t.Errorf("a key never seen, with the database cut: %+v %v, want denied (degraded)", r, err)
	}
}

// proxiedPacer is a pacer of a fleet of one on the fake clock clk that
// reaches dbURL through a proxy the test can cut.
func proxiedPacer(t *testing.T, dbURL string, clk clock.Clock) (*Pacer, *proxy) {
	t.Helper()
	px, proxied := behindProxy(t, dbURL)
	p := fakePacer(t, proxied, clk, func(c *Config) { c.PollOnly = true })
	p.SetFleetSize(1)
	return p, px
}
