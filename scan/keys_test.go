package scan_test

import (
	"maps"
	"testing"

	"github.com/fleetpace/fleetpace/scan"
)

// queuedByKey counts the sources of each key of platform that are queued.
func (f *fixture) queuedByKey(t *testing.T, platform string) map[string]int {
	t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT key, count(*) FROM fleetpace_source
		WHERE platform = $1 AND queued_at IS NOT NULL GROUP BY key`, platform)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var (
			key string
			n   int
		)
		if err := rows.Scan(&key, &n); err != nil {
			t.Fatal(err)
		}
		out[key] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// One key with 100,000 due sources, every one older than the other keys'
// sources, does not starve the other keys of its platform: within the
// platform's cap keys take turns, so every tick gives each key with due
// sources its turn (here 10 each of a cap of 40 over 4 keys), and the
// backlog only what the others leave.
func TestKeyBacklogDoesNotStarveOtherKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "p", 1000) // 30,000 in a 30-s look-ahead: the cap binds
	f.exec(t, `INSERT INTO fleetpace_source (platform, key, url, last_checked_at, due_at)
		SELECT 'p', 'hog', 'https://hog.example/' || g, now() - interval '30 hours' + g * interval '1 second', now() - interval '1 second'
		FROM generate_series(1, 100000) g`)
	for _, key := range []string{"a", "b", "c"} {
		f.exec(t, `INSERT INTO fleetpace_source (platform, key, url, last_checked_at, due_at)
			SELECT 'p', $1, 'https://' || $1 || '.example/' || g, now() - interval '1 hour' + g * interval '1 second', now() - interval '1 second'
			FROM generate_series(1, 50) g`, key)
	}
	// The control: in plain fair order the cap's 40 are all the backlog's.
	var others int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FILTER (WHERE key <> 'hog') FROM (
		SELECT key FROM fleetpace_source WHERE platform = 'p'
		ORDER BY last_checked_at NULLS FIRST, id LIMIT 40) x`).Scan(&others); err != nil {
		t.Fatal(err)
	}
	if others != 0 {
		t.Fatalf("plain fair order gives %d of 40 to other keys than the backlog; the test would not catch starvation", others)
	}
	total := map[string]int{}
	for tick := 1; tick <= 3; tick++ {
		res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{Limit: 100, PerPlatformCap: 40})
		if err != nil {
			t.Fatal(err)
		}
		queued := f.queuedByKey(t, "p")
		got := map[string]int{}
		for k, n := range queued {
			got[k] = n - total[k]
		}
		total = queued
		if res.Enqueued != 40 || !maps.Equal(got, map[string]int{"hog": 10, "a": 10, "b": 10, "c": 10}) {
			t.Fatalf("tick %d queued %d: by key %v, want 10 of each of hog, a, b, c", tick, res.Enqueued, got)
		}
	}
}

// On a platform that limits keys, every key's share of a tick is its rate ×
// look-ahead minus its queued sources (a key's own rate in
// fleetpace_key_limit before the platform's per-key rate); key "" is only
// capped by its platform. The next tick queues what the first left of each
// share and no more.
func TestTickKeyShare(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "p", 100)                                                    // 3,000 in 30 s
	f.exec(t, `UPDATE fleetpace_platform SET key_rate = 0.2 WHERE name = 'p'`) // 6 a key in 30 s
	f.exec(t, `INSERT INTO fleetpace_key_limit (platform, key, rate) VALUES ('p', 'fast', 0.5), ('p', 'plain', NULL)`)
	for _, key := range []string{"a", "b", "fast", "plain", ""} {
		f.exec(t, `INSERT INTO fleetpace_source (platform, key, url, last_checked_at, due_at)
			SELECT 'p', $1, 'https://' || $1 || '.example/' || g, now() - interval '1 hour' + g * interval '1 second', now() - interval '1 second'
			FROM generate_series(1, 30) g`, key)
	}
	// a already has 4 queued: 2 left of its 6.
	f.exec(t, `UPDATE fleetpace_source SET queued_at = now(), queued_job_id = 0
		WHERE id IN (SELECT id FROM fleetpace_source WHERE key = 'a' ORDER BY id LIMIT 4)`)
	cfg := scan.Config{Limit: 1000, PerPlatformCap: 1000}
	if _, err := scan.Tick(f.ctx, f.pool, f.client, cfg); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"a": 6, "b": 6, "fast": 15, "plain": 6, "": 30}
	if got := f.queuedByKey(t, "p"); !maps.Equal(got, want) {
		t.Fatalf("queued by key after a tick = %v, want %v", got, want)
	}
	// Every share is spent: another tick queues nothing more, until a key's
	// rate rises.
	res, err := scan.Tick(f.ctx, f.pool, f.client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Enqueued != 0 {
		t.Fatalf("second tick queued %d, want 0 (every key's share spent): %v", res.Enqueued, f.queuedByKey(t, "p"))
	}
	f.exec(t, `UPDATE fleetpace_platform SET key_rate = 0.3 WHERE name = 'p'`) // 9 a key
	if _, err := scan.Tick(f.ctx, f.pool, f.client, cfg); err != nil {
		t.Fatal(err)
	}
	want = map[string]int{"a": 9, "b": 9, "fast": 15, "plain": 9, "": 30}
	if got := f.queuedByKey(t, "p"); !maps.Equal(got, want) {
		t.Fatalf("queued by key after the rate rose = %v, want %v", got, want)
	}
	// Without a per-key rate, keys are capped by the platform alone.
	f.exec(t, `UPDATE fleetpace_platform SET key_rate = 0 WHERE name = 'p'`)
	if _, err := scan.Tick(f.ctx, f.pool, f.client, cfg); err != nil {
		t.Fatal(err)
	}
	want = map[string]int{"a": 30, "b": 30, "fast": 15, "plain": 30, "": 30}
	if got := f.queuedByKey(t, "p"); !maps.Equal(got, want) {
		t.Fatalf("queued by key without a per-key rate = %v, want %v (fast keeps its own rate)", got, want)
	}
}
