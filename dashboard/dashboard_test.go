package dashboard_test

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testbin"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
)

// binary is the fleetpace command, for the browser test's workers.
var binary string

func TestMain(m *testing.M) { testbin.Main(testdb.M(m), &binary) }

const token = "correct horse battery staple"

// site is a dashboard on a test server, with a browser-like client: a
// cookie jar, redirects not followed (the tests look at them).
type site struct {
	t      *testing.T
	srv    *httptest.Server
	client *http.Client
	pool   *pgxpool.Pool
}

func newSite(t *testing.T, pool *pgxpool.Pool, cfg dashboard.Config) *site {
	t.Helper()
	cfg.DB = pool
	h, err := dashboard.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &site{t: t, srv: srv, pool: pool, client: &http.Client{
		Jar:           jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// get fetches a page and returns its status and body.
func (s *site) get(path string) (int, string) {
	s.t.Helper()
	res, err := s.client.Get(s.srv.URL + path)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// post submits a form and returns the answer (body read).
func (s *site) post(path string, form url.Values, header ...string) (*http.Response, string) {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := s.client.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// signIn signs in with the admin token and returns the CSRF token the
// overview's forms carry.
func (s *site) signIn() string {
	s.t.Helper()
	res, body := s.post("/login", url.Values{"token": {token}, "back": {"/"}})
	if res.StatusCode != http.StatusSeeOther {
		s.t.Fatalf("sign-in: %d\n%s", res.StatusCode, body)
	}
	_, page := s.get("/")
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	if m == nil {
		s.t.Fatalf("no CSRF token in the page after signing in:\n%s", page)
	}
	return m[1]
}

// row returns the overview's row of a platform, its cells' text.
func row(t *testing.T, page, platform string) []string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr data-platform="` + regexp.QuoteMeta(platform) + `"[^>]*>(.*?)</tr>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no row for platform %s in:\n%s", platform, page)
	}
	var cells []string
	for _, c := range regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(m[1], -1) {
		cells = append(cells, text(c[1]))
	}
	return cells
}

var tags = regexp.MustCompile(`(?s)<title>.*?</title>|<[^>]+>`)

// text is HTML's visible text, spaces collapsed.
func text(h string) string {
	return strings.Join(strings.Fields(html.UnescapeString(tags.ReplaceAllString(h, " "))), " ")
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func paceOf(t *testing.T, pool *pgxpool.Pool, platform string) pacer.State {
	t.Helper()
	st, err := pacer.StatesOf(context.Background(), pool, []string{platform})
	if err != nil || len(st) != 1 {
		t.Fatalf("pacer state of %s: %v, %v", platform, st, err)
	}
	return st[0]
}

// fleetPool returns a pool on a fresh database (testdb.Pool) holding
// fleetData.
func fleetPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t)
	fleetData(t, pool)
	return pool
}

// fleetData is a small fleet with every state the overview shows: alpha
// runs (a multiplier, failing, due, queued and late sources), beta is
// paused, gamma cools down.
func fleetData(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	storetest.Platform(t, pool, sources.Platform{Name: "alpha", RatePerSec: 8, Burst: 3})
	storetest.Platform(t, pool, sources.Platform{Name: "beta", RatePerSec: 3})
	storetest.Platform(t, pool, sources.Platform{Name: "gamma", RatePerSec: 0.5})
	for i := range 12 {
		storetest.Source(t, pool, sources.NewSource{Platform: "alpha", URL: fmt.Sprintf("https://a.example/%d", i)})
	}
	storetest.Source(t, pool, sources.NewSource{Platform: "beta", URL: "https://b.example/1"})
	// alpha: 3 due (late by 10, 20 and 600 s), 2 queued, 4 failing, 1 disabled
	// and late (not counted), the rest not due.
	exec(t, pool, `UPDATE fleetpace_source SET due_at = now() + interval '1 hour', last_checked_at = now() WHERE platform = 'alpha'`)
	exec(t, pool, `UPDATE fleetpace_source SET due_at = now() - make_interval(secs => v) FROM (VALUES (1, 10), (2, 20), (3, 600)) AS d(i, v)
		WHERE platform = 'alpha' AND url = 'https://a.example/' || d.i`)
	exec(t, pool, `UPDATE fleetpace_source SET queued_at = now(), queued_job_id = 4242, due_at = now() - interval '30 seconds' WHERE url IN ('https://a.example/4', 'https://a.example/5')`)
	exec(t, pool, `UPDATE fleetpace_source SET consecutive_failures = 2, last_outcome = 'failed', last_status = 404,
		last_error = 'HTTP 404 Not Found' WHERE url IN ('https://a.example/6', 'https://a.example/7', 'https://a.example/8', 'https://a.example/9')`)
	exec(t, pool, `UPDATE fleetpace_source SET enabled = false, due_at = now() - interval '1 day' WHERE url = 'https://a.example/10'`)
	exec(t, pool, `UPDATE fleetpace_pace SET adapt = 'multiplier', multiplier = 2 WHERE platform = 'alpha'`)
	if err := pacer.Pause(ctx, pool, "beta", time.Time{}, "maintenance window"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := control.CoolDown(ctx, pool, "gamma", sources.CauseStop, 10*time.Minute, "429 Too Many Requests", 0.5); err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.Beat(ctx, pool, fleet.Worker{ID: "w-1", Hostname: "host-a", PID: 4711, Version: "v9.9.9"}); err != nil {
		t.Fatal(err)
	}
}

// The overview shows one row per platform with the figures in the
// database, and the live workers.
func TestOverview(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := newSite(t, pool, dashboard.Config{})
	status, page := s.get("/")
	if status != http.StatusOK {
		t.Fatalf("overview: %d\n%s", status, page)
	}

	// What the database says, computed independently of the dashboard.
	var due, queued, failing int64
	var staleMax float64
	err := pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE enabled AND queued_at IS NULL AND due_at <= now()),
		       count(*) FILTER (WHERE queued_at IS NOT NULL),
		       count(*) FILTER (WHERE consecutive_failures > 0),
		       extract(epoch FROM max(now() - due_at) FILTER (WHERE enabled AND due_at <= now()))
		FROM fleetpace_source WHERE platform = 'alpha'`).Scan(&due, &queued, &failing, &staleMax)
	if err != nil {
		t.Fatal(err)
	}
	if due != 3 || queued != 2 || failing != 4 {
		t.Fatalf("test data: due %d queued %d failing %d", due, queued, failing)
	}
	alpha := row(t, page, "alpha")
	// platform, ceiling, effective, used, 429s/min, in flight, req/s, state, due, queued, failing, stale
	want := []string{"alpha", "8/s burst 3", "4/s ceiling ÷ backoff multiplier ×2", "0 of 4/s (ceiling 8/s)", "0", "0"}
	for i, w := range want {
		if alpha[i] != w {
			t.Errorf("alpha cell %d = %q, want %q", i, alpha[i], w)
		}
	}
	if alpha[7] != "throttled ×2.0" || alpha[8] != strconv.FormatInt(due, 10) || alpha[9] != strconv.FormatInt(queued, 10) || alpha[10] != strconv.FormatInt(failing, 10) {
		t.Errorf("alpha state and counts = %q; want throttled ×2.0, due %d, queued %d, failing %d", alpha[7:11], due, queued, failing)
	}
	if want := "10m"; !strings.HasSuffix(alpha[11], " / "+want) {
		t.Errorf("alpha staleness = %q, want max %s (%.0f s)", alpha[11], want, staleMax)
	}

	beta := row(t, page, "beta")
	if beta[2] != "0/s paused by an operator" || beta[7] != "paused by operator until resumed maintenance window" {
		t.Errorf("beta = %q; want paused until resumed, with its reason", beta)
	}
	gamma := row(t, page, "gamma")
	var left float64
	if err := pool.QueryRow(context.Background(), `SELECT extract(epoch FROM until - now()) FROM fleetpace_cooldown WHERE platform = 'gamma'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^cooling down: rate limited, (\d+)m(?:(\d\d)s)? left the destination asked for a 10m Retry-After → the platform's 15m cooldown 429 Too Many Requests$`).FindStringSubmatch(gamma[7])
	if m == nil {
		t.Fatalf("gamma state = %q; want a cooldown with its countdown, rule and reason", gamma[7])
	}
	shown, _ := strconv.Atoi(m[1])
	sec, _ := strconv.Atoi(m[2])
	if d := float64(shown*60+sec) - left; d < -5 || d > 5 {
		t.Errorf("gamma countdown shows %s:%s, the database says %.0f s left", m[1], m[2], left)
	}
	if !strings.Contains(page, `class="countdown" data-until="`) {
		t.Errorf("the countdown has no data-until for the script to tick")
	}
	if !strings.Contains(gamma[2], "fleet-wide hold") {
		t.Errorf("gamma effective rate = %q; want the hold named", gamma[2])
	}
	for _, w := range []string{"Live workers: 1", "host-a", "4711", "v9.9.9", "Platforms 1–3 of 3"} {
		if !strings.Contains(text(page), w) {
			t.Errorf("overview lacks %q", w)
		}
	}
	// Read-only: no forms, no sign-in link.
	if strings.Contains(page, "<form method=\"post\"") || strings.Contains(page, "Sign in") {
		t.Errorf("a dashboard without a token shows actions")
	}
}

// Platforms come in pages by name; the next page starts after the last.
func TestOverviewPages(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for _, n := range []string{"p1", "p2", "p3", "p4", "p5"} {
		storetest.Platform(t, pool, sources.Platform{Name: n, RatePerSec: 1})
	}
	s := newSite(t, pool, dashboard.Config{PageSize: 2})
	var seen []string
	path := "/"
	for range 5 {
		status, page := s.get(path)
		if status != http.StatusOK {
			t.Fatalf("%s: %d", path, status)
		}
		for _, m := range regexp.MustCompile(`data-platform="([^"]+)"`).FindAllStringSubmatch(page, -1) {
			seen = append(seen, m[1])
		}
		next := regexp.MustCompile(`class="next" href="([^"]+)"`).FindStringSubmatch(page)
		if next == nil {
			break
		}
		path = html.UnescapeString(next[1])
	}
	if strings.Join(seen, ",") != "p1,p2,p3,p4,p5" {
		t.Fatalf("pages showed %v; want p1…p5 once each, in order", seen)
	}
	if status, page := s.get("/?after=p2&n=2"); status != 200 || !strings.Contains(text(page), "Platforms 3–4 of 5") {
		t.Errorf("second page: %d, %q", status, text(page))
	}
	if status, _ := s.get("/?n=100000"); status != http.StatusBadRequest {
		t.Errorf("n=100000: %d, want 400 (pages are bounded)", status)
	}
}

// The platform page shows the settings, the pacer state, the counts and the
// failing sources with their last reason, in keyset pages.
func TestPlatformPage(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := newSite(t, pool, dashboard.Config{PageSize: 3, RiverUI: http.NotFoundHandler()})
	status, page := s.get("/platforms/alpha")
	if status != http.StatusOK {
		t.Fatalf("platform page: %d\n%s", status, page)
	}
	txt := text(page)
	for _, w := range []string{"ceiling 8/s fleet-wide", "burst 3", "backoff multiplier ×2 of at most ×16", "sources 12 (11 enabled)",
		"due now 3", "queued 2", "failing 4", "Failing sources (4)", "HTTP 404 Not Found", "cooldown 15m"} {
		if !strings.Contains(txt, w) {
			t.Errorf("platform page lacks %q:\n%s", w, txt)
		}
	}
	if !strings.Contains(page, `href="/riverui/jobs/4242"`) {
		t.Errorf("the queued source's job is not linked to River UI")
	}
	// Failing sources: 3 on the first page, the 4th on the next.
	first := regexp.MustCompile(`(?s)id="failing".*?</section>`).FindString(page)
	if n := strings.Count(first, "<tr data-source="); n != 3 {
		t.Fatalf("first page of failing sources has %d rows, want 3", n)
	}
	next := regexp.MustCompile(`class="next" href="([^"]+)"`).FindStringSubmatch(first)
	if next == nil {
		t.Fatalf("no next page of failing sources")
	}
	_, page2 := s.get(html.UnescapeString(next[1]))
	second := regexp.MustCompile(`(?s)id="failing".*?</section>`).FindString(page2)
	if n := strings.Count(second, "<tr data-source="); n != 1 {
		t.Errorf("second page of failing sources has %d rows, want 1", n)
	}

	if status, _ := s.get("/platforms/nope"); status != http.StatusNotFound {
		t.Errorf("unknown platform: %d, want 404", status)
	}
	if status, _ := s.get("/platforms/alpha?before=garbage"); status != http.StatusBadRequest {
		t.Errorf("bad cursor: %d, want 400", status)
	}
}

// The source page shows its settings and state; bad and unknown ids are
// 400 and 404; the find forms redirect.
func TestSourcePage(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := newSite(t, pool, dashboard.Config{})
	var id int64
	if err := pool.QueryRow(context.Background(), `SELECT id FROM fleetpace_source WHERE url = 'https://a.example/6'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	status, page := s.get(fmt.Sprintf("/sources/%d", id))
	if status != http.StatusOK {
		t.Fatalf("source page: %d", status)
	}
	for _, w := range []string{"https://a.example/6", "platform alpha", "interval 1h", "failures in a row 2", "last reason HTTP 404 Not Found", "last answer failed 404",
		"Platform now throttled ×2.0 the destination refused requests"} {
		if !strings.Contains(text(page), w) {
			t.Errorf("source page lacks %q:\n%s", w, text(page))
		}
	}
	if status, _ := s.get("/sources/999999"); status != http.StatusNotFound {
		t.Errorf("unknown source: %d, want 404", status)
	}
	if status, _ := s.get("/sources/x"); status != http.StatusBadRequest {
		t.Errorf("bad source id: %d, want 400", status)
	}
	res, err := s.client.Get(s.srv.URL + "/sources?platform=alpha&url=" + url.QueryEscape("https://a.example/6"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if loc := res.Header.Get("Location"); res.StatusCode != http.StatusSeeOther || loc != fmt.Sprintf("/sources/%d", id) {
		t.Errorf("find by URL: %d to %q", res.StatusCode, loc)
	}
	if status, _ := s.get("/sources?platform=alpha&url=https://nowhere.example/"); status != http.StatusNotFound {
		t.Errorf("find an unknown URL: %d, want 404", status)
	}
}

// A source URL and a pause reason with markup render as text on every page.
func TestEscaping(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	const evilURL = `https://evil.example/<script>alert(1)</script>`
	const evilReason = `<script>alert("reason")</script><img src=x onerror=alert(2)>`
	storetest.Platform(t, pool, sources.Platform{Name: "evil", RatePerSec: 1})
	id := storetest.Source(t, pool, sources.NewSource{Platform: "evil", URL: evilURL})
	exec(t, pool, `UPDATE fleetpace_source SET consecutive_failures = 1, last_checked_at = now(), last_outcome = 'failed', last_error = $1 WHERE id = $2`, evilReason, id)
	if err := pacer.Pause(context.Background(), pool, "evil", time.Time{}, evilReason); err != nil {
		t.Fatal(err)
	}
	s := newSite(t, pool, dashboard.Config{AdminToken: token})
	s.signIn()
	for _, path := range []string{"/", "/platforms/evil", fmt.Sprintf("/sources/%d", id)} {
		status, page := s.get(path)
		if status != http.StatusOK {
			t.Fatalf("%s: %d", path, status)
		}
		if strings.Contains(page, "<script>alert") || strings.Contains(page, "<img src=x") {
			t.Errorf("%s renders markup from the database:\n%s", path, page)
		}
		if !strings.Contains(page, "&lt;script&gt;alert(") {
			t.Errorf("%s does not show the text escaped", path)
		}
		if got := strings.Count(page, "<script"); got != 1 {
			t.Errorf("%s has %d script elements, want only the dashboard's own", path, got)
		}
	}
}

// A source URL's credentials are never shown.
func TestURLCredentialsRedacted(t *testing.T) {
	t.Parallel()
	pool := storetest.Pool(t, sources.Platform{Name: "api", RatePerSec: 1})
	id := storetest.Source(t, pool, sources.NewSource{Platform: "api", URL: "https://bot:hunter2@api.example/feed?x=1"})
	exec(t, pool, `UPDATE fleetpace_source SET consecutive_failures = 1, last_checked_at = now(), due_at = now() - interval '1 minute' WHERE id = $1`, id)
	s := newSite(t, pool, dashboard.Config{})
	for _, path := range []string{"/platforms/api", fmt.Sprintf("/sources/%d", id)} {
		_, page := s.get(path)
		if strings.Contains(page, "hunter2") || !strings.Contains(page, "https://bot:xxxxx@api.example/feed?x=1") {
			t.Errorf("%s shows the URL's credentials, or not the URL:\n%s", path, text(page))
		}
	}
}

// Without an admin token every action is refused (403) and nothing
// changes; the sign-in page says how to turn actions on.
func TestActionsOffWithoutToken(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := newSite(t, pool, dashboard.Config{})
	for _, path := range []string{"/platforms/alpha/pause", "/platforms/beta/resume", "/platforms/gamma/clear-cooldown", "/platforms/alpha/limits", "/sources/1/disable", "/sources/1/enable",
		"/platforms/alpha/reset", "/platforms/alpha/check", "/sources/1/check"} {
		res, body := s.post(path, url.Values{"rate": {"1"}, "csrf": {"x"}})
		if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "--admin-token") {
			t.Errorf("%s without a token: %d", path, res.StatusCode)
		}
	}
	res, _ := s.post("/login", url.Values{"token": {""}})
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("sign-in without a token configured: %d, want 403", res.StatusCode)
	}
	if _, page := s.get("/login"); !strings.Contains(text(page), "Actions are off") {
		t.Errorf("the sign-in page does not say actions are off")
	}
	assertUnchanged(t, pool)
}

// assertUnchanged checks fleetData's state is as it was written.
func assertUnchanged(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if p := paceOf(t, pool, "alpha"); p.Paused != 0 || p.Rate != 8 || p.Burst != 3 {
		t.Errorf("alpha changed: %+v", p)
	}
	if p := paceOf(t, pool, "beta"); !p.PausedIndefinitely {
		t.Errorf("beta was resumed")
	}
	if p := paceOf(t, pool, "gamma"); p.Hold == 0 {
		t.Errorf("gamma's hold was cleared")
	}
	var disabled int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM fleetpace_source WHERE NOT enabled`).Scan(&disabled); err != nil || disabled != 1 {
		t.Errorf("disabled sources: %d, %v; want 1", disabled, err)
	}
}

// Signing in sets a session cookie (HttpOnly, SameSite=Strict, ending with
// the browser session); a wrong token is refused.
func TestSignIn(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	s := newSite(t, pool, dashboard.Config{AdminToken: token})
	res, body := s.post("/login", url.Values{"token": {"wrong"}, "back": {"/"}})
	if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "not the admin token") || len(res.Cookies()) != 0 {
		t.Fatalf("wrong token: %d, cookies %v", res.StatusCode, res.Cookies())
	}
	res, _ = s.post("/login", url.Values{"token": {token}, "back": {"//evil.example/"}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/" {
		t.Fatalf("sign-in: %d to %q; want 303 to / (never off-site)", res.StatusCode, res.Header.Get("Location"))
	}
	cookies := res.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("cookies %v", cookies)
	}
	c := cookies[0]
	if c.Name != dashboard.CookieName || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.MaxAge != 0 || !c.Expires.IsZero() || c.Path != "/" {
		t.Errorf("session cookie %+v; want HttpOnly, SameSite=Strict, a browser-session cookie", c)
	}
	if strings.Contains(c.Value, token) {
		t.Errorf("the cookie carries the token")
	}
	if _, page := s.get("/"); !strings.Contains(page, "Sign out") {
		t.Errorf("signed in, the page does not offer to sign out")
	}
	// A cookie signed for another token is not a session here.
	other := newSite(t, pool, dashboard.Config{AdminToken: "another token"})
	u, _ := url.Parse(other.srv.URL)
	other.client.Jar.SetCookies(u, cookies)
	if _, page := other.get("/"); strings.Contains(page, "Sign out") {
		t.Errorf("a session of another token is accepted")
	}
}

// Actions need a session and its CSRF token; a cross-site request, a
// missing or wrong token, or another session's token is refused and
// changes nothing.
func TestCSRF(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := newSite(t, pool, dashboard.Config{AdminToken: token})
	other := newSite(t, pool, dashboard.Config{AdminToken: token})
	otherCSRF := other.signIn()

	// Not signed in, with a token from another session.
	if res, _ := s.post("/platforms/alpha/pause", url.Values{"csrf": {otherCSRF}}); res.StatusCode != http.StatusForbidden {
		t.Errorf("pause without a session: %d, want 403", res.StatusCode)
	}
	csrf := s.signIn()
	if csrf == otherCSRF {
		t.Fatalf("two sessions share a CSRF token")
	}
	for name, c := range map[string]struct {
		form   url.Values
		header []string
	}{
		"no token":              {url.Values{}, nil},
		"wrong token":           {url.Values{"csrf": {"AAAA" + csrf[4:]}}, nil},
		"another session's":     {url.Values{"csrf": {otherCSRF}}, nil},
		"cross-site origin":     {url.Values{"csrf": {csrf}}, []string{"Origin", "https://evil.example"}},
		"cross-site fetch-site": {url.Values{"csrf": {csrf}}, []string{"Sec-Fetch-Site", "cross-site"}},
	} {
		res, body := s.post("/platforms/alpha/pause", c.form, c.header...)
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403\n%s", name, res.StatusCode, body)
		}
	}
	assertUnchanged(t, pool)
	// The right token from the same origin works.
	if res, body := s.post("/platforms/alpha/pause", url.Values{"csrf": {csrf}}, "Origin", s.srv.URL); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("pause with the session's token: %d\n%s", res.StatusCode, body)
	}
}

// Pause (with a duration and a reason) and resume take effect in the pacer
// at once and show on the pages.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := newSite(t, pool, dashboard.Config{AdminToken: token})
	csrf := s.signIn()

	res, body := s.post("/platforms/alpha/pause", url.Values{"csrf": {csrf}, "for": {"10m"}, "reason": {"deploy of the API"}, "back": {"/platforms/alpha"}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/platforms/alpha?done=paused" {
		t.Fatalf("pause: %d to %q\n%s", res.StatusCode, res.Header.Get("Location"), body)
	}
	p := paceOf(t, pool, "alpha")
	if p.PausedIndefinitely || p.Paused < 9*time.Minute || p.Paused > 10*time.Minute || p.PauseReason != "deploy of the API" {
		t.Fatalf("alpha after pause: paused %s (indefinitely %v), reason %q; want 10m, the reason", p.Paused, p.PausedIndefinitely, p.PauseReason)
	}
	_, page := s.get("/platforms/alpha?done=paused")
	if !strings.Contains(text(page), "Paused: no request leaves") || !regexp.MustCompile(`paused by operator, (9m\d\ds|10m) left deploy of the API`).MatchString(text(page)) {
		t.Errorf("the platform page does not show the pause:\n%s", text(page))
	}
	if _, page := s.get("/"); !strings.Contains(row(t, page, "alpha")[7], "paused") || !strings.Contains(page, `action="/platforms/alpha/resume"`) {
		t.Errorf("the overview does not show alpha paused with a resume button")
	}

	// Without a reason, indefinitely.
	if res, _ := s.post("/platforms/alpha/pause", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("pause: %d", res.StatusCode)
	}
	if p := paceOf(t, pool, "alpha"); !p.PausedIndefinitely || p.PauseReason != dashboard.DefaultPauseReason {
		t.Fatalf("alpha: %+v; want paused until resumed, the default reason", p)
	}
	if res, _ := s.post("/platforms/alpha/resume", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("resume: %d", res.StatusCode)
	}
	if p := paceOf(t, pool, "alpha"); p.Paused != 0 || p.PausedIndefinitely {
		t.Fatalf("alpha after resume: %+v", p)
	}
	if _, page := s.get("/"); row(t, page, "alpha")[7] != "throttled ×2.0" {
		t.Errorf("alpha after resume: %q", row(t, page, "alpha")[7])
	}

	// Bad input: 400 naming the field, nothing written.
	for _, c := range []url.Values{{"for": {"soon"}}, {"for": {"-5m"}}, {"reason": {strings.Repeat("x", control.MaxReasonLen+1)}}} {
		c.Set("csrf", csrf)
		res, body := s.post("/platforms/alpha/pause", c)
		if res.StatusCode != http.StatusBadRequest || !(strings.Contains(body, "for must") || strings.Contains(body, "reason must")) {
			t.Errorf("pause %v: %d\n%s", c, res.StatusCode, text(body))
		}
	}
	if p := paceOf(t, pool, "alpha"); p.Paused != 0 {
		t.Errorf("a refused pause paused alpha")
	}
	if res, _ := s.post("/platforms/nope/pause", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusNotFound {
		t.Errorf("pause of an unknown platform: %d, want 404", res.StatusCode)
	}
}

// Rate and burst change alone or together; every other setting stays; bad
// values are refused naming the field.
func TestSetLimits(t *testing.T) {
	t.Parallel()
	pool := storetest.Pool(t, sources.Platform{Name: "alpha", RatePerSec: 8, Burst: 3, Cooldown: 42 * time.Minute, MaxMultiplier: 4, NoProbe: true})
	s := newSite(t, pool, dashboard.Config{AdminToken: token})
	csrf := s.signIn()
	get := func() sources.Platform {
		p, err := sources.GetPlatform(context.Background(), pool, "alpha")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if res, body := s.post("/platforms/alpha/limits", url.Values{"csrf": {csrf}, "rate": {"2.5"}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("rate: %d\n%s", res.StatusCode, body)
	}
	if p := get(); p.RatePerSec != 2.5 || p.Burst != 3 || p.Cooldown != 42*time.Minute || p.MaxMultiplier != 4 || !p.NoProbe {
		t.Fatalf("after rate 2.5: %+v; want only the rate changed", p)
	}
	if res, _ := s.post("/platforms/alpha/limits", url.Values{"csrf": {csrf}, "burst": {"5"}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("burst: %d", res.StatusCode)
	}
	if p := get(); p.RatePerSec != 2.5 || p.Burst != 5 {
		t.Fatalf("after burst 5: %+v", p)
	}
	if p := paceOf(t, pool, "alpha"); p.Rate != 2.5 || p.Burst != 5 {
		t.Errorf("the pacer paces at %g/s burst %d", p.Rate, p.Burst)
	}
	for _, c := range []struct{ rate, burst, field string }{{"abc", "", "rate"}, {"-1", "", "rate"}, {"", "0", "burst"}, {"", "1.5", "burst"}, {"", "", "give a rate"}} {
		res, body := s.post("/platforms/alpha/limits", url.Values{"csrf": {csrf}, "rate": {c.rate}, "burst": {c.burst}})
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(text(body), c.field) {
			t.Errorf("rate %q burst %q: %d; want 400 naming %s\n%s", c.rate, c.burst, res.StatusCode, c.field, text(body))
		}
	}
	if p := get(); p.RatePerSec != 2.5 || p.Burst != 5 {
		t.Errorf("a refused change changed alpha: %+v", p)
	}
}

// The database unreachable: the page says so in a banner, 503.
func TestDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	addr, _ := testdb.Silent(t)
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@"+addr+"/x?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h, err := dashboard.New(dashboard.Config{DB: pool, QueryTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Host = "localhost"
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), `class="banner"`) || !strings.Contains(rec.Body.String(), "The database is unreachable") {
		t.Fatalf("unreachable database: %d\n%s", rec.Code, rec.Body)
	}
}

// A worker whose pacer paces locally says so on every page.
func TestDegradedBanner(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	degraded := false
	s := newSite(t, pool, dashboard.Config{Degraded: func() bool { return degraded }})
	if _, page := s.get("/"); strings.Contains(page, `class="banner"`) {
		t.Fatalf("banner while the pacer is fine")
	}
	degraded = true
	if _, page := s.get("/"); !strings.Contains(page, `class="banner"`) || !strings.Contains(page, "paces locally") {
		t.Fatalf("no degraded banner")
	}
}

// Assets are embedded; every answer carries the security headers and the
// server time.
func TestAssetsAndHeaders(t *testing.T) {
	t.Parallel()
	s := newSite(t, testdb.Pool(t), dashboard.Config{})
	for path, ctype := range map[string]string{"/assets/style.css": "text/css", "/assets/live.js": "text/javascript"} {
		res, err := s.client.Get(s.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), ctype) {
			t.Errorf("%s: %d %s", path, res.StatusCode, res.Header.Get("Content-Type"))
		}
	}
	res, err := s.client.Get(s.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if st := res.Header.Get("Server-Timing"); !regexp.MustCompile(`^db;dur=[\d.]+, total;dur=[\d.]+$`).MatchString(st) {
		t.Errorf("Server-Timing %q", st)
	}
	if status, _ := s.get("/nowhere"); status != http.StatusNotFound {
		t.Errorf("/nowhere: %d", status)
	}
}

// The history parts: requests/s over the last 15 minutes on the overview
// (aggregated in SQL, against the ceiling), by outcome over the last hour
// on the platform page, a source's checks with their reasons, newest
// first.
func TestHistory(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	var src int64
	if err := pool.QueryRow(context.Background(), `SELECT id FROM fleetpace_source WHERE url = 'https://a.example/6'`).Scan(&src); err != nil {
		t.Fatal(err)
	}
	// alpha: 240 checks in the last 15 minutes (900 s), 60 of them in the
	// last 10 s; 3 more an hour ago (outside both windows). Source src: three
	// checks with different outcomes.
	exec(t, pool, `INSERT INTO fleetpace_check (source_id, platform, checked_at, outcome, status, duration_ms, bytes, reason, worker)
		SELECT 1, 'alpha', now() - make_interval(secs => 31 + (g % 860)), 'ok', 200, 12, 100, NULL, 'w-1' FROM generate_series(1, 180) g
		UNION ALL SELECT 1, 'alpha', now() - make_interval(secs => g % 9 + 0.5), 'not_modified', 304, 5, 0, NULL, 'w-1' FROM generate_series(1, 60) g
		UNION ALL SELECT 1, 'alpha', now() - interval '70 minutes', 'ok', 200, 1, 1, NULL, 'w-1' FROM generate_series(1, 3) g`)
	exec(t, pool, `INSERT INTO fleetpace_check (source_id, platform, checked_at, outcome, status, duration_ms, bytes, reason, worker, multiplier) VALUES
		($1, 'alpha', now() - interval '3 minutes', 'ok', 200, 40, 2048, NULL, 'w-1', 1),
		($1, 'alpha', now() - interval '2 minutes', 'rate_pressure', 429, 3, 0, 'HTTP 429 Too Many Requests <script>x</script>', 'w-2', 4),
		($1, 'alpha', now() - interval '1 minute', 'failed', 404, 7, 0, 'HTTP 404 Not Found', 'w-1', 2)`, src)
	s := newSite(t, pool, dashboard.Config{})

	_, page := s.get("/")
	m := regexp.MustCompile(`(?s)<tr data-platform="alpha".*?aria-label="([^"]*)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no requests/s chart in alpha's row:\n%s", page)
	}
	// The last 10-s bucket holds the 60 not-modified checks: 6/s, the peak
	// (the 180 ok checks are one a second, 1/s).
	if want := "requests/s over the last 15m in 10s buckets: peak 6/s, now 6/s, ceiling 8/s"; html.UnescapeString(m[1]) != want {
		t.Errorf("alpha's chart says %q, want %q", html.UnescapeString(m[1]), want)
	}
	if beta := regexp.MustCompile(`(?s)<tr data-platform="beta".*?aria-label="([^"]*)"`).FindStringSubmatch(page); beta == nil || !strings.Contains(beta[1], "peak 0/s") {
		t.Errorf("beta's chart: %q, want no requests", beta)
	}

	_, page = s.get("/platforms/alpha")
	for _, w := range []string{`class="area ok"`, `class="area not_modified"`, `class="area rate_limited"`, `class="area failed"`, `class="ceiling"`, "ceiling 8/s"} {
		if !strings.Contains(page, w) {
			t.Errorf("the platform chart lacks %s", w)
		}
	}
	if !strings.Contains(page, "requests/s over the last 1h in 1m buckets") {
		t.Errorf("no one-hour chart on the platform page")
	}
	// The multiplier over time: ×1, then ×4 with the 429, then ×2, carried
	// to now; the platform's maximum is the line.
	want := fmt.Sprintf("backoff multiplier over the last 1h in 1m buckets: peak ×4, now ×2, at most ×%g", float64(sources.DefaultMaxMultiplier))
	if !strings.Contains(html.UnescapeString(page), want) || !strings.Contains(page, `class="area mult"`) {
		t.Errorf("the platform page has no multiplier chart saying %q", want)
	}
	if _, page := s.get("/platforms/beta"); !strings.Contains(page, "recorded its multiplier") {
		t.Errorf("beta, without fetches, does not say why it has no multiplier chart")
	}

	_, page = s.get(fmt.Sprintf("/sources/%d", src))
	hist := regexp.MustCompile(`(?s)<table class="history">.*?</table>`).FindString(page)
	var outcomes []string
	for _, r := range regexp.MustCompile(`<span class="outcome (\w+)">`).FindAllStringSubmatch(hist, -1) {
		outcomes = append(outcomes, r[1])
	}
	if strings.Join(outcomes, ",") != "failed,rate_pressure,ok" {
		t.Errorf("history outcomes %v, want failed, rate_pressure, ok (newest first)", outcomes)
	}
	for _, w := range []string{"HTTP 404 Not Found", "HTTP 429 Too Many Requests &lt;script&gt;x&lt;/script&gt;", "2048", "w-2"} {
		if !strings.Contains(hist, w) {
			t.Errorf("history lacks %q:\n%s", w, hist)
		}
	}
}

// Clearing a cooldown ends it and the pacer's hold at once: the platform
// shows running.
func TestClearCooldown(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := newSite(t, pool, dashboard.Config{AdminToken: token})
	csrf := s.signIn()
	if _, page := s.get("/"); !strings.Contains(page, `action="/platforms/gamma/clear-cooldown"`) {
		t.Fatalf("no clear-cooldown button for gamma")
	}
	res, body := s.post("/platforms/gamma/clear-cooldown", url.Values{"csrf": {csrf}, "back": {"/"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("clear cooldown: %d\n%s", res.StatusCode, text(body))
	}
	if p := paceOf(t, pool, "gamma"); p.Hold != 0 {
		t.Errorf("gamma still held for %s", p.Hold)
	}
	cooldowns, err := sources.ActiveCooldowns(context.Background(), pool)
	if err != nil || len(cooldowns) != 0 {
		t.Errorf("active cooldowns after clearing: %v, %v", cooldowns, err)
	}
	if _, page := s.get("/"); row(t, page, "gamma")[7] != "running" {
		t.Errorf("gamma after clearing: %q", row(t, page, "gamma")[7])
	}
	if res, _ := s.post("/platforms/nope/clear-cooldown", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusNotFound {
		t.Errorf("clear cooldown of an unknown platform: %d, want 404", res.StatusCode)
	}
}

// Reset pace puts alpha (backed off ×2) back at its ceiling and gamma out
// of its cooldown, and leaves beta's pause; check now queues a source's
// job, or every source of a platform, and runs snoozed ones now.
func TestResetAndCheckNow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := fleetPool(t)
	client, err := queue.NewClient(pool, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := newSite(t, pool, dashboard.Config{AdminToken: token, Queue: client})
	csrf := s.signIn()
	if _, page := s.get("/"); !strings.Contains(page, `action="/platforms/alpha/reset"`) || !strings.Contains(page, `action="/platforms/gamma/reset"`) {
		t.Fatalf("no reset button for the backed-off alpha or the cooling-down gamma")
	}
	for _, p := range []string{"alpha", "gamma", "beta"} {
		res, body := s.post("/platforms/"+p+"/reset", url.Values{"csrf": {csrf}, "back": {"/platforms/" + p}})
		if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/platforms/"+p+"?done=reset" {
			t.Fatalf("reset %s: %d to %q\n%s", p, res.StatusCode, res.Header.Get("Location"), text(body))
		}
	}
	if p := paceOf(t, pool, "alpha"); p.Multiplier != 1 || p.PacedBy != pacer.PacedByCeiling || p.EffectiveRate != 8 {
		t.Errorf("alpha after reset: %+v; want its ceiling", p)
	}
	if cds, err := sources.ActiveCooldowns(ctx, pool); err != nil || len(cds) != 0 {
		t.Errorf("cooldowns after reset: %+v %v", cds, err)
	}
	if p := paceOf(t, pool, "beta"); !p.PausedIndefinitely {
		t.Errorf("reset resumed beta: %+v", p)
	}
	if _, page := s.get("/platforms/alpha?done=reset"); !strings.Contains(text(page), "Reset: no backoff") || !strings.Contains(text(page), "alpha running") {
		t.Errorf("alpha's page after reset:\n%s", text(page))
	}

	// Check now: a source without a job gets one; a whole platform's.
	var id int64
	if err := pool.QueryRow(ctx, `SELECT id FROM fleetpace_source WHERE url = 'https://a.example/11'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, page := s.get(fmt.Sprintf("/sources/%d", id)); !strings.Contains(page, fmt.Sprintf(`action="/sources/%d/check"`, id)) {
		t.Fatalf("no check-now button on source %d", id)
	}
	res, body := s.post(fmt.Sprintf("/sources/%d/check", id), url.Values{"csrf": {csrf}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("check source %d: %d\n%s", id, res.StatusCode, text(body))
	}
	var job *int64
	if err := pool.QueryRow(ctx, `SELECT queued_job_id FROM fleetpace_source WHERE id = $1`, id).Scan(&job); err != nil || job == nil {
		t.Fatalf("source %d after check now: job %v, %v; want one queued", id, job, err)
	}
	res, body = s.post("/platforms/beta/check", url.Values{"csrf": {csrf}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("check beta: %d\n%s", res.StatusCode, text(body))
	}
	var unqueued int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fleetpace_source WHERE platform = 'beta' AND enabled AND queued_job_id IS NULL`).Scan(&unqueued); err != nil || unqueued != 0 {
		t.Errorf("beta after check now: %d enabled source(s) without a job (%v)", unqueued, err)
	}
	if res, _ := s.post("/sources/999999/check", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusNotFound {
		t.Errorf("check an unknown source: %d, want 404", res.StatusCode)
	}
	if res, _ := s.post("/platforms/nope/reset", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusNotFound {
		t.Errorf("reset an unknown platform: %d, want 404", res.StatusCode)
	}
}

// Disable and enable a source from its page.
func TestEnableDisableSource(t *testing.T) {
	t.Parallel()
	pool := storetest.Pool(t, sources.Platform{Name: "alpha", RatePerSec: 1})
	id := storetest.Source(t, pool, sources.NewSource{Platform: "alpha", URL: "https://a.example/x"})
	s := newSite(t, pool, dashboard.Config{AdminToken: token})
	csrf := s.signIn()
	path := fmt.Sprintf("/sources/%d", id)
	enabled := func() bool {
		src, err := sources.GetSource(context.Background(), pool, id)
		if err != nil {
			t.Fatal(err)
		}
		return src.Enabled
	}
	if _, page := s.get(path); !strings.Contains(page, `action="`+path+`/disable"`) {
		t.Fatalf("no disable button on the source page")
	}
	if res, body := s.post(path+"/disable", url.Values{"csrf": {csrf}, "back": {path}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("disable: %d\n%s", res.StatusCode, text(body))
	}
	if enabled() {
		t.Fatalf("the source is still enabled")
	}
	_, page := s.get(path + "?done=disabled")
	if !strings.Contains(text(page), "enabled no : not scanned") || !strings.Contains(text(page), "next check not scheduled (held back: disabled)") || !strings.Contains(page, `action="`+path+`/enable"`) || !strings.Contains(text(page), "Source disabled") {
		t.Errorf("the page does not show the source disabled with an enable button:\n%s", text(page))
	}
	if res, _ := s.post(path+"/enable", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusSeeOther || !enabled() {
		t.Fatalf("enable: %d, enabled %v", res.StatusCode, enabled())
	}
	if res, _ := s.post("/sources/999999/disable", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusNotFound {
		t.Errorf("disable an unknown source: %d, want 404", res.StatusCode)
	}
	if res, _ := s.post("/sources/x/disable", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusBadRequest {
		t.Errorf("disable source x: %d, want 400", res.StatusCode)
	}
}

// Wrong tokens are limited per address: after SignInBurst of them every
// attempt is refused with 429 and Retry-After — the right token included —
// until a SignInEvery has passed.
func TestSignInLimited(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	clk := clocktest.New()
	s := newSite(t, pool, dashboard.Config{AdminToken: token, Clock: clk})
	for i := range dashboard.SignInBurst {
		if res, _ := s.post("/login", url.Values{"token": {fmt.Sprint("guess", i)}}); res.StatusCode != http.StatusForbidden {
			t.Fatalf("wrong token %d: %d, want 403", i+1, res.StatusCode)
		}
	}
	res, body := s.post("/login", url.Values{"token": {token}})
	if res.StatusCode != http.StatusTooManyRequests || len(res.Cookies()) != 0 {
		t.Fatalf("after %d wrong tokens the right one got %d with cookies %v; want 429 and no session", dashboard.SignInBurst, res.StatusCode, res.Cookies())
	}
	if ra := res.Header.Get("Retry-After"); ra != fmt.Sprint(int(dashboard.SignInEvery.Seconds())) {
		t.Errorf("Retry-After %q, want %v in seconds", ra, dashboard.SignInEvery)
	}
	if !strings.Contains(text(body), "Too many wrong tokens") {
		t.Errorf("the page does not say why: %s", text(body))
	}
	clk.Advance(dashboard.SignInEvery)
	if res, _ := s.post("/login", url.Values{"token": {token}}); res.StatusCode != http.StatusSeeOther || len(res.Cookies()) != 1 {
		t.Fatalf("a %v later the right token got %d; want 303 and a session", dashboard.SignInEvery, res.StatusCode)
	}
}
