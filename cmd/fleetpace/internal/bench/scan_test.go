package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// TestScanBench runs the scan benchmark at a tiny size, keys on one
// platform of one and on the last of four: every measurement is there,
// the data set has the keys asked for and their heads, each due query says
// what it read, and the output carries the row counts, the load average
// and the JSON fields.
func TestScanBench(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	for _, c := range []struct {
		platforms, keyed, keys int
	}{{1, 0, 200}, {4, 1, 40}} {
		res, err := Scan(ctx, ScanConfig{
			Pool: pool, Sources: 6000, Platforms: []int{c.platforms}, Select: 50, Runs: 3,
			Keys: c.keys, KeyedPlatforms: c.keyed,
		})
		if err != nil {
			t.Fatal(err)
		}
		r := res.Sizes[0]
		keys := int64(c.keys + c.platforms - 1) // the keyed platform's, and key "" on each other
		if r.Platforms != c.platforms || r.KeyedPlatforms != 1 || r.Rows.Keys != keys || r.Rows.KeyHeads == 0 || r.Rows.KeyHeads > keys {
			t.Errorf("%d platforms, %d keys: result %+v", c.platforms, c.keys, r)
		}
		if r.DueP50 <= 0 || r.TickP50 <= 0 || r.TickEnqueued == 0 || len(r.DueStats) != 3 || r.DueStats[0].Statements < 3 || r.DueStats[0].Keys == 0 {
			t.Errorf("measurements %+v", r)
		}
		var back struct {
			Sizes []map[string]any `json:"sizes"`
		}
		text, js := written(t, res, &back)
		for _, want := range []string{"keys in turns", "load average", "key heads", "statements", "due query plans", "refresh:"} {
			if !strings.Contains(text, want) {
				t.Errorf("text lacks %q:\n%s", want, text)
			}
		}
		if len(back.Sizes) != 1 || back.Sizes[0]["rows"] == nil || back.Sizes[0]["due_stats"] == nil || back.Sizes[0]["load_average_start"] == nil {
			t.Errorf("json:\n%s", js)
		}
	}
	if err := (ScanConfig{Platforms: []int{2}, KeyedPlatforms: 3, Keys: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "bench.ScanConfig.KeyedPlatforms") {
		t.Errorf("Validate: %v", err)
	}
}
