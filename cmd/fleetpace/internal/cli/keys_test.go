package cli_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/sources"
)

// Nested limits from the command line: a platform's per-key and in-flight
// settings, sources with keys (added, listed by key, shown), a key's own
// limits set in part, listed a page at a time and removed.
func TestKeysCommands(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	out := func(args ...string) string { t.Helper(); return dbq(t, url, args...).stdout }

	if got := out("platforms", "set", "api", "--rate", "100", "--key-rate", "2", "--key-burst", "3", "--max-in-flight", "10", "--key-max-in-flight", "2"); !strings.Contains(got, "per key 2/s burst 3, at most 10 in flight, at most 2 in flight per key") {
		t.Errorf("platforms set: %s", got)
	}
	var ps []sources.Platform
	if err := json.Unmarshal([]byte(out("platforms", "list", "--json")), &ps); err != nil || len(ps) != 1 ||
		ps[0].KeyRate != 2 || ps[0].KeyBurst != 3 || ps[0].MaxInFlight != 10 || ps[0].KeyMaxInFlight != 2 {
		t.Fatalf("platforms list --json: %+v %v", ps, err)
	}
	if got := out("platforms", "set", "api", "--key-rate", "0"); strings.Contains(got, "per key 2/s") || !strings.Contains(got, "at most 10 in flight") {
		t.Errorf("platforms set --key-rate 0 (only that changes): %s", got)
	}

	out("sources", "add", "--platform", "api", "--url", "https://a.example/1", "--key", "acct-1")
	out("sources", "add", "--platform", "api", "--url", "https://a.example/2", "--key", "evil\u202etxt.exe")
	out("sources", "add", "--platform", "api", "--url", "https://a.example/3")
	if got := out("sources", "list", "--key", "acct-1"); !strings.Contains(got, "a.example/1") || strings.Contains(got, "a.example/2") || strings.Contains(got, "a.example/3") {
		t.Errorf("sources list --key acct-1:\n%s", got)
	}
	if got := out("sources", "list", "--key", ""); !strings.Contains(got, "a.example/3") || strings.Contains(got, "a.example/1") {
		t.Errorf("sources list --key '':\n%s", got)
	}
	if got := out("sources", "show", "https://a.example/1"); !regexp.MustCompile(`(?m)^key +acct-1$`).MatchString(got) {
		t.Errorf("sources show: no key\n%s", got)
	}
	// A key with a bidirectional override is shown escaped, never raw.
	if got := out("sources", "show", "https://a.example/2"); strings.Contains(got, "\u202e") || !strings.Contains(got, `"evil\u202etxt.exe"`) {
		t.Errorf("sources show of a key with an override:\n%s", got)
	}

	if got := out("keys", "set", "api", "acct-1", "--rate", "5"); !strings.Contains(got, "own limits set: rate 5/s, burst the platform's") {
		t.Errorf("keys set --rate: %s", got)
	}
	if got := out("keys", "set", "api", "acct-1", "--burst", "4"); !strings.Contains(got, "own limits updated: rate 5/s, burst 4") {
		t.Errorf("keys set --burst: %s", got)
	}
	out("keys", "set", "api", "acct-2", "--max-in-flight", "1")
	out("keys", "set", "api", "acct-3", "--rate", "0.5")
	var page sources.KeyPage
	if err := json.Unmarshal([]byte(out("keys", "list", "api", "--json", "--limit", "2")), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Keys) != 2 || page.Next != "acct-2" || page.Keys[0].Key != "acct-1" || page.Keys[0].Rate != 5 || page.Keys[0].Burst != 4 ||
		page.Keys[0].MaxInFlight != 2 || page.Keys[0].Own == nil || page.Keys[1].MaxInFlight != 1 || page.Keys[1].Rate != 100 {
		t.Errorf("keys list --limit 2: %+v", page)
	}
	if got := out("keys", "list", "api", "--limit", "2"); !strings.Contains(got, `more: --after "acct-2"`) {
		t.Errorf("keys list, first page:\n%s", got)
	}
	if got := out("keys", "list", "api", "--after", "acct-2"); !strings.Contains(got, "acct-3") || strings.Contains(got, "acct-1") || strings.Contains(got, "more:") {
		t.Errorf("keys list --after acct-2:\n%s", got)
	}
	out("keys", "delete", "api", "acct-1")
	if got := out("keys", "list", "api"); strings.Contains(got, "acct-1") || !strings.Contains(got, "acct-2") {
		t.Errorf("keys list after delete:\n%s", got)
	}
}
