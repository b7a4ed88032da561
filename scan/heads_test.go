package scan_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
)

// oracleSQL is the due query's result written the obvious way, with
// windows over every due source: within a platform, keys take turns (every
// key's first due source in fair order, then every key's second, …), each
// key up to its cap; the platform's selection is the first of that order up
// to its cap; the first $1 of all selections in fair order are the places,
// and each platform's places are taken by its selection in turn order. The
// due query must return exactly this. $1 the limit, $2/$3 platforms and caps
// (a platform missing gets $4), $5/$6 platforms and their keys' cap, $7/$8/$9
// single keys' caps; key "" is never capped apart from its platform.
var oracleSQL = `
WITH due AS (
    SELECT s.id, s.platform, s.key, COALESCE(s.last_checked_at, '-infinity'::timestamptz) AS k,
           row_number() OVER (PARTITION BY s.platform, s.key
                              ORDER BY COALESCE(s.last_checked_at, '-infinity'::timestamptz), s.id) AS rk
    FROM fleetpace_source s
    WHERE s.enabled AND s.queued_at IS NULL AND s.due_at <= now()
      AND NOT EXISTS (SELECT 1 FROM fleetpace_cooldown cd WHERE cd.platform = s.platform AND cd.until > now())
),
capped AS (
    SELECT d.*, LEAST(COALESCE(c.cap, $4), $1) AS pcap
    FROM due d
    LEFT JOIN unnest($2::text[], $3::int[]) AS c (platform, cap) ON c.platform = d.platform
    LEFT JOIN unnest($5::text[], $6::int[]) AS pk (platform, cap) ON pk.platform = d.platform
    LEFT JOIN unnest($7::text[], $8::text[], $9::int[]) AS kc (platform, key, cap)
           ON kc.platform = d.platform AND kc.key = d.key
    WHERE d.key = '' OR d.rk <= COALESCE(kc.cap, pk.cap, d.rk)
),
turns AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.platform ORDER BY c.rk, c.k, c.id) AS pos FROM capped c
),
sel AS (SELECT * FROM turns WHERE pos <= pcap),
places AS (
    SELECT platform, row_number() OVER (ORDER BY k, id) AS g,
           row_number() OVER (PARTITION BY platform ORDER BY k, id) AS i
    FROM sel
)
SELECT sel.id FROM places JOIN sel ON sel.platform = places.platform AND sel.pos = places.i
WHERE places.g <= $1
ORDER BY places.g`

// headsCheckSQL counts the keys whose row in fleetpace_platform_due does not
// hold their first due source (a key with due sources and no row counts;
// a key whose head expired is not checked: the next refresh recomputes
// it), and the platforms whose first key is not the one with the first
// head.
const headsCheckSQL = `
WITH truth AS (
    SELECT DISTINCT ON (s.platform, s.key) s.platform, s.key,
           COALESCE(s.last_checked_at, '-infinity'::timestamptz) AS k, s.id
    FROM fleetpace_source s
    WHERE s.enabled AND s.queued_at IS NULL AND s.due_at <= now()
    ORDER BY s.platform, s.key, 3, s.id
)
SELECT (SELECT count(*) FROM truth t FULL JOIN fleetpace_platform_due d ON d.platform = t.platform AND d.key = t.key
        WHERE (d.valid_until IS NULL OR d.valid_until > now())
          AND (t.id IS DISTINCT FROM d.head_id OR t.k IS DISTINCT FROM d.head_key)),
       (SELECT count(*) FROM (
            SELECT d.first, d.head_id IS NOT NULL AND row_number() OVER (
                       PARTITION BY d.platform ORDER BY d.head_id IS NULL, d.head_key, d.head_id) = 1 AS least
            FROM fleetpace_platform_due d) x
        WHERE x.first <> x.least)`

// keyOf is the key of a source of the random walk, from the number of its
// platform (i) and its own (g): platforms 0–9 mix four keys and none,
// 10–19 have 23 keys each, the rest none.
const keyOf = `CASE WHEN {i} < 10 THEN (ARRAY['', 'a', 'b', 'c', 'd'])[1 + ({g}) % 5]
                    WHEN {i} < 20 THEN 'k' || (({g}) % 23)
                    ELSE '' END`

func keyOfSQL(i, g string) string {
	return strings.NewReplacer("{i}", i, "{g}", g).Replace(keyOf)
}

// The due query keeps exact fair order, turns across keys and caps (of
// platforms and of keys) while sources change under it in every way the
// store changes them — ticks (with per-key rates and keys' own rates in the
// database), checks of every outcome, releases, new and removed sources,
// sources moving to another key, cooldowns — and while sources fall due as
// time passes (some before their key's head): a random walk, compared after
// every step with the obvious query on the same snapshot. Platforms 0–9
// mix a few keys and none, and one of them has a key with a backlog of old
// sources; 10–19 have many keys; the rest none.
func TestDueMatchesOracleUnderChanges(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rng := rand.New(rand.NewPCG(15, 4))
	const platforms = 40
	for i := range platforms {
		f.platform(t, fmt.Sprintf("p%02d", i), float64(1+i%5))
	}
	// Sources: a quarter never checked, the rest checked up to 3 h ago with
	// intervals of 10 min to 4 h, so due and not-due interleave in fair
	// order; a few fall due within the next second.
	f.exec(t, `
INSERT INTO fleetpace_source (platform, key, url, check_interval, last_checked_at, due_at)
SELECT format('p%s', lpad((g % 40)::text, 2, '0')), `+keyOfSQL("g % 40", "g / 40")+`, 'https://x.example/' || g, iv, lc,
       CASE WHEN g % 17 = 0 THEN clock_timestamp() + (g % 10) * interval '100 ms'
            ELSE COALESCE(lc + iv, now()) END
FROM generate_series(1, 1200) g,
     LATERAL (SELECT (ARRAY[interval '10 min', interval '1 hour', interval '4 hours'])[1 + (g * 7) % 3] AS iv) i,
     LATERAL (SELECT CASE WHEN g % 4 = 0 THEN NULL ELSE now() - (g % 180) * interval '1 min' END AS lc) l`)
	// The backlog: a key of p03 whose 300 sources are all older than the rest.
	f.exec(t, `
INSERT INTO fleetpace_source (platform, key, url, last_checked_at, due_at)
SELECT 'p03', 'hog', 'https://hog.example/' || g, now() - interval '10 hours' + g * interval '1 second', now() - interval '1 second'
FROM generate_series(1, 300) g`)
	// Per-key rates for the ticks: 0.1–0.3/s (3–9 a key in a 30-s look-ahead)
	// on p00–p04 and p10–p12, and some keys' own.
	f.exec(t, `UPDATE fleetpace_platform SET key_rate = 0.1 * (1 + (substr(name, 2)::int % 3))
		WHERE substr(name, 2)::int IN (0, 1, 2, 3, 4, 10, 11, 12)`)
	f.exec(t, `INSERT INTO fleetpace_key_limit (platform, key, rate) VALUES
		('p03', 'hog', 0.5), ('p05', 'a', 0.1), ('p13', 'k4', 0.2), ('p01', 'b', NULL)`)
	// The keys there are, for the caps of single keys.
	rows, err := f.pool.Query(f.ctx, `SELECT DISTINCT platform, key FROM fleetpace_source WHERE key <> '' ORDER BY 1, 2`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowToStructByPos[scan.KeyRef])
	if err != nil {
		t.Fatal(err)
	}
	outcomes := []string{"ok", "not_modified", "failed", "rate_limited", "rate_pressure"}
	compared, nonEmpty, turns := 0, 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for step := 0; step < 150 && time.Now().Before(deadline); step++ {
		switch op := rng.IntN(10); op {
		case 0, 1: // a tick
			if _, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{Limit: 1 + rng.IntN(60), PerPlatformCap: 1 + rng.IntN(8)}); err != nil {
				t.Fatal(err)
			}
		case 2: // checks of queued sources, of every outcome
			queued := storetest.Column[int64](t, f.pool, `SELECT id FROM fleetpace_source WHERE queued_at IS NOT NULL ORDER BY random() LIMIT 30`)
			var recs []sources.CheckRecord
			for _, id := range queued {
				recs = append(recs, sources.CheckRecord{SourceID: id, Check: sources.Check{Outcome: outcomes[rng.IntN(len(outcomes))]}})
			}
			if err := sources.RecordChecks(f.ctx, f.pool, recs); err != nil {
				t.Fatal(err)
			}
		case 3: // releases
			f.exec(t, `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL
				WHERE id IN (SELECT id FROM fleetpace_source WHERE queued_at IS NOT NULL ORDER BY random() LIMIT 5)`)
		case 4: // new sources, some never checked, some old and falling due soon
			f.exec(t, `INSERT INTO fleetpace_source (platform, key, url, last_checked_at, due_at)
				SELECT format('p%s', lpad(i::text, 2, '0')), `+keyOfSQL("i", "g + $1::int")+`,
				       'https://new.example/' || $1::int || '/' || g,
				       CASE WHEN g % 2 = 0 THEN now() - interval '5 hours' END,
				       clock_timestamp() + (g % 3) * interval '150 ms'
				FROM generate_series(1, 6) g, LATERAL (SELECT (random() * 39)::int + 0 * g AS i) p`, step)
		case 5: // removals and disabled sources
			f.exec(t, `DELETE FROM fleetpace_source WHERE id IN (SELECT id FROM fleetpace_source WHERE queued_at IS NULL ORDER BY random() LIMIT 3)`)
			f.exec(t, `UPDATE fleetpace_source SET enabled = NOT enabled WHERE id IN (SELECT id FROM fleetpace_source ORDER BY random() LIMIT 3)`)
		case 6: // sources pushed back or brought forward
			f.exec(t, `UPDATE fleetpace_source SET due_at = clock_timestamp() + (random() - 0.5) * interval '1 second'
				WHERE id IN (SELECT id FROM fleetpace_source ORDER BY random() LIMIT 8)`)
		case 7: // a cooldown begins or ends
			name := fmt.Sprintf("p%02d", rng.IntN(platforms))
			if rng.IntN(2) == 0 {
				if _, _, err := sources.SetCooldown(f.ctx, f.pool, name, time.Hour, "test", 1); err != nil {
					t.Fatal(err)
				}
			} else {
				f.exec(t, `DELETE FROM fleetpace_cooldown WHERE platform = $1`, name)
			}
		case 8: // sources move to another key of their platform (or none)
			f.exec(t, `UPDATE fleetpace_source SET key = (ARRAY['', 'a', 'b', 'hog', 'k1'])[1 + (random() * 4)::int]
				WHERE id IN (SELECT id FROM fleetpace_source WHERE platform < 'p20' ORDER BY random() LIMIT 4)`)
		case 9: // a key's own rate comes or goes
			k := keys[rng.IntN(len(keys))]
			if rng.IntN(2) == 0 {
				f.exec(t, `INSERT INTO fleetpace_key_limit (platform, key, rate) VALUES ($1, $2, $3)
					ON CONFLICT (platform, key) DO UPDATE SET rate = EXCLUDED.rate`, k.Platform, k.Key, 0.05*float64(1+rng.IntN(4)))
			} else {
				f.exec(t, `DELETE FROM fleetpace_key_limit WHERE platform = $1 AND key = $2`, k.Platform, k.Key)
			}
		}
		opts := scan.DueOptions{
			Limit: []int{1, 7, 25, 80, 400}[rng.IntN(5)], DefaultCap: 1 + rng.IntN(12), Caps: map[string]int{},
			KeyCap: map[string]int{}, KeyCaps: map[scan.KeyRef]int{},
		}
		for range rng.IntN(4) {
			opts.Caps[fmt.Sprintf("p%02d", rng.IntN(platforms))] = rng.IntN(30) - 3
		}
		for range rng.IntN(8) {
			opts.KeyCap[fmt.Sprintf("p%02d", rng.IntN(20))] = rng.IntN(5) - 1
		}
		for range rng.IntN(12) {
			opts.KeyCaps[keys[rng.IntN(len(keys))]] = rng.IntN(6) - 2
		}
		got, want := compareWithOracle(t, f, opts)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d, %+v:\ndue query %v\n   oracle %v", step, opts, got, want)
		}
		compared++
		if len(want) > 0 {
			nonEmpty++
		}
		if interleaved(t, f, got) {
			turns++
		}
	}
	t.Logf("compared %d steps, %d with due sources, %d where a platform gave sources of several keys", compared, nonEmpty, turns)
	if compared < 30 || nonEmpty < compared/2 || turns < compared/4 {
		t.Fatalf("compared %d steps (%d with due sources, %d where a platform gave sources of several keys): too few to mean anything",
			compared, nonEmpty, turns)
	}
}

// interleaved reports whether a platform gave sources of more than one key
// in ids (the due query's result).
func interleaved(t *testing.T, f *fixture, ids []int64) bool {
	t.Helper()
	var n int
	err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM (
		SELECT platform FROM fleetpace_source WHERE id = ANY($1) GROUP BY platform HAVING count(DISTINCT key) > 1) x`, ids).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// compareWithOracle runs the due query and the oracle in one transaction (one
// now()) and returns both lists of ids.
func compareWithOracle(t *testing.T, f *fixture, opts scan.DueOptions) (got, want []int64) {
	t.Helper()
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx) //nolint:errcheck // read only
	q, err := scan.PrepareDue(f.ctx, tx, opts)
	if err != nil {
		t.Fatal(err)
	}
	due, err := q.Run(f.ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	var (
		names, keyPlatforms, kp, kk []string
		caps, keyCaps, kc           []int32
	)
	for n, c := range opts.Caps {
		names, caps = append(names, n), append(caps, int32(c))
	}
	for n, c := range opts.KeyCap {
		keyPlatforms, keyCaps = append(keyPlatforms, n), append(keyCaps, int32(c))
	}
	for r, c := range opts.KeyCaps {
		kp, kk, kc = append(kp, r.Platform), append(kk, r.Key), append(kc, int32(c))
	}
	// The heads the due query refreshed are every key's first due source,
	// and each platform's first key is the one with the first head.
	var wrongHeads, wrongFirsts int
	if err := tx.QueryRow(f.ctx, headsCheckSQL).Scan(&wrongHeads, &wrongFirsts); err != nil {
		t.Fatal(err)
	}
	if wrongHeads != 0 || wrongFirsts != 0 {
		t.Fatalf("%d keys with a wrong head, %d platforms with a wrong first key", wrongHeads, wrongFirsts)
	}
	want = storetest.Column[int64](t, tx, oracleSQL, opts.Limit, names, caps, opts.DefaultCap, keyPlatforms, keyCaps, kp, kk, kc)
	return ids(due), want
}

// TestNoHeadForAKeyWithoutSources: a change logged for a key whose source
// left again unlogged (added not due yet, then deleted before a refresh)
// gives the key no row, and neither does a tick's own refresh: only keys
// with an enabled, unqueued source have one.
func TestNoHeadForAKeyWithoutSources(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	f.source(t, "p", "https://example.com/due", nil)
	f.exec(t, `INSERT INTO fleetpace_source (platform, key, url, due_at) VALUES ('p', 'gone', 'https://example.com/later', now() + interval '1 hour')`)
	f.exec(t, `DELETE FROM fleetpace_source WHERE key = 'gone'`)
	if _, err := scan.SelectDue(f.ctx, f.pool, scan.DueOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{})
	if err != nil || res.Enqueued != 1 {
		t.Fatalf("tick: %+v, %v", res, err)
	}
	rows, err := f.pool.Query(f.ctx, `SELECT key FROM fleetpace_platform_due ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("keys with a row: %q, want none (the due source is queued, the other one gone)", keys)
	}
}
