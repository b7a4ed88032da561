package scan_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
)

// oracleSQL is fair order with per-platform caps written the obvious way: a
// window over every due source. The due query must return exactly this.
// $1 the limit, $2/$3 platforms and caps (a platform missing gets $4).
const oracleSQL = `
SELECT id FROM (
    SELECT s.id, COALESCE(s.last_checked_at, '-infinity'::timestamptz) AS k,
           row_number() OVER (PARTITION BY s.platform ORDER BY COALESCE(s.last_checked_at, '-infinity'::timestamptz), s.id) AS rn,
           COALESCE(c.cap, $4) AS cap
    FROM fleetpace_source s
    LEFT JOIN unnest($2::text[], $3::int[]) AS c (platform, cap) ON c.platform = s.platform
    WHERE ` + sources.DueSQL + ` AND NOT ` + "EXISTS (SELECT 1 FROM fleetpace_cooldown cd WHERE cd.platform = s.platform AND cd.until > now())" + `
) x
WHERE rn <= LEAST(cap, $1)
ORDER BY k, id
LIMIT $1`

// The due query keeps exact fair order and caps while sources change under
// it in every way the store changes them — ticks, checks of every outcome,
// releases, new and removed sources, cooldowns — and while sources fall due
// as time passes (some before their platform's head): a random walk,
// compared after every step with the obvious query on the same snapshot.
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
INSERT INTO fleetpace_source (platform, url, check_interval, last_checked_at, due_at)
SELECT format('p%s', lpad((g % 40)::text, 2, '0')), 'https://x.example/' || g, iv, lc,
       CASE WHEN g % 17 = 0 THEN clock_timestamp() + (g % 10) * interval '100 ms'
            ELSE COALESCE(lc + iv, now()) END
FROM generate_series(1, 1200) g,
     LATERAL (SELECT (ARRAY[interval '10 min', interval '1 hour', interval '4 hours'])[1 + (g * 7) % 3] AS iv) i,
     LATERAL (SELECT CASE WHEN g % 4 = 0 THEN NULL ELSE now() - (g % 180) * interval '1 min' END AS lc) l`)
	outcomes := []string{"ok", "not_modified", "failed", "rate_limited", "rate_pressure"}
	compared, nonEmpty := 0, 0
	deadline := time.Now().Add(20 * time.Second)
	for step := 0; step < 120 && time.Now().Before(deadline); step++ {
		switch op := rng.IntN(8); op {
		case 0, 1: // a tick
			if _, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{Limit: 1 + rng.IntN(60), PerPlatformCap: 1 + rng.IntN(8)}); err != nil {
				t.Fatal(err)
			}
		case 2: // checks of queued sources, of every outcome
			var queued []int64
			rows, _ := f.pool.Query(f.ctx, `SELECT id FROM fleetpace_source WHERE queued_at IS NOT NULL ORDER BY random() LIMIT 30`)
			queued, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				t.Fatal(err)
			}
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
			f.exec(t, `INSERT INTO fleetpace_source (platform, url, last_checked_at, due_at)
				SELECT format('p%s', lpad((random() * 39)::int::text, 2, '0')), 'https://new.example/' || $1::int || '/' || g,
				       CASE WHEN g % 2 = 0 THEN now() - interval '5 hours' END,
				       clock_timestamp() + (g % 3) * interval '150 ms'
				FROM generate_series(1, 6) g`, step)
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
		}
		opts := scan.DueOptions{Limit: []int{1, 7, 25, 80, 400}[rng.IntN(5)], DefaultCap: 1 + rng.IntN(12), Caps: map[string]int{}}
		for range rng.IntN(4) {
			opts.Caps[fmt.Sprintf("p%02d", rng.IntN(platforms))] = rng.IntN(30) - 3
		}
		got, want := compareWithOracle(t, f, opts)
		if !slices.Equal(got, want) {
			t.Fatalf("step %d, %+v:\ndue query %v\n   oracle %v", step, opts, got, want)
		}
		compared++
		if len(want) > 0 {
			nonEmpty++
		}
	}
	if compared < 30 || nonEmpty < compared/2 {
		t.Fatalf("compared %d steps (%d with due sources): too few to mean anything", compared, nonEmpty)
	}
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
	var names []string
	var caps []int32
	for n, c := range opts.Caps {
		names, caps = append(names, n), append(caps, int32(c))
	}
	rows, err := tx.Query(f.ctx, oracleSQL, opts.Limit, names, caps, opts.DefaultCap)
	if err != nil {
		t.Fatal(err)
	}
	want, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids(due), want
}
