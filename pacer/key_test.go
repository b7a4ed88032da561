package pacer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/clocktest"
)

// setKeyLimits gives platform per-key limits and caps.
func setKeyLimits(t *testing.T, pool *pgxpool.Pool, platform string, keyRate float64, keyBurst, maxInFlight, keyMaxInFlight int) {
	t.Helper()
	if _, err := pool.Exec(context.Background(),
		`UPDATE fleetpace_platform SET key_rate = $2, key_burst = $3, max_in_flight = $4, key_max_in_flight = $5 WHERE name = $1`,
		platform, keyRate, keyBurst, maxInFlight, keyMaxInFlight); err != nil {
		t.Fatal(err)
	}
}

// keyed makes a platform at rate whose keys are limited to keyRate
// (burst 1), on a database of its own, and a fake clock.
func keyed(t *testing.T, name string, rate, keyRate float64) (string, *pgxpool.Pool, *clocktest.Fake) {
	t.Helper()
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: name, rate: rate, adapt: "estimate"})
	setKeyLimits(t, pool, name, keyRate, 1, 0, 0)
	return url, pool, clocktest.New()
}

// A keyed request takes a slot of its key and of its platform in one
// statement: the key's spacing holds (2/s: 500 ms apart) while the
// platform's (100/s) keeps serving other keys in between — a key waiting
// for its next slot books nothing on the platform's schedule.
func TestKeyAndPlatformSlots(t *testing.T) {
	t.Parallel()
	url, _, clk := keyed(t, "api", 100, 2)
	p := fakePacer(t, url, clk, nil)
	ctx := context.Background()

	a1, err := p.ReserveKey(ctx, "api", "alice", time.Minute)
	if err != nil || !a1.Granted || a1.Wait != 0 {
		t.Fatalf("alice's first: %+v %v", a1, err)
	}
	a2, err := p.ReserveKey(ctx, "api", "alice", time.Minute)
	if err != nil || a2.Granted || !a2.Retry || a2.Wait < 490*time.Millisecond || a2.Wait > 510*time.Millisecond {
		t.Fatalf("alice's second at once: %+v %v, want denied, retry in 500 ms", a2, err)
	}
	// Other keys are not held up by alice's spacing: each takes the
	// platform's next slot, 10 ms apart.
	var last time.Time
	for i, key := range []string{"bob", "carol", "dave"} {
		r, err := p.ReserveKey(ctx, "api", key, time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("%s: %+v %v", key, r, err)
		}
		if i > 0 {
			if gap := r.Slot.Sub(last); gap < 9*time.Millisecond || gap > 11*time.Millisecond {
				t.Fatalf("%s's slot %v after the previous key's, want the platform's spacing (10 ms)", key, gap)
			}
		}
		last = r.Slot
	}
	clk.Advance(500 * time.Millisecond)
	a3, err := p.ReserveKey(ctx, "api", "alice", time.Minute)
	if err != nil || !a3.Granted || a3.Slot.Sub(a1.Slot) < 500*time.Millisecond {
		t.Fatalf("alice after 500 ms: %+v %v, want a slot ≥ 500 ms after her first", a3, err)
	}
	// Acquire waits out a key's spacing within its bound (a minute: the
	// clock is stepped 10 ms at a time while anything sleeps on it, and a
	// wake-up the statements found late reserves again, so on a loaded
	// machine fake time can run past a bound of a second; the 20× stress
	// beside a busy loop saw it once).
	done := make(chan Reservation, 1)
	go func() {
		r, err := p.AcquireKey(ctx, "api", "alice", time.Minute)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	for r := range stepUntil(t, clk, 1, 10*time.Millisecond, done) {
		if !r.Granted || r.Slot.Sub(a3.Slot) < 500*time.Millisecond {
			t.Fatalf("AcquireKey: %+v", r)
		}
	}
}

// A platform's in-flight cap: at most N requests open fleet-wide; a report
// gives its lease back at once; a lease never reported (a crashed worker)
// expires after Config.LeaseTTL. The same per key.
func TestInFlightCap(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "cap", rate: 1000, adapt: "estimate"})
	setKeyLimits(t, pool, "cap", 0, 1, 3, 2)
	clk := clocktest.New()
	p := fakePacer(t, url, clk, func(c *Config) { c.LeaseTTL = 10 * time.Second; c.CleanBatch = -1 })
	q := fakePacer(t, url, clk, func(c *Config) { c.LeaseTTL = 10 * time.Second })
	ctx := context.Background()

	var open []Reservation
	for range 3 {
		r, err := p.Reserve(ctx, "cap", time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
		open = append(open, r)
	}
	r, err := q.Reserve(ctx, "cap", time.Minute) // another process
	if err != nil || r.Granted || !r.Retry || r.Wait > time.Second {
		t.Fatalf("a 4th open request: %+v %v, want denied, retry within a second", r, err)
	}
	if _, err := p.Report(ctx, "cap", open[0], Feedback{Kind: Clean}); err != nil {
		t.Fatal(err)
	}
	if r, err := q.Reserve(ctx, "cap", time.Minute); err != nil || !r.Granted {
		t.Fatalf("after a report: %+v %v, want granted", r, err)
	}
	// The lost requests' leases expire.
	if r, err := q.Reserve(ctx, "cap", time.Minute); err != nil || r.Granted {
		t.Fatalf("full again: %+v %v", r, err)
	}
	clk.Advance(11 * time.Second)
	if r, err := q.Reserve(ctx, "cap", time.Minute); err != nil || !r.Granted {
		t.Fatalf("after the leases expired: %+v %v, want granted", r, err)
	}

	// Per key: 2 open.
	clk.Advance(11 * time.Second)
	for range 2 {
		if r, err := p.ReserveKey(ctx, "cap", "k", time.Minute); err != nil || !r.Granted {
			t.Fatalf("key: %+v %v", r, err)
		}
	}
	if r, err := p.ReserveKey(ctx, "cap", "k", time.Minute); err != nil || r.Granted || !r.Retry {
		t.Fatalf("the key's 3rd open request: %+v %v, want denied", r, err)
	}
	if r, err := p.ReserveKey(ctx, "cap", "other", time.Minute); err != nil || !r.Granted {
		t.Fatalf("another key meanwhile: %+v %v, want granted", r, err)
	}
}

// A 429 with Retry-After for a key holds that key fleet-wide and nobody
// else: the same process and another are denied that key's slots until the
// hold ends, while other keys and keyless requests go on.
func TestKeyRetryAfterHoldsTheKey(t *testing.T) {
	t.Parallel()
	url, pool, clk := keyed(t, "per", 100, 10)
	p := fakePacer(t, url, clk, nil)
	q := fakePacer(t, url, clk, func(c *Config) { c.PollOnly = true })
	ctx := context.Background()
	r, err := p.ReserveKey(ctx, "per", "hot", time.Minute)
	if err != nil || !r.Granted {
		t.Fatalf("%+v %v", r, err)
	}
	rep, err := p.Report(ctx, "per", r, Feedback{Kind: Pressure, RetryAfter: 10 * time.Second})
	if err != nil || rep.Hold < 9*time.Second {
		t.Fatalf("the key's report: %+v %v", rep, err)
	}
	for i, pc := range []*Pacer{p, q} {
		if r, err := pc.ReserveKey(ctx, "per", "hot", time.Second); err != nil || r.Granted || r.Wait < 9*time.Second {
			t.Fatalf("the held key: %+v %v, want denied ~10 s", r, err)
		}
		if r, err := pc.ReserveKey(ctx, "per", fmt.Sprintf("cold%d", i), time.Second); err != nil || !r.Granted {
			t.Fatalf("another key: %+v %v, want granted", r, err)
		}
		if r, err := pc.Reserve(ctx, "per", time.Second); err != nil || !r.Granted {
			t.Fatalf("keyless: %+v %v, want granted", r, err)
		}
	}
	states, err := States(WithTime(ctx, clk.Now()), pool)
	if err != nil || len(states) != 1 || states[0].Hold != 0 {
		t.Fatalf("the platform's state: %+v %v, want no hold", states, err)
	}
}

// After a key's lone Retry-After the key comes back at no less than half
// its rate. A key's row hears of no accepted answer (they go to the
// platform's row), so what it "accepted" over the refusal's hold is no
// reading: read as a window's quota it put the key at the floor of its
// adaptation (3/s → 0.2/s, a slot every 5 s) after its hold, and an
// integration run's key came back 6 s late behind a snooze.
func TestKeyLoneRetryAfterKeepsItsPace(t *testing.T) {
	t.Parallel()
	url, _, clk := keyed(t, "lr", 100, 3)
	p := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	var last Reservation
	for i := range 12 { // 4 s of the key at its rate, every answer clean
		r, err := p.ReserveKey(ctx, "lr", "k", time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("slot %d: %+v %v", i, r, err)
		}
		clk.Advance(r.Wait)
		if _, err := p.Report(ctx, "lr", r, Feedback{Kind: Clean}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second / 3)
		last = r
	}
	if _, err := p.Report(ctx, "lr", last, Feedback{Kind: Pressure, RetryAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10*time.Second + 100*time.Millisecond)
	r, err := p.ReserveKey(ctx, "lr", "k", time.Minute)
	if err != nil || !r.Granted {
		t.Fatalf("the key at its hold's end: %+v %v, want a slot", r, err)
	}
	clk.Advance(r.Wait)
	next, err := p.ReserveKey(ctx, "lr", "k", 0)
	if err != nil || next.Granted || next.Wait > 700*time.Millisecond {
		t.Fatalf("the key's next slot after its hold: %+v %v, want within 700 ms (half its rate of 3/s or more)", next, err)
	}
}

// A key is at most MaxKeyLen bytes of UTF-8.
func TestBadKey(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "bk", rate: 10})
	p := newPacer(t, url, nil)
	for _, key := range []string{string(make([]byte, MaxKeyLen+1)), "\xff"} {
		if _, err := p.ReserveKey(context.Background(), "bk", key, time.Second); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("key of %d bytes: %v, want ErrInvalidKey", len(key), err)
		}
	}
}

// Idle keys' rows go (PruneKeys): a key with no slot for longer than the
// idle expiry, no hold and no open lease; a recent key, a held one and the
// platform's row stay. The next request of a pruned key makes its row
// again.
func TestPruneIdleKeys(t *testing.T) {
	t.Parallel()
	url, pool, clk := keyed(t, "pk", 100, 10)
	p := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	for _, key := range []string{"old", "held"} {
		if r, err := p.ReserveKey(ctx, "pk", key, time.Minute); err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
	}
	r, _ := p.ReserveKey(ctx, "pk", "held", time.Minute)
	clk.Advance(time.Second)
	r, _ = p.ReserveKey(ctx, "pk", "held", time.Minute)
	if _, err := p.Report(ctx, "pk", r, Feedback{Kind: Pressure, RetryAfter: time.Hour}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(11 * time.Minute)
	if r, err := p.ReserveKey(ctx, "pk", "recent", time.Minute); err != nil || !r.Granted {
		t.Fatalf("%+v %v", r, err)
	}
	n, err := PruneKeys(WithTime(ctx, clk.Now()), pool, DefaultKeyIdle, 100)
	if err != nil || n != 1 {
		t.Fatalf("pruned %d (%v), want 1: the idle key", n, err)
	}
	var keys []string
	rows, err := pool.Query(ctx, `SELECT key FROM fleetpace_pace WHERE platform = 'pk' ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if fmt.Sprint(keys) != "[ held recent]" {
		t.Fatalf("rows left: %q, want the platform's, held and recent", keys)
	}
	if r, err := p.ReserveKey(ctx, "pk", "old", time.Minute); err != nil || !r.Granted {
		t.Fatalf("the pruned key again: %+v %v", r, err)
	}
}

// A key's row is in use from its making: a scan tick's prune between the
// making and the reservation that asked for it (a first use: no row, make
// it, reserve again) leaves it. Made with a cursor of 0, it was taken for
// a key idle since 1970 and deleted, and the reservation failed with
// ErrUnknownPlatform (bench keys: 355 of 2,000 first uses).
func TestNewKeyRowSurvivesAPrune(t *testing.T) {
	t.Parallel()
	url, pool, clk := keyed(t, "nk", 100, 10)
	p := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	if _, err := p.pool.Exec(ctx, ensureKeyRowSQL, "nk", "fresh", p.stmtNow()); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if n, err := PruneKeys(WithTime(ctx, clk.Now()), pool, DefaultKeyIdle, 100); err != nil || n != 0 {
		t.Fatalf("pruned %d (%v) right after the key's row was made, want 0", n, err)
	}
	if r, err := p.ReserveKey(ctx, "nk", "fresh", time.Minute); err != nil || !r.Granted {
		t.Fatalf("the new key: %+v %v", r, err)
	}
}

// A process's callers of one hot key take turns: with the key at 2/s and a
// bound of 1 s, while one waits for the key's next slot, two more callers
// can be served within the bound behind it; the next three are denied at
// once (a River job snoozes instead of holding a worker), without waiting
// and without a round trip each. The ones served get the key's slots
// 500 ms apart. Another key is served meanwhile at once.
func TestHotKeyCallersTakeTurns(t *testing.T) {
	t.Parallel()
	url, _, clk := keyed(t, "hk", 100, 2)
	// A loaded machine must not push a statement past its timeout: paced
	// locally (degraded), every caller gets a slot of its own and sleeps,
	// which reads as five queued (seen with two cores spinning).
	p := fakePacer(t, url, clk, func(c *Config) { c.ConnectTimeout, c.StatementTimeout = time.Minute, time.Minute })
	ctx := context.Background()
	if r, err := p.AcquireKey(ctx, "hk", "hot", time.Second); err != nil || !r.Granted {
		t.Fatalf("the first: %+v %v", r, err)
	}
	type result struct {
		r   Reservation
		err error
	}
	results := make(chan result, 6)
	acquire := func() {
		go func() {
			r, err := p.AcquireKey(ctx, "hk", "hot", time.Second)
			results <- result{r, err}
		}()
	}
	// sleepersOrResult waits until clk has n sleepers or a result came.
	sleepersOrResult := func(n int) *result {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case res := <-results:
				return &res
			default:
			}
			bctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
			err := clk.BlockUntilContext(bctx, n)
			cancel()
			if err == nil {
				return nil
			}
		}
		t.Fatalf("neither %d sleepers nor a result within 30 s", n)
		return nil
	}
	// The one whose turn it is waits for the key's next slot.
	acquire()
	if res := sleepersOrResult(1); res != nil {
		t.Fatalf("the second caller returned at once: %+v %v", res.r, res.err)
	}
	queued, denied := 0, 0
	for range 5 {
		acquire()
		switch res := sleepersOrResult(2 + queued); {
		case res == nil:
			queued++
		default:
			var we *WaitError
			if !errors.As(res.err, &we) || we.Wait <= 0 {
				t.Fatalf("a caller served before the clock moved: %+v %v, want denied at once beyond its 1-s bound", res.r, res.err)
			}
			denied++
		}
	}
	if queued != 2 || denied != 3 {
		t.Fatalf("%d callers queued and %d denied at once, want 2 and 3: a queue beyond the bound", queued, denied)
	}
	if r, err := p.ReserveKey(ctx, "hk", "cold", time.Second); err != nil || !r.Granted || r.Wait > 20*time.Millisecond {
		t.Fatalf("another key meanwhile: %+v %v, want served at once", r, err)
	}
	done := make(chan result, 3)
	go func() {
		for range 3 {
			done <- <-results
		}
	}()
	var slots []time.Time
	for res := range stepUntil(t, clk, 3, 10*time.Millisecond, done) {
		if res.err != nil {
			var we *WaitError
			if errors.As(res.err, &we) {
				continue // the last in line may find the turn past its bound
			}
			t.Fatal(res.err)
		}
		slots = append(slots, res.r.Slot)
	}
	if len(slots) < 2 {
		t.Fatalf("%d of the queued callers served within the bound, want 2 or 3", len(slots))
	}
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].Sub(slots[i-1]); gap < 490*time.Millisecond {
			t.Errorf("slots %v apart, want the key's spacing (500 ms)", gap)
		}
	}
	p.mu.Lock()
	left := len(p.turns)
	p.mu.Unlock()
	if left != 0 {
		t.Errorf("%d turnstiles left after every caller returned", left)
	}
}

// A held key's caller whose bound reaches past the hold waits it out and
// is served; one whose bound ends before is denied with the hold's wait,
// and so is, at once, another caller behind the one waiting (Transport
// waits and asks again; a River job snoozes instead of holding a worker for
// nothing). q is another process: it learns of the hold from the row.
func TestHeldKeyWaitsWithinItsBound(t *testing.T) {
	t.Parallel()
	url, _, clk := keyed(t, "hw", 100, 10)
	p := fakePacer(t, url, clk, nil)
	q := fakePacer(t, url, clk, nil)
	ctx := context.Background()
	r, err := p.ReserveKey(ctx, "hw", "k", time.Minute)
	if err != nil || !r.Granted {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := p.Report(ctx, "hw", r, Feedback{Kind: Pressure, RetryAfter: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	var we *WaitError
	if _, err := q.AcquireKey(ctx, "hw", "k", time.Second); !errors.As(err, &we) || we.Wait < 1900*time.Millisecond {
		t.Fatalf("a bound short of the hold: %v, want a WaitError of ~2 s", err)
	}
	// A reservation within the bound is denied too, booking nothing: a slot
	// at the hold's end would put the platform's other keys behind it.
	if r, err := q.ReserveKey(ctx, "hw", "k", time.Minute); err != nil || r.Granted || r.Wait < 1900*time.Millisecond {
		t.Fatalf("the held key within the bound: %+v %v, want denied ~2 s", r, err)
	}
	done := make(chan Reservation, 1)
	go func() {
		r, err := q.AcquireKey(ctx, "hw", "k", time.Minute)
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, "the first caller to wait out the hold", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		turn := q.turns[rowName("hw", "k")]
		return turn != nil && turn.held
	})
	if _, err := q.AcquireKey(ctx, "hw", "k", time.Minute); !errors.As(err, &we) || we.Wait < 1900*time.Millisecond {
		t.Fatalf("a second caller behind the hold: %v, want a WaitError of ~2 s at once", err)
	}
	// The hold books nothing on the platform's schedule: another key's slot
	// is at once, in either process.
	for i, pc := range []*Pacer{q, p} {
		if r, err := pc.ReserveKey(ctx, "hw", fmt.Sprint("other", i), time.Minute); err != nil || !r.Granted || r.Wait > 100*time.Millisecond {
			t.Fatalf("another key while k's hold is waited out: %+v %v, want a slot at once", r, err)
		}
	}
	start := clk.Now()
	for r := range stepUntil(t, clk, 1, 50*time.Millisecond, done) {
		if !r.Granted || clk.Now().Sub(start) < 1900*time.Millisecond {
			t.Fatalf("served %s into a 2-s hold: %+v", clk.Now().Sub(start), r)
		}
	}
}
