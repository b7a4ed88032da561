package dashboard_test

import (
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/sources"
)

// A platform's page lists its keys — in use or with limits of their own —
// a page at a time, with each key's limits in force, hold, slowing and open
// requests; a key is isolated (bdi) and escaped, and a bad cursor is a 400.
func TestPlatformKeys(t *testing.T) {
	t.Parallel()
	pool := storetest.Pool(t, sources.Platform{Name: "api", RatePerSec: 100, KeyRate: 2, KeyBurst: 3, MaxInFlight: 20, KeyMaxInFlight: 4})
	// Four keys in use (pace rows as the pacer makes them), one held with
	// two open requests, one slowed; a fifth key has limits of its own only.
	exec(t, pool, `INSERT INTO fleetpace_pace (platform, key, rate, burst, max_in_flight, cursor_at, last_interval, hold_until, hold_reason, leases)
	    SELECT 'api', k, 2, 3, 4, date_part('epoch', now()), CASE k WHEN 'b-slow' THEN 2 ELSE 0.5 END,
	           CASE k WHEN 'a-held' THEN date_part('epoch', now()) + 90 ELSE 0 END, CASE k WHEN 'a-held' THEN 'Retry-After' ELSE '' END,
	           CASE k WHEN 'a-held' THEN ARRAY[date_part('epoch', now()) + 30, date_part('epoch', now()) + 31] ELSE '{}' END
	    FROM unnest(ARRAY['a-held', 'b-slow', 'c-<b>x</b>', 'd-quiet']) AS k`)
	rate := 0.5
	if _, _, err := sources.SetKeyLimit(t.Context(), pool, "api", "e-own", sources.KeyLimitUpdate{Rate: &rate}); err != nil {
		t.Fatal(err)
	}
	s := newSite(t, pool, dashboard.Config{PageSize: 3})
	status, page := s.get("/platforms/api")
	if status != http.StatusOK {
		t.Fatalf("platform page: %d\n%s", status, page)
	}
	txt := text(page)
	for _, w := range []string{"per key 2/s, burst 3", "at most 20 fleet-wide", "open requests per key at most 4"} {
		if !strings.Contains(txt, w) {
			t.Errorf("settings lack %q:\n%s", w, txt)
		}
	}
	keys := regexp.MustCompile(`(?s)id="keys".*?</section>`).FindString(page)
	if n := strings.Count(keys, "<tr><td class=\"key\">"); n != 3 {
		t.Fatalf("first page of keys has %d rows, want 3:\n%s", n, keys)
	}
	ktxt := text(keys)
	for _, w := range []string{"a-held", "1m30s", "Retry-After", "b-slow", "to 0.5/s", "c-<b>x</b>"} {
		if !strings.Contains(ktxt, w) {
			t.Errorf("keys lack %q:\n%s", w, ktxt)
		}
	}
	if strings.Contains(keys, "<b>x</b>") || !strings.Contains(keys, "<bdi>c-&lt;b&gt;x&lt;/b&gt;</bdi>") {
		t.Errorf("a key is not escaped and isolated:\n%s", keys)
	}
	if !regexp.MustCompile(`a-held</bdi></td>[^\n]*<td class="num">2</td></tr>`).MatchString(keys) {
		t.Errorf("a-held's open requests are not 2:\n%s", keys)
	}
	next := regexp.MustCompile(`class="next" href="([^"]+)"`).FindStringSubmatch(keys)
	if next == nil {
		t.Fatalf("no next page of keys")
	}
	_, page2 := s.get(html.UnescapeString(next[1]))
	keys2 := text(regexp.MustCompile(`(?s)id="keys".*?</section>`).FindString(page2))
	if !strings.Contains(keys2, "d-quiet") || !strings.Contains(keys2, "e-own (own limits)") || !strings.Contains(keys2, "idle") ||
		strings.Contains(keys2, "a-held") || strings.Contains(keys2, "next page") {
		t.Errorf("second page of keys:\n%s", keys2)
	}
	if status, _ := s.get("/platforms/api?keys_after=%00"); status != http.StatusBadRequest {
		t.Errorf("bad keys cursor: %d, want 400", status)
	}
}
