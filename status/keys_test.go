package status_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
	"github.com/fleetpace/fleetpace/worker"
)

// A platform's keys reach the status report and /metrics in aggregate —
// keys in use, held, slowed, open requests — with only its top keys under
// pressure named (bounded: at most the cache's TopKeys per platform); a
// platform without keys or caps has none.
func TestReadKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.PoolOf(t, url)
	for _, p := range []sources.Platform{
		{Name: "api", RatePerSec: 100, KeyRate: 2, KeyMaxInFlight: 3},
		{Name: "plain", RatePerSec: 5},
	} {
		if _, err := sources.SetPlatform(ctx, pool, p); err != nil {
			t.Fatal(err)
		}
	}
	pc, err := pacer.New(ctx, pacer.Config{DatabaseURL: url, MaxBlock: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	for i := range 40 {
		if res, err := pc.ReserveKey(ctx, "api", fmt.Sprintf("acct-%02d", i), time.Minute); err != nil || !res.Granted {
			t.Fatalf("reserve: %+v %v", res, err)
		}
	}
	// Two keys held by their destination, one slowed to a quarter.
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET hold_until = date_part('epoch', clock_timestamp()) + 60 * (key = 'acct-07')::int + 30
	    WHERE platform = 'api' AND key IN ('acct-07', 'acct-08')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET last_interval = 2 WHERE platform = 'api' AND key = 'acct-09'`); err != nil {
		t.Fatal(err)
	}

	rep, err := status.ReadTop(ctx, pool, 5)
	if err != nil {
		t.Fatal(err)
	}
	var api, plain status.Platform
	for _, p := range rep.Platforms {
		switch p.Name {
		case "api":
			api = p
		case "plain":
			plain = p
		}
	}
	k := api.Keys
	if k == nil || k.InUse != 40 || k.Held != 2 || k.Slowed != 1 || k.InFlight != 40 || len(k.Top) != 5 {
		t.Fatalf("api's keys: %+v, want 40 in use, 2 held, 1 slowed, 40 open, top 5", k)
	}
	if k.Top[0].Key != "acct-07" || k.Top[1].Key != "acct-08" || k.Top[2].Key != "acct-09" || !k.Top[2].Slowed || k.Top[2].EffectiveRate != 0.5 {
		t.Errorf("top keys: %+v, want the longest hold first, then the other, then the slowed key", k.Top)
	}
	if plain.Keys != nil {
		t.Errorf("plain has keys: %+v", plain.Keys)
	}
	b, err := json.Marshal(api)
	if err != nil {
		t.Fatal(err)
	}
	var back status.Platform
	if err := json.Unmarshal(b, &back); err != nil || back.Keys == nil || back.Keys.InUse != 40 || back.Keys.Top[0].Hold < 80*time.Second {
		t.Errorf("JSON round trip: %s\n%+v %v", b, back.Keys, err)
	}

	// /metrics: the aggregates per platform, and the top keys only.
	cache := status.NewCache(pool, time.Minute, nil)
	cache.TopKeys = 2
	m := worker.NewMetrics(cache, nil, nil, nil)
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			labels := ""
			for _, l := range mt.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + " "
			}
			got[f.GetName()] += fmt.Sprintf("%s%g; ", labels, mt.GetGauge().GetValue())
		}
	}
	for name, want := range map[string]string{
		"fleetpace_keys_in_use":    "platform=api 40; ",
		"fleetpace_keys_held":      "platform=api 2; ",
		"fleetpace_keys_slowed":    "platform=api 1; ",
		"fleetpace_keys_in_flight": "platform=api 40; ",
		"fleetpace_key_in_flight":  "key=acct-07 platform=api 1; key=acct-08 platform=api 1; ",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}
	if got["fleetpace_key_effective_rate"] == "" || got["fleetpace_key_hold_remaining_seconds"] == "" {
		t.Errorf("no per-key series: %v", got)
	}
}
