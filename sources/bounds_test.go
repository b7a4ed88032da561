package sources_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/sources"
)

// boundProbe is one value of one setting, tried against Go's validation and
// against the schema's constraints directly (SQL that bypasses Go).
type boundProbe struct {
	name  string
	field string                   // FieldError.Field of Go's refusal
	set   func(*sources.Platform)  // for platform settings
	src   func(*sources.NewSource) // for source settings
	check func() error             // for anything else: Go's validation
	sql   string                   // UPDATE that sets the value on the probe's row
	arg   any
}

// The schema's CHECK constraints and Go's validation draw every bound at
// the same place: each limit, and the smallest step past it, is accepted or
// refused by both.
func TestSchemaAgreesWithBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	if _, err := pool.Exec(ctx, `INSERT INTO fleetpace_platform (name, rate_per_sec) VALUES ('probe', 1)`); err != nil {
		t.Fatal(err)
	}
	var srcID int64
	if err := pool.QueryRow(ctx, `INSERT INTO fleetpace_source (platform, url) VALUES ('probe', 'https://probe.example/') RETURNING id`).Scan(&srcID); err != nil {
		t.Fatal(err)
	}
	down := func(x float64) float64 { return math.Nextafter(x, math.Inf(-1)) }
	up := func(x float64) float64 { return math.Nextafter(x, math.Inf(1)) }
	const µs = time.Microsecond // the database's resolution for intervals
	var probes []boundProbe
	plat := func(field, column string, v any, set func(*sources.Platform)) {
		probes = append(probes, boundProbe{name: fmt.Sprintf("%s=%v", field, v), field: field, set: set,
			sql: `UPDATE fleetpace_platform SET ` + column + ` = $1 WHERE name = 'probe'`, arg: v})
	}
	for _, r := range []float64{sources.MinRate, down(sources.MinRate), sources.MaxRate, up(sources.MaxRate), math.NaN(), math.Inf(1), 0} {
		plat("rate_per_sec", "rate_per_sec", r, func(p *sources.Platform) { p.RatePerSec = r })
	}
	for _, b := range []int{1, 0, sources.MaxBurst, sources.MaxBurst + 1} {
		plat("burst", "burst", b, func(p *sources.Platform) { p.Burst = b })
	}
	for _, m := range []float64{1, down(1), sources.MaxMultiplierLimit, up(sources.MaxMultiplierLimit), math.NaN()} {
		plat("max_multiplier", "max_multiplier", m, func(p *sources.Platform) { p.MaxMultiplier = m })
	}
	for _, d := range []int{1, 0, sources.MaxDecayAfter, sources.MaxDecayAfter + 1} {
		plat("decay_after", "decay_after", d, func(p *sources.Platform) { p.DecayAfter = d })
	}
	for _, c := range []time.Duration{sources.MinCooldown, sources.MinCooldown - µs, sources.MaxCooldown, sources.MaxCooldown + µs} {
		plat("cooldown", "cooldown", c, func(p *sources.Platform) { p.Cooldown = c })
	}
	for _, f := range []float64{sources.MinFactor, down(sources.MinFactor), sources.MaxFactor, up(sources.MaxFactor)} {
		plat("backoff_factor", "backoff_factor", f, func(p *sources.Platform) { p.BackoffFactor = f })
		plat("recovery_factor", "recovery_factor", f, func(p *sources.Platform) { p.RecoveryFactor = f })
	}
	for _, r := range []float64{0, sources.MinRate, down(sources.MinRate), sources.MaxRate, up(sources.MaxRate), math.NaN(), math.Inf(1), -1} {
		plat("key_rate", "key_rate", r, func(p *sources.Platform) { p.KeyRate = r })
	}
	for _, b := range []int{1, 0, sources.MaxBurst, sources.MaxBurst + 1} {
		plat("key_burst", "key_burst", b, func(p *sources.Platform) { p.KeyBurst = b })
	}
	for _, n := range []int{0, -1, sources.MaxInFlight, sources.MaxInFlight + 1} {
		plat("max_in_flight", "max_in_flight", n, func(p *sources.Platform) { p.MaxInFlight = n })
		plat("key_max_in_flight", "key_max_in_flight", n, func(p *sources.Platform) { p.KeyMaxInFlight = n })
	}
	for _, k := range []string{"", strings.Repeat("k", sources.MaxKeyBytes), strings.Repeat("k", sources.MaxKeyBytes+1),
		strings.Repeat("é", sources.MaxKeyBytes/2), strings.Repeat("é", sources.MaxKeyBytes/2) + "k"} {
		probes = append(probes, boundProbe{name: fmt.Sprintf("key of %d bytes", len(k)), field: "key",
			src: func(s *sources.NewSource) { s.Key = k },
			sql: `UPDATE fleetpace_source SET key = $1 WHERE id = $2`, arg: k})
	}
	// A key's own limits (fleetpace_key_limit), each field on its own.
	keyLimit := func(field, column string, v any, u sources.KeyLimitUpdate) {
		probes = append(probes, boundProbe{name: fmt.Sprintf("key limit %s=%v", field, v), field: field,
			check: func() error { return u.Validate() },
			sql:   `INSERT INTO fleetpace_key_limit (platform, key, ` + column + `) VALUES ('probe', 'k', $1)`, arg: v})
	}
	for _, r := range []float64{sources.MinRate, down(sources.MinRate), sources.MaxRate, up(sources.MaxRate), math.NaN(), 0} {
		keyLimit("rate", "rate", r, sources.KeyLimitUpdate{Rate: &r})
	}
	for _, b := range []int{1, 0, sources.MaxBurst, sources.MaxBurst + 1} {
		keyLimit("burst", "burst", b, sources.KeyLimitUpdate{Burst: &b})
	}
	for _, n := range []int{0, -1, sources.MaxInFlight, sources.MaxInFlight + 1} {
		keyLimit("max_in_flight", "max_in_flight", n, sources.KeyLimitUpdate{MaxInFlight: &n})
	}
	for _, i := range []time.Duration{sources.MinInterval, sources.MinInterval - µs, sources.MaxInterval, sources.MaxInterval + µs} {
		probes = append(probes, boundProbe{name: fmt.Sprintf("interval=%s", i), field: "interval",
			src: func(s *sources.NewSource) { s.Interval = i },
			sql: `UPDATE fleetpace_source SET check_interval = $1 WHERE id = $2`, arg: i})
	}

	for _, p := range probes {
		var goErr error
		switch {
		case p.check != nil:
			goErr = p.check()
		case p.set != nil:
			pl := sources.Platform{Name: "probe", RatePerSec: 1}.WithDefaults()
			p.set(&pl)
			goErr = pl.Validate()
		default:
			s := sources.NewSource{Platform: "probe", URL: "https://probe.example/", Interval: time.Hour}
			p.src(&s)
			goErr = s.Validate()
		}
		var fe *sources.FieldError
		if goErr != nil && (!errors.As(goErr, &fe) || fe.Field != p.field) {
			t.Errorf("%s: Go refuses with %v, want a FieldError on %s", p.name, goErr, p.field)
		}
		args := []any{p.arg}
		if p.src != nil {
			args = append(args, srcID)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, dbErr := tx.Exec(ctx, p.sql, args...)
		_ = tx.Rollback(ctx)
		if (goErr == nil) != (dbErr == nil) {
			t.Errorf("%s: Go says %v, the schema says %v", p.name, goErr, dbErr)
		}
	}

	// The longest URL fits the unique index on (platform, url) with the
	// longest platform name, even incompressible; a little more than that
	// fails there with a raw error, which is what the Go limit prevents.
	long := strings.Repeat("p", 63)
	if _, err := pool.Exec(ctx, `INSERT INTO fleetpace_platform (name, rate_per_sec) VALUES ($1, 1)`, long); err != nil {
		t.Fatal(err)
	}
	noise := func(n int) string {
		const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~"
		r := rand.New(rand.NewPCG(1, 2))
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	maxURL := "https://probe.example/" + noise(sources.MaxURLBytes-len("https://probe.example/"))
	if err := sources.ValidateURL(maxURL); err != nil {
		t.Fatalf("a URL of MaxURLBytes: %v", err)
	}
	if _, _, err := sources.AddSource(ctx, pool, sources.NewSource{Platform: long, URL: maxURL, Interval: time.Hour}); err != nil {
		t.Fatalf("a URL of MaxURLBytes with the longest platform name: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO fleetpace_source (platform, url) VALUES ($1, $2)`, long, maxURL+noise(1500)); err == nil {
		t.Fatal("the index took a URL 1,500 bytes over the limit: MaxURLBytes could be larger")
	}
	if err := sources.ValidateURL(maxURL + "x"); err == nil {
		t.Fatal("ValidateURL took a URL over MaxURLBytes")
	}
}

// An installation from before the bounds: its looser checks are replaced
// once, rows outside the bounds are brought to the nearest one, and a
// second apply changes nothing.
func TestSchemaBoundsUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	// Looser constraints, as older schemas had, and rows only they allowed.
	exec(`ALTER TABLE fleetpace_platform
	    DROP CONSTRAINT fleetpace_platform_rate_bounds, DROP CONSTRAINT fleetpace_platform_burst_bounds,
	    DROP CONSTRAINT fleetpace_platform_max_multiplier_bounds, DROP CONSTRAINT fleetpace_platform_decay_after_bounds,
	    DROP CONSTRAINT fleetpace_platform_cooldown_bounds,
	    ADD CONSTRAINT fleetpace_platform_rate_check CHECK (rate_per_sec > 0 AND rate_per_sec < 'Infinity'::double precision),
	    ADD CONSTRAINT fleetpace_platform_burst_check CHECK (burst >= 1),
	    ADD CONSTRAINT fleetpace_platform_max_multiplier_check CHECK (max_multiplier >= 1 AND max_multiplier < 'Infinity'::double precision),
	    ADD CONSTRAINT fleetpace_platform_decay_after_check CHECK (decay_after >= 1),
	    ADD CONSTRAINT fleetpace_platform_cooldown_check CHECK (cooldown > interval '0')`)
	exec(`ALTER TABLE fleetpace_source DROP CONSTRAINT fleetpace_source_interval_bounds,
	    ADD CONSTRAINT fleetpace_source_interval_check CHECK (check_interval > interval '0')`)
	exec(`INSERT INTO fleetpace_platform (name, rate_per_sec, burst, max_multiplier, decay_after, cooldown)
	    VALUES ('tiny', 1e-300, 2147483647, 1e300, 2000000000, interval '1 microsecond'), ('fine', 7, 2, 16, 100, interval '15 minutes')`)
	exec(`INSERT INTO fleetpace_source (platform, url, check_interval) VALUES
	    ('tiny', 'https://a.example/1', interval '1 microsecond'), ('fine', 'https://a.example/2', interval '30 minutes'),
	    ('fine', 'https://a.example/3', interval '100 years')`)
	// An installation from before fleetpace_schema recorded a version.
	exec(`DROP TABLE fleetpace_schema`)

	apply := func() {
		t.Helper()
		if _, err := fleetpace.Apply(ctx, pool, nil); err != nil {
			t.Fatal(err)
		}
	}
	apply()
	ps, err := sources.ListPlatforms(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if err := p.Validate(); err != nil {
			t.Errorf("after the upgrade platform %s is out of bounds: %v", p.Name, err)
		}
	}
	if ps[0].Name != "fine" || ps[0].RatePerSec != 7 || ps[0].Burst != 2 || ps[0].Cooldown != 15*time.Minute ||
		ps[1].RatePerSec != sources.MinRate || ps[1].Burst != sources.MaxBurst || ps[1].MaxMultiplier != sources.MaxMultiplierLimit ||
		ps[1].DecayAfter != sources.MaxDecayAfter || ps[1].Cooldown != sources.MinCooldown {
		t.Errorf("after the upgrade: %+v; want fine unchanged and tiny at the nearest bounds", ps)
	}
	var paceRate float64
	if err := pool.QueryRow(ctx, `SELECT rate FROM fleetpace_pace WHERE platform = 'tiny'`).Scan(&paceRate); err != nil || paceRate != sources.MinRate {
		t.Errorf("pace row of tiny: rate %g %v; want the platform's new rate", paceRate, err)
	}
	rows, _ := pool.Query(ctx, `SELECT check_interval FROM fleetpace_source ORDER BY id`)
	intervals, err := pgx.CollectRows(rows, pgx.RowTo[time.Duration])
	if err != nil || fmt.Sprint(intervals) != fmt.Sprint([]time.Duration{sources.MinInterval, 30 * time.Minute, sources.MaxInterval}) {
		t.Errorf("intervals after the upgrade: %v %v", intervals, err)
	}
	constraints := func() string {
		t.Helper()
		var s string
		err := pool.QueryRow(ctx, `SELECT string_agg(conname, ' ' ORDER BY conname) FROM pg_constraint
		    WHERE conrelid IN ('fleetpace_platform'::regclass, 'fleetpace_source'::regclass) AND contype = 'c'`).Scan(&s)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := constraints()
	if strings.Contains(before, "rate_check") || strings.Contains(before, "interval_check") || !strings.Contains(before, "interval_bounds") {
		t.Fatalf("constraints after the upgrade: %s", before)
	}
	apply()
	if after := constraints(); after != before {
		t.Fatalf("a second apply changed the constraints:\n%s\n%s", before, after)
	}
}
