package integration

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// A hostile destination, against one worker with the SSRF guard on:
// Retry-After overflowing, negative, fractional and in year 9999, validators
// that are not UTF-8, a 1-MiB header, and a redirect chain ending at the
// cloud metadata address. The worker does not panic; no hold or cooldown
// goes beyond the 24-h cap; every good source of the platform the
// validators and the redirect share is checked exactly once, its check
// recorded (one bad row once cost a whole group-commit batch its checks);
// the hostile sources are recorded — failed, or rate limited where the
// destination said so — with a reason, and none is fetched again before its
// interval (or its platform's cooldown).
//
// The destination runs on 127.0.0.1, which the guard refuses: the worker
// gets the hidden, test-only --test-guard-exempt for exactly the
// destination's address and port (fetch.HTTPConfig.GuardExempt). Every
// other address stays refused — 169.254.169.254 included.
func TestHostileDestination(t *testing.T) {
	t.Parallel()
	url := newURL(t)
	d := newDest(t, map[string]fakedest.Rule{
		"/h/etag":        {RawHeaders: map[string][]string{"ETag": {"\"\xff\xfe\""}}},
		"/h/lastmod":     {RawHeaders: map[string][]string{"Last-Modified": {"\xff\xfe, 01 Jan 2024"}}},
		"/h/bigheader":   {RawHeaders: map[string][]string{"X-Big": {strings.Repeat("a", 1<<20)}}},
		"/h/redirect/a":  {RedirectTo: "/h/redirect/b"},
		"/h/redirect/b":  {RedirectTo: "http://169.254.169.254/latest/meta-data/"},
		"/ra-overflow/":  {Status: 429, RawHeaders: map[string][]string{"Retry-After": {"99999999999999999999"}}},
		"/ra-date/":      {Status: 503, RawHeaders: map[string][]string{"Retry-After": {"Fri, 31 Dec 9999 23:59:59 GMT"}}},
		"/ra-negative/":  {Status: 429, RawHeaders: map[string][]string{"Retry-After": {"-5"}}},
		"/ra-fraction/":  {Status: 429, RawHeaders: map[string][]string{"Retry-After": {"1.5"}}},
		"/ra-exponent/":  {Status: 429, RawHeaders: map[string][]string{"Retry-After": {"1e400"}}},
		"/h/good/":       {},
		"/h/good-again/": {},
	})
	setPlatform(t, url, "h", "--rate", "20")
	good := []string{"/h/good/0", "/h/good/1", "/h/good/2", "/h/good/3", "/h/good-again/4"}
	hostile := []string{"/h/etag", "/h/lastmod", "/h/bigheader", "/h/redirect/a"}
	importSources(t, url, "h", d.URL(), append(append([]string(nil), good...), hostile...))
	// One platform each: a long Retry-After cools its platform down. The
	// invalid ones (negative, fractional, too large to parse) are pressure
	// without a hold; at --max-multiplier 1 the first is at the maximum, so
	// the platform is told to stop (rate limited) all the same.
	retryAfter := map[string][]string{
		"ra-overflow": nil, "ra-date": nil,
		"ra-negative": {"--max-multiplier", "1"}, "ra-fraction": {"--max-multiplier", "1"}, "ra-exponent": {"--max-multiplier", "1"},
	}
	for p, flags := range retryAfter {
		setPlatform(t, url, p, append([]string{"--rate", "5"}, flags...)...)
		importSources(t, url, p, d.URL(), []string{"/" + p + "/x"})
	}

	destAddr := strings.TrimPrefix(d.URL(), "http://")
	w := startProc(t, "hostile", "--database-url", url, "-q", "--connect-timeout", "1s",
		"worker", "--http-addr", "127.0.0.1:0", "--startup-jitter", "0", "--poll-base", "500ms", "--poll-max", "2s",
		"--heartbeat", "1s", "--user-agent", "hostile", "--test-guard-exempt", destAddr)
	select {
	case <-w.ready:
	case <-w.done:
		t.Fatalf("worker exited at start: %v\n%s", w.err, w.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("worker: no HTTP address within 30 s\n%s", w.log.String())
	}

	db := pool(t, url)
	ctx := context.Background()
	// Every source recorded (an outcome, no longer queued).
	deadline := time.Now().Add(90 * time.Second)
	for {
		var left int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM fleetpace_source WHERE last_outcome IS NULL OR queued_at IS NOT NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d source(s) still without a recorded check after 90 s:\n%+v", left, listSources(t, url))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Then three more scan ticks of the worker: nothing is queued or fetched
	// again.
	ticks := scanTicks(t, w)
	for deadline := time.Now().Add(60 * time.Second); scanTicks(t, w) < ticks+3; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 3 scan ticks in 60 s")
		}
	}

	if log := w.log.String(); strings.Contains(log, "panic") || strings.Contains(log, "duration must be") {
		t.Errorf("the worker's log shows a panic:\n%s", tail(log, 4096))
	}
	byPath := map[string]listedSource{}
	for _, s := range listSources(t, url) {
		byPath[strings.TrimPrefix(s.URL, d.URL())] = s
	}
	for _, p := range append(append([]string(nil), good...), hostile...) {
		if n := d.Count(p); n != 1 {
			t.Errorf("%s fetched %d times, want exactly once", p, n)
		}
	}
	for _, p := range good {
		if s := byPath[p]; deref(s.LastOutcome) != "ok" || s.LastCheckedAt == nil {
			t.Errorf("good source %s: outcome %s, checked %v; want ok, recorded", p, deref(s.LastOutcome), s.LastCheckedAt)
		}
	}
	for _, p := range []string{"/h/etag", "/h/lastmod", "/h/bigheader"} {
		if s := byPath[p]; s.LastOutcome == nil || s.LastCheckedAt == nil {
			t.Errorf("%s: no check recorded: %+v", p, s)
		}
	}
	var etag, lastModified *string
	if err := db.QueryRow(ctx, `SELECT etag, last_modified FROM fleetpace_source WHERE url = $1`, d.URL()+"/h/etag").Scan(&etag, new(*string)); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(ctx, `SELECT last_modified FROM fleetpace_source WHERE url = $1`, d.URL()+"/h/lastmod").Scan(&lastModified); err != nil {
		t.Fatal(err)
	}
	if etag != nil || lastModified != nil {
		t.Errorf("validators that are not UTF-8 were stored: ETag %q, Last-Modified %q", deref(etag), deref(lastModified))
	}
	redirect := byPath["/h/redirect/a"]
	if deref(redirect.LastOutcome) != "failed" || !strings.Contains(deref(redirect.LastError), "169.254.169.254") {
		t.Errorf("redirect to the metadata address: outcome %s, error %q; want failed, naming the address", deref(redirect.LastOutcome), deref(redirect.LastError))
	}
	if n := d.Count("/h/redirect/b"); n != 1 {
		t.Errorf("the redirect's second hop was fetched %d times, want once", n)
	}
	t.Logf("hostile: redirect refused with %q; big header: %s", deref(redirect.LastError), deref(byPath["/h/bigheader"].LastOutcome))

	for p := range retryAfter {
		path := "/" + p + "/x"
		s := byPath[path]
		if n := d.Count(path); n != 1 {
			t.Errorf("%s fetched %d times, want once (its platform cools down)", path, n)
		}
		if deref(s.LastOutcome) != "rate_limited" || deref(s.LastError) == "" {
			t.Errorf("%s: outcome %s, error %q; want rate_limited with a reason", path, deref(s.LastOutcome), deref(s.LastError))
		}
		var hold, cooldown float64
		err := db.QueryRow(ctx, `SELECT p.hold_until - extract(epoch FROM clock_timestamp()),
		        coalesce((SELECT extract(epoch FROM c.until - clock_timestamp()) FROM fleetpace_cooldown c WHERE c.platform = p.platform), 0)
		    FROM fleetpace_pace p WHERE p.platform = $1`, p).Scan(&hold, &cooldown)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("hostile: %s: hold %.0f s, cooldown %.0f s left, reason %q", p, hold, cooldown, deref(s.LastError))
		if hold > 24*3600 || cooldown > 24*3600 || cooldown <= 0 {
			t.Errorf("%s: hold %.0f s, cooldown %.0f s; want a cooldown, neither beyond 24 h", p, hold, cooldown)
		}
		if (p == "ra-overflow" || p == "ra-date") && cooldown < 20*3600 {
			t.Errorf("%s: cooldown %.0f s; want the 24-h cap (±10 %%), not the value ignored", p, cooldown)
		}
	}
	var worstHold float64
	if err := db.QueryRow(ctx, `SELECT coalesce(max(hold_until - extract(epoch FROM clock_timestamp())), 0) FROM fleetpace_pace`).Scan(&worstHold); err != nil {
		t.Fatal(err)
	}
	if worstHold > 24*3600 {
		t.Errorf("a hold of %.0f s, beyond the 24-h cap", worstHold)
	}
	if code, _, err := getReady(w.http()); err != nil || code != http.StatusOK {
		t.Errorf("/readyz: %d %v, want 200", code, err)
	}
	w.stop()
}

var ticksRE = regexp.MustCompile(`fleetpace_scan_ticks_total\{result="ran"\} (\d+)`)

// scanTicks reads the worker's count of scan ticks that ran.
func scanTicks(t *testing.T, p *proc) int {
	t.Helper()
	m := ticksRE.FindSubmatch(metricsOf(t, p))
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}
