package scan

import (
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// TestFairPlaceRoundTrip: a fair key read as an integer goes back to the
// same timestamptz (walks start exactly where the last row read was),
// before 2000 and at the infinities too, and integers order as the
// timestamps do.
func TestFairPlaceRoundTrip(t *testing.T) {
	ts := func(s string) pgtype.Timestamptz {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return pgtype.Timestamptz{Time: v, Valid: true}
	}
	ordered := []pgtype.Timestamptz{
		{InfinityModifier: pgtype.NegativeInfinity, Valid: true},
		ts("0001-01-01T00:00:00Z"),
		ts("1999-12-31T23:59:59.999999Z"),
		ts("2000-01-01T00:00:00Z"),
		ts("2000-01-01T00:00:00.000001Z"),
		ts("2026-12-02T04:05:06.123456+02:00"),
		ts("9999-12-31T23:59:59.999999Z"),
		{InfinityModifier: pgtype.Infinity, Valid: true},
	}
	for i, v := range ordered {
		k := fairOf(v)
		back := k.timestamptz()
		if back.InfinityModifier != v.InfinityModifier || !back.Time.Equal(v.Time) || fairOf(back) != k {
			t.Errorf("%v: %d gives back %v", v, k, back)
		}
		if i > 0 && fairOf(ordered[i-1]) >= k {
			t.Errorf("%v (%d) does not come after %v (%d)", v, k, ordered[i-1], fairOf(ordered[i-1]))
		}
	}
	if fairOf(ordered[0]) != math.MinInt64 || fairOf(ordered[len(ordered)-1]) != math.MaxInt64 {
		t.Error("infinities are not the least and the greatest")
	}
}
