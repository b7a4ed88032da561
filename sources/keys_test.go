package sources_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

// A source's key is stored by AddSource and by both import formats, read
// back by GetSource and ListSources, and selects sources in a list. A bad
// key is refused with a FieldError on key, on the line it is on, and an
// import with one writes nothing.
func TestSourceKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := storetest.Pool(t, sources.Platform{Name: "api", RatePerSec: 10})
	id := storetest.Source(t, pool, sources.NewSource{Platform: "api", URL: "https://a.example/1", Key: "acct-1"})
	if s, err := sources.GetSource(ctx, pool, id); err != nil || s.Key != "acct-1" {
		t.Fatalf("GetSource: key %q %v, want acct-1", s.Key, err)
	}
	csv := "platform,url,key\napi,https://a.example/2,acct-2\napi,https://a.example/3,\"a key, with a comma\"\napi,https://a.example/4,\n"
	if res, err := sourcefile.Import(ctx, pool, strings.NewReader(csv), sourcefile.Options{}); err != nil || res.Added != 3 {
		t.Fatalf("CSV import: %+v %v", res, err)
	}
	jsonl := `{"platform":"api","url":"https://a.example/5","key":"acct-2"}` + "\n" + `{"platform":"api","url":"https://a.example/6","key":"ключ ✓"}` + "\n"
	if res, err := sourcefile.Import(ctx, pool, strings.NewReader(jsonl), sourcefile.Options{}); err != nil || res.Added != 2 {
		t.Fatalf("JSON lines import: %+v %v", res, err)
	}
	keysOf := func(key *string) string {
		t.Helper()
		list, err := sources.ListSources(ctx, pool, sources.ListFilter{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list {
			out = append(out, fmt.Sprintf("%s=%s", strings.TrimPrefix(s.URL, "https://a.example/"), s.Key))
		}
		return strings.Join(out, " ")
	}
	str := func(s string) *string { return &s }
	if got := keysOf(nil); got != "1=acct-1 2=acct-2 3=a key, with a comma 4= 5=acct-2 6=ключ ✓" {
		t.Errorf("every source: %s", got)
	}
	if got := keysOf(str("acct-2")); got != "2=acct-2 5=acct-2" {
		t.Errorf("--key acct-2: %s", got)
	}
	if got := keysOf(str("")); got != "4=" {
		t.Errorf("sources without a key: %s", got)
	}

	before := keysOf(nil)
	for name, input := range map[string]string{ // the bad key is on line 3 of the CSV (after the header), line 2 of the JSON
		"csv key over 200 bytes": "platform,url,key\napi,https://b.example/1,k\napi,https://b.example/2," + strings.Repeat("k", 201) + "\n",
		"csv key not UTF-8":      "platform,url,key\napi,https://b.example/1,k\napi,https://b.example/2,bad\xff\n",
		"json key with NUL":      `{"platform":"api","url":"https://b.example/1"}` + "\n" + `{"platform":"api","url":"https://b.example/2","key":"a\u0000b"}` + "\n",
		"json key not a string":  `{"platform":"api","url":"https://b.example/1"}` + "\n" + `{"platform":"api","url":"https://b.example/2","key":7}` + "\n",
	} {
		want := 2
		if strings.HasPrefix(name, "csv") {
			want = 3
		}
		_, err := sourcefile.Import(ctx, pool, strings.NewReader(input), sourcefile.Options{})
		var ie *sourcefile.Error
		var fe *sources.FieldError
		if !errors.As(err, &ie) || len(ie.Lines) != 1 || ie.Lines[0].Line != want || !errors.As(ie.Lines[0].Err, &fe) || fe.Field != "key" {
			t.Errorf("%s: %v, want line %d refused on key", name, err, want)
		}
	}
	for _, bad := range []string{strings.Repeat("é", 101), "nul\x00", "\xc3"} {
		_, _, err := sources.AddSource(ctx, pool, sources.NewSource{Platform: "api", URL: "https://c.example/", Key: bad})
		var fe *sources.FieldError
		if !errors.As(err, &fe) || fe.Field != "key" || !errors.Is(err, sources.ErrInvalid) {
			t.Errorf("AddSource with key %q: %v, want a FieldError on key", bad, err)
		}
	}
	if after := keysOf(nil); after != before {
		t.Errorf("refused input wrote: %s", after)
	}
}

// A platform's per-key settings and caps are stored and read back; a key's
// own limits are set in part, listed with what is in force for the key and
// removed; the list pages through keys in use and keys with limits, with
// each key's hold, pace and open requests; KeyStats sums them per platform
// and names the top keys under pressure, no more than asked.
func TestKeyLimitsAndStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.PoolOf(t, url)
	saved, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: "api", RatePerSec: 100, KeyRate: 2, KeyBurst: 3, MaxInFlight: 50, KeyMaxInFlight: 4})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := sources.GetPlatform(ctx, pool, "api"); err != nil || p != saved || p.KeyRate != 2 || p.KeyBurst != 3 || p.MaxInFlight != 50 || p.KeyMaxInFlight != 4 {
		t.Fatalf("GetPlatform: %+v %v, want %+v", p, err, saved)
	}
	// A partial update keeps the nested settings it does not name.
	one := 1
	if p, _, err := sources.ConfigurePlatform(ctx, pool, "api", sources.PlatformUpdate{KeyMaxInFlight: &one}); err != nil || p.KeyRate != 2 || p.KeyMaxInFlight != 1 || p.MaxInFlight != 50 {
		t.Fatalf("partial update: %+v %v", p, err)
	}
	four := 4
	if _, _, err := sources.ConfigurePlatform(ctx, pool, "api", sources.PlatformUpdate{KeyMaxInFlight: &four}); err != nil {
		t.Fatal(err)
	}

	rate, burst := 5.0, 2
	l, created, err := sources.SetKeyLimit(ctx, pool, "api", "vip", sources.KeyLimitUpdate{Rate: &rate})
	if err != nil || !created || *l.Rate != 5 || l.Burst != nil || l.MaxInFlight != nil {
		t.Fatalf("SetKeyLimit rate: %+v %v %v", l, created, err)
	}
	l, created, err = sources.SetKeyLimit(ctx, pool, "api", "vip", sources.KeyLimitUpdate{Burst: &burst})
	if err != nil || created || *l.Rate != 5 || *l.Burst != 2 {
		t.Fatalf("SetKeyLimit burst keeps the rate: %+v %v %v", l, created, err)
	}
	if _, _, err := sources.SetKeyLimit(ctx, pool, "nope", "vip", sources.KeyLimitUpdate{Rate: &rate}); !errors.Is(err, sources.ErrUnknownPlatform) {
		t.Errorf("SetKeyLimit on an unknown platform: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("k", 201), "a\x00"} {
		var fe *sources.FieldError
		if _, _, err := sources.SetKeyLimit(ctx, pool, "api", bad, sources.KeyLimitUpdate{Rate: &rate}); !errors.As(err, &fe) || fe.Field != "key" {
			t.Errorf("SetKeyLimit key %q: %v", bad, err)
		}
	}
	if _, _, err := sources.SetKeyLimit(ctx, pool, "api", "vip", sources.KeyLimitUpdate{}); !errors.Is(err, sources.ErrInvalid) {
		t.Errorf("SetKeyLimit with nothing to set: %v", err)
	}

	// Keys in use: 25 keys reserved through a real pacer, each holding one
	// open request (the per-key cap is 4).
	p, err := pacer.New(ctx, pacer.Config{DatabaseURL: url, MaxBlock: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 25 {
		res, err := p.ReserveKey(ctx, "api", fmt.Sprintf("k%02d", i), time.Minute)
		if err != nil || !res.Granted {
			t.Fatalf("reserve k%02d: %+v %v", i, res, err)
		}
	}
	// k03 is held by its destination for 30 s (a 429 with Retry-After for
	// it, as the pacer writes it).
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET hold_until = date_part('epoch', clock_timestamp()) + 30, hold_reason = 'Retry-After'
	    WHERE platform = 'api' AND key = 'k03'`); err != nil {
		t.Fatal(err)
	}
	var all []sources.KeyState
	after := ""
	pages := 0
	for {
		page, err := sources.ListKeys(ctx, pool, "api", sources.KeyListOptions{After: after, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		all = append(all, page.Keys...)
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if pages != 3 || len(all) != 26 {
		t.Fatalf("%d pages, %d keys; want 3 pages of 25 keys in use and vip", pages, len(all))
	}
	byKey := map[string]sources.KeyState{}
	for _, k := range all {
		byKey[k.Key] = k
	}
	if k := byKey["k00"]; !k.InUse || k.Rate != 2 || k.Burst != 3 || k.MaxInFlight != 4 || k.InFlight != 1 || k.Own != nil || k.Hold != 0 || k.Slowed {
		t.Errorf("k00: %+v", k)
	}
	if k := byKey["k03"]; k.Hold < 25*time.Second || k.HoldReason != "Retry-After" {
		t.Errorf("k03: %+v, want held 30 s", k)
	}
	if k := byKey["vip"]; k.InUse || k.Rate != 5 || k.Burst != 2 || k.MaxInFlight != 4 || k.Own == nil || *k.Own.Rate != 5 {
		t.Errorf("vip: %+v, want its own rate and burst, not in use", k)
	}

	stats, err := sources.KeyStats(ctx, pool, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 {
		t.Fatalf("KeyStats: %+v", stats)
	}
	s := stats[0]
	if s.Platform != "api" || s.InUse != 25 || s.Held != 1 || s.InFlight != 25 || s.PlatformInFlight != 25 || len(s.Top) != 3 || s.Top[0].Key != "k03" {
		t.Errorf("KeyStats: %+v, want 25 in use, 1 held (first of the top 3), 25 open", s)
	}
	if stats, err := sources.KeyStats(ctx, pool, -1); err != nil || len(stats[0].Top) != 0 {
		t.Errorf("KeyStats without a top: %+v %v", stats, err)
	}

	// Removing vip's limits: it follows the platform's per-key settings.
	if err := sources.DeleteKeyLimit(ctx, pool, "api", "vip"); err != nil {
		t.Fatal(err)
	}
	if err := sources.DeleteKeyLimit(ctx, pool, "api", "vip"); !errors.Is(err, sources.ErrNotFound) {
		t.Errorf("deleting again: %v", err)
	}
	if err := sources.DeleteKeyLimit(ctx, pool, "nope", "vip"); !errors.Is(err, sources.ErrNotFound) {
		t.Errorf("deleting on an unknown platform: %v", err)
	}
	if _, err := sources.ListKeys(ctx, pool, "nope", sources.KeyListOptions{}); !errors.Is(err, sources.ErrNotFound) {
		t.Errorf("ListKeys of an unknown platform: %v", err)
	}
}
