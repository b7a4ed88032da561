package dashboard_test

// The hostile-client suite: the server of `fleetpace dashboard` (and of every
// worker: dashboard.Serve) on a real database, attacked as a client that
// aborts, lies about where it comes from, names another host, sends its
// body slowly or too much of it, replays a cookie, or sends bytes
// PostgreSQL cannot store.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	osexec "os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/internal/browser"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/syncbuf"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
)

// longToken is an admin token long enough beyond loopback.
const longToken = "a long admin token of 32 bytes or more, for every address"

// served is dashboard.Serve on a real database with River UI, for one test.
type served struct {
	t      *testing.T
	base   string // http://127.0.0.1:port
	addr   string // 127.0.0.1:port
	pool   *pgxpool.Pool
	client *http.Client // a cookie jar; redirects are not followed
	logs   *syncbuf.Buffer
	stop   func() error // ends Serve and returns its error
}

// serve starts dashboard.Serve with cfg (its DB, Logger, RiverClient and,
// unless set, Addr filled in) and stops it when the test ends.
func serve(t *testing.T, pool *pgxpool.Pool, cfg dashboard.ServerConfig) *served {
	t.Helper()
	client, err := queue.NewClient(pool, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	cfg.Dashboard.DB = pool
	cfg.Dashboard.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.RiverClient = client
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	bound := make(chan net.Addr, 1)
	cfg.Ready = func(a net.Addr) { bound <- a }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dashboard.Serve(ctx, cfg) }()
	s := &served{t: t, pool: pool, logs: logs}
	var once sync.Once
	var serveErr error
	s.stop = func() error {
		once.Do(func() {
			cancel()
			serveErr = <-done
		})
		return serveErr
	}
	select {
	case a := <-bound:
		_, port, _ := net.SplitHostPort(a.String())
		s.addr = net.JoinHostPort("127.0.0.1", port)
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	s.base = "http://" + s.addr
	jar, _ := cookiejar.New(nil)
	s.client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(func() {
		s.client.CloseIdleConnections()
		if err := s.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	return s
}

// do sends a request (header: name, value pairs; "Host" sets the Host)
// and returns the answer with its body read.
func (s *served) do(method, path string, body io.Reader, header ...string) (*http.Response, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.base+path, body)
	if err != nil {
		s.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
		} else {
			req.Header.Set(header[i], header[i+1])
		}
	}
	res, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// form posts a URL-encoded form.
func (s *served) form(path string, form url.Values, header ...string) (*http.Response, string) {
	s.t.Helper()
	return s.do(http.MethodPost, path, strings.NewReader(form.Encode()),
		append([]string{"Content-Type", "application/x-www-form-urlencoded"}, header...)...)
}

// signIn signs in with token and returns the CSRF token of the overview's
// forms.
func (s *served) signIn(token string) string {
	s.t.Helper()
	if res, body := s.form("/login", url.Values{"token": {token}, "back": {"/"}}); res.StatusCode != http.StatusSeeOther {
		s.t.Fatalf("sign-in: %d\n%s", res.StatusCode, body)
	}
	_, page := s.do(http.MethodGet, "/", nil)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(page)
	if m == nil {
		s.t.Fatalf("no CSRF token in the page after signing in:\n%s", page)
	}
	return m[1]
}

// noFailureLogged fails the test if the server logged an error, or took a
// client's doing for the database's.
func (s *served) noFailureLogged() {
	s.t.Helper()
	for _, line := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "database unreachable") {
			s.t.Errorf("the server logged: %s", line)
		}
	}
}

// pages are fleetData's pages and what each shows when it renders.
func pages(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(), `SELECT id FROM fleetpace_source WHERE url = 'https://a.example/7'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"/":                            `data-platform="alpha"`,
		"/platforms/alpha":             "Failing sources (4)",
		fmt.Sprintf("/sources/%d", id): "https://a.example/7",
	}
}

// everyPageRenders checks that each page answers 200 with its content.
func (s *served) everyPageRenders(pages map[string]string) {
	s.t.Helper()
	for path, want := range pages {
		if status, page := s.do(http.MethodGet, path, nil); status.StatusCode != http.StatusOK || !strings.Contains(page, want) {
			s.t.Errorf("GET %s: %d, want 200 with %q\n%.400s", path, status.StatusCode, want, page)
		}
	}
}

// Requests aborted by their client while the page's reads wait (the tables
// locked by another transaction, as during a long migration) are no
// failure: nothing is logged as an error or as the database being
// unreachable, and every page renders again at once, each route aborted
// twice.
func TestAbortThenRender(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := serve(t, pool, dashboard.ServerConfig{})
	want := pages(t, pool)
	ctx := context.Background()
	lock, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(ctx) //nolint:errcheck
	if _, err := lock.Exec(ctx, `LOCK TABLE fleetpace_platform, fleetpace_source IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for path := range want {
			reqCtx, cancel := context.WithCancel(ctx)
			req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, s.base+path, nil)
			done := make(chan error, 1)
			go func() {
				res, err := s.client.Do(req)
				if err == nil {
					res.Body.Close()
				}
				done <- err
			}()
			waitLockWaiters(t, pool, 1) // the page's read waits for the lock
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("GET %s while its tables are locked: %v, want it cancelled by the client", path, err)
			}
			waitLockWaiters(t, pool, 0) // the server gave up the read
		}
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	s.everyPageRenders(want)
	s.noFailureLogged()
}

// waitLockWaiters waits until exactly n backends of the test's database
// wait for a lock.
func waitLockWaiters(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d backends wait for a lock after 20 s, want %d", waiting, n)
		}
	}
}

// After an outage (the database stopped, then back) every page renders
// again without a restart: a 503 page leaves no trace on its route.
func TestRenderAfterOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testdb.Private(t, pgembed.Config{})
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: c.URL("postgres"), MaxConns: 4, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	fleetData(t, pool)
	want := pages(t, pool)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{QueryTimeout: 2 * time.Second}})
	s.everyPageRenders(want)
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for path := range want {
		if res, page := s.do(http.MethodGet, path, nil); res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(page, "The database is unreachable") {
			t.Errorf("GET %s during the outage: %d, want 503 saying so", path, res.StatusCode)
		}
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The pool's connections died with the server: the first reads after
	// the restart may fail once.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, _ := s.do(http.MethodGet, "/", nil); res.StatusCode == http.StatusOK || time.Now().After(deadline) {
			break
		}
	}
	s.everyPageRenders(want)
}

// queuedJob queues a fetch job for source id (scan.Enqueue) and returns
// the job's id.
func queuedJob(t *testing.T, pool *pgxpool.Pool, id int64) int64 {
	t.Helper()
	client, err := queue.NewClient(pool, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := scan.Enqueue(context.Background(), pool, client, []int64{id}); err != nil {
		t.Fatal(err)
	}
	var job int64
	if err := pool.QueryRow(context.Background(), `SELECT queued_job_id FROM fleetpace_source WHERE id = $1`, id).Scan(&job); err != nil {
		t.Fatal(err)
	}
	return job
}

func jobState(t *testing.T, pool *pgxpool.Pool, job int64) string {
	t.Helper()
	var state string
	if err := pool.QueryRow(context.Background(), `SELECT state::text FROM river_job WHERE id = $1`, job).Scan(&state); err != nil {
		t.Fatal(err)
	}
	return state
}

// A state change that a browser says comes from another origin is refused,
// with or without a token, by the dashboard and by River UI — a sibling
// origin of the same site included — and changes nothing; River UI's API
// takes a request without browser origin headers only as JSON. River UI's
// own requests (same-origin, a JSON body sent as text/plain, as its
// script does) and a command-line client's JSON work.
func TestCrossOriginStateChanges(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"", longToken} {
		t.Run(fmt.Sprintf("token=%v", token != ""), func(t *testing.T) {
			t.Parallel()
			pool := fleetPool(t)
			s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token}})
			var csrf string
			if token != "" {
				csrf = s.signIn(token)
			}
			sources := idsOf(t, pool, "alpha")
			cancelJob := func(job int64, header ...string) *http.Response {
				res, _ := s.do(http.MethodPost, "/riverui/api/jobs/cancel", strings.NewReader(fmt.Sprintf(`{"ids":["%d"]}`, job)), header...)
				return res
			}
			refused := []struct {
				name   string
				header []string
				status int
			}{
				{"another site (Origin and Sec-Fetch-Site)", []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site", "Content-Type", "text/plain"}, http.StatusForbidden},
				{"another site (Origin only)", []string{"Origin", "https://evil.example", "Content-Type", "application/json"}, http.StatusForbidden},
				{"a sibling origin of the same site", []string{"Origin", "http://other.localhost:1", "Sec-Fetch-Site", "same-site", "Content-Type", "application/json"}, http.StatusForbidden},
				{"another port of this host", []string{"Origin", "http://127.0.0.1:1", "Content-Type", "application/json"}, http.StatusForbidden},
				{"an opaque origin", []string{"Origin", "null", "Content-Type", "application/json"}, http.StatusForbidden},
				{"no browser headers, not JSON", []string{"Content-Type", "text/plain"}, http.StatusUnsupportedMediaType},
			}
			job := queuedJob(t, pool, sources[0])
			for _, c := range refused {
				if res := cancelJob(job, c.header...); res.StatusCode != c.status {
					t.Errorf("River UI cancel from %s: %d, want %d", c.name, res.StatusCode, c.status)
				}
				if c.status != http.StatusForbidden {
					continue // a form without browser headers is a command-line client's
				}
				if res, _ := s.form("/platforms/alpha/pause", url.Values{"csrf": {csrf}}, c.header[:len(c.header)-2]...); res.StatusCode != http.StatusForbidden {
					t.Errorf("dashboard pause from %s: %d, want 403", c.name, res.StatusCode)
				}
			}
			if state := jobState(t, pool, job); state != "available" {
				t.Fatalf("job %d is %s after refused cancels, want available", job, state)
			}
			assertUnchanged(t, pool)
			// What must keep working.
			if res := cancelJob(job, "Sec-Fetch-Site", "same-origin", "Origin", s.base, "Content-Type", "text/plain;charset=UTF-8"); res.StatusCode != http.StatusOK {
				t.Errorf("River UI's own cancel: %d, want 200", res.StatusCode)
			}
			if state := jobState(t, pool, job); state != "cancelled" {
				t.Errorf("job %d is %s after River UI's own cancel, want cancelled", job, state)
			}
			other := queuedJob(t, pool, sources[1])
			if res := cancelJob(other, "Content-Type", "application/json"); res.StatusCode != http.StatusOK {
				t.Errorf("a command-line JSON cancel: %d, want 200", res.StatusCode)
			}
		})
	}
}

func idsOf(t *testing.T, pool *pgxpool.Pool, platform string) []int64 {
	t.Helper()
	return storetest.Column[int64](t, pool, `SELECT id FROM fleetpace_source WHERE platform = $1 AND enabled AND queued_at IS NULL ORDER BY id`, platform)
}

// A request naming another host (DNS rebinding: a page of another site
// whose name now resolves to this server) is refused, whatever it asks;
// the loopback names, the listening address and the allowed hosts are
// answered. River UI and every answer carry the security headers.
func TestRebinding(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AllowedHosts: []string{"Dash.Example.", "10.9.8.7"}}})
	_, port, _ := net.SplitHostPort(s.addr)
	job := queuedJob(t, pool, idsOf(t, pool, "alpha")[0])
	paths := []string{"/", "/platforms/alpha", "/riverui/", fmt.Sprintf("/riverui/api/jobs/%d", job), "/riverui/api/jobs?state=available", "/assets/style.css", "/login"}
	for _, host := range []string{"rebind.attacker.example", "rebind.attacker.example:" + port, "127.0.0.1.nip.example", "dash.example.attacker.example"} {
		for _, path := range paths {
			res, body := s.do(http.MethodGet, path, nil, "Host", host, "Accept", "text/html,application/json")
			if res.StatusCode != http.StatusMisdirectedRequest || strings.Contains(body, "a.example") {
				t.Errorf("GET %s with Host %s: %d, want 421 and nothing of the data", path, host, res.StatusCode)
			}
		}
		if res := cancelWithHost(s, job, host); res != http.StatusMisdirectedRequest {
			t.Errorf("River UI cancel with Host %s: %d, want 421", host, res)
		}
	}
	if state := jobState(t, pool, job); state != "available" {
		t.Errorf("job %d is %s after a rebinding cancel, want available", job, state)
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST", "[::1]:" + port, "dash.example", "dash.example:8443", "10.9.8.7"} {
		if res, _ := s.do(http.MethodGet, "/", nil, "Host", host); res.StatusCode != http.StatusOK {
			t.Errorf("GET / with Host %s: %d, want 200", host, res.StatusCode)
		}
	}
	for _, path := range []string{"/", "/riverui/", "/riverui/api/jobs?state=available"} {
		res, _ := s.do(http.MethodGet, path, nil, "Accept", "text/html")
		h := res.Header
		if !strings.Contains(h.Get("Content-Security-Policy"), "frame-ancestors 'none'") || h.Get("X-Frame-Options") != "DENY" ||
			h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "same-origin" {
			t.Errorf("GET %s: security headers missing: %v", path, h)
		}
	}
}

func cancelWithHost(s *served, job int64, host string) int {
	res, _ := s.do(http.MethodPost, "/riverui/api/jobs/cancel", strings.NewReader(fmt.Sprintf(`{"ids":["%d"]}`, job)),
		"Host", host, "Content-Type", "application/json")
	return res.StatusCode
}

// A body sent slowly is cut off by the read timeout, and an idle
// keep-alive connection by the idle timeout: neither holds the server.
func TestSlowClients(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token},
		ReadTimeout: time.Second, IdleTimeout: time.Second})
	// A sign-in whose body never ends.
	conn := dial(t, s.addr)
	fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntoken=", s.addr)
	closedWithin(t, conn, 10*time.Second, "a slow body")
	// A keep-alive connection left idle after one request.
	conn = dial(t, s.addr)
	fmt.Fprintf(conn, "GET /healthz-no-such-page HTTP/1.1\r\nHost: %s\r\n\r\n", s.addr)
	closedWithin(t, conn, 10*time.Second, "an idle keep-alive connection")
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// closedWithin reads conn until the server closes it, failing the test if
// it is still open after d.
func closedWithin(t *testing.T, conn net.Conn, d time.Duration, what string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("%s: the connection is still open after %s", what, d)
	}
}

// A body too large is refused before it is parsed — a multipart upload to
// the sign-in page at once (415), a form over dashboard.MaxBodyBytes with
// 413 — and so is a header over dashboard.MaxHeaderBytes (431).
func TestOversizedBodies(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token}})
	// A 60-MB upload, more than net/http keeps in memory before it spools
	// to disk: refused from its header, before any of its body is sent.
	if status := rawStatus(t, s.addr, "POST /login HTTP/1.1\r\nHost: "+s.addr+"\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: 62914560\r\n\r\n--b\r\n"); status != "415" {
		t.Errorf("multipart sign-in: %s, want 415 before the body", status)
	}
	big := url.Values{"token": {token}, "back": {"/"}, "pad": {strings.Repeat("x", dashboard.MaxBodyBytes)}}
	if res, _ := s.form("/login", big); res.StatusCode != http.StatusRequestEntityTooLarge || len(res.Cookies()) != 0 {
		t.Errorf("sign-in with a %d-byte form: %d, want 413 and no session", len(big.Encode()), res.StatusCode)
	}
	csrf := s.signIn(token)
	big = url.Values{"csrf": {csrf}, "reason": {strings.Repeat("x", dashboard.MaxBodyBytes)}}
	if res, _ := s.form("/platforms/alpha/pause", big); res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("pause with a %d-byte form: %d, want 413", len(big.Encode()), res.StatusCode)
	}
	body, ctype := multipartBody(t, 1<<10)
	if res, _ := s.do(http.MethodPost, "/platforms/alpha/pause", body, "Content-Type", ctype); res.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("multipart pause: %d, want 415", res.StatusCode)
	}
	assertUnchanged(t, pool)
	if res, _ := s.do(http.MethodGet, "/", nil, "X-Padding", strings.Repeat("x", 2*dashboard.MaxHeaderBytes)); res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a %d-byte header: %d, want 431", 2*dashboard.MaxHeaderBytes, res.StatusCode)
	}
}

// rawStatus sends head on a new connection and returns the status code of
// the answer (failing the test if none comes within 10 s).
func rawStatus(t *testing.T, addr, head string) string {
	t.Helper()
	conn := dial(t, addr)
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("no answer to %.40q: %v", head, err)
	}
	if f := strings.Fields(line); len(f) >= 2 {
		return f[1]
	}
	return line
}

// An address over its limit of wrong tokens is refused before its form is
// read: a sign-in announcing a megabyte it never sends gets 429 at once.
func TestSignInLimitedBeforeParsing(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token}})
	for i := range dashboard.SignInBurst {
		if res, _ := s.form("/login", url.Values{"token": {fmt.Sprint("guess", i)}}); res.StatusCode != http.StatusForbidden {
			t.Fatalf("wrong token %d: %d, want 403", i+1, res.StatusCode)
		}
	}
	head := "POST /login HTTP/1.1\r\nHost: " + s.addr + "\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1048576\r\n\r\n"
	if status := rawStatus(t, s.addr, head); status != "429" {
		t.Errorf("a limited address's sign-in: %s, want 429 before its body", status)
	}
}

// multipartBody is a multipart form with a token field and a file of n
// bytes, streamed.
func multipartBody(t *testing.T, n int64) (io.Reader, string) {
	t.Helper()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		_ = mw.WriteField("token", "x")
		f, err := mw.CreateFormFile("f", "big.bin")
		if err == nil {
			_, err = io.Copy(f, io.LimitReader(zeros{}, n))
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	t.Cleanup(func() { pr.Close() })
	return pr, mw.FormDataContentType()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Shutting down closes what is still open once the shutdown timeout has
// run out (a body sent slowly) and returns nil.
func TestShutdownClosesStragglers(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token},
		ReadTimeout: time.Hour, ShutdownTimeout: 500 * time.Millisecond})
	conn := dial(t, s.addr)
	fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntoken=", s.addr)
	if res, _ := s.do(http.MethodGet, "/login", nil); res.StatusCode != http.StatusOK { // the server took both connections
		t.Fatalf("GET /login: %d", res.StatusCode)
	}
	start := time.Now()
	if err := s.stop(); err != nil {
		t.Errorf("Serve after a shutdown with a slow request open: %v, want nil", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("shutdown took %s with a 500-ms shutdown timeout", took)
	}
	closedWithin(t, conn, 5*time.Second, "the straggler after the shutdown")
}

// `fleetpace dashboard` stopped by SIGTERM while a client sends its body
// slowly exits 0, at once after the shutdown timeout.
func TestSIGTERMWithSlowClientExitsZero(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	cmd := osexec.Command(binary, "dashboard", "--database-url", dbURL, "--http-addr", "127.0.0.1:0", "--admin-token", token)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addrRE := regexp.MustCompile(`msg="http server listening" addr=(\S+)`)
	lines := bufio.NewScanner(stderr)
	var addr string
	var log strings.Builder
	for addr == "" && lines.Scan() {
		log.WriteString(lines.Text() + "\n")
		if m := addrRE.FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("no address logged:\n%s", log.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	conn := dial(t, addr)
	fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntoken=", addr)
	res, err := http.Get("http://" + addr + "/login") // answered: the slow connection was accepted first
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); err != nil || code != 0 {
		t.Errorf("exit after SIGTERM with a slow client: %v (code %d), want 0", err, code)
	}
	if took := time.Since(start); took > dashboard.DefaultShutdownTimeout+5*time.Second {
		t.Errorf("exit took %s after SIGTERM", took)
	}
}

// Every spelling of a path that a browser would follow off-site is
// refused as the place to go back to after signing in (the sign-in goes
// to / instead); a path of the dashboard is kept.
func TestOpenRedirects(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token}})
	for _, back := range []string{
		"//evil.example/x", "///evil.example/x", "/\\evil.example/x", "\\\\evil.example/x", "/\\/evil.example/x",
		"/\t/evil.example/x", "/\n/evil.example/x", "/\r/evil.example/x", "/\t\\evil.example/x", "\t//evil.example/x",
		" //evil.example/x", "/ /evil.example/x", "/\u00a0/evil.example/x", "/\u200b/evil.example/x", "/\u2028/evil.example/x",
		"https://evil.example/", "HTTPS://evil.example/", "javascript:alert(1)", "evil.example", "/%0a/x\x7f",
		"/\x0b/evil.example/x", "/\x0c/evil.example/x", "/\x1f/evil.example/x", "/%2F%2Fevil.example",
	} {
		res, _ := s.form("/login", url.Values{"token": {token}, "back": {back}})
		if loc := res.Header.Get("Location"); res.StatusCode != http.StatusSeeOther || loc != "/" {
			t.Errorf("sign-in back to %q: %d to %q, want 303 to /", back, res.StatusCode, loc)
		}
		_, page := s.do(http.MethodGet, "/login?back="+url.QueryEscape(back), nil)
		if !strings.Contains(page, `name="back" value="/"`) {
			t.Errorf("the sign-in form for back=%q does not go back to /", back)
		}
	}
	for _, back := range []string{"/platforms/alpha?n=5", "/sources/7#history", "/a/%2F%2Fb"} {
		res, _ := s.form("/login", url.Values{"token": {token}, "back": {back}})
		if loc := res.Header.Get("Location"); loc != back {
			t.Errorf("sign-in back to %q: to %q, want it kept", back, loc)
		}
		if u, err := url.Parse(s.base); err != nil || mustResolve(t, s.base, back).Host != u.Host {
			t.Errorf("%q leaves the server", back)
		}
	}
}

func mustResolve(t *testing.T, base, ref string) *url.URL {
	t.Helper()
	b, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	r, err := url.Parse(ref)
	if err != nil {
		t.Fatal(err)
	}
	return b.ResolveReference(r)
}

// Signing out ends the session for good: its cookie and CSRF token,
// replayed after the sign-out, are refused — in this process and in
// another sharing the database — and nothing changes.
func TestLogoutReplay(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token}})
	other := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token}})
	csrf := s.signIn(token)
	u, _ := url.Parse(s.base)
	cookies := s.client.Jar.Cookies(u)
	if len(cookies) != 1 {
		t.Fatalf("cookies after sign-in: %v", cookies)
	}
	// The other process takes the same session (same token, same database).
	o, _ := url.Parse(other.base)
	other.client.Jar.SetCookies(o, cookies)
	if _, page := other.do(http.MethodGet, "/", nil); !strings.Contains(page, "Sign out") {
		t.Fatalf("another process does not take the session before the sign-out")
	}
	if res, _ := s.form("/logout", url.Values{}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", res.StatusCode)
	}
	for name, site := range map[string]*served{"this process": s, "another process": other} {
		base, _ := url.Parse(site.base)
		site.client.Jar.SetCookies(base, cookies) // the replay
		if res, body := site.form("/platforms/alpha/pause", url.Values{"csrf": {csrf}, "back": {"/"}}); res.StatusCode != http.StatusForbidden {
			t.Errorf("%s: a replayed cookie after the sign-out: %d, want 403\n%s", name, res.StatusCode, body)
		}
		if _, page := site.do(http.MethodGet, "/", nil); strings.Contains(page, "Sign out") {
			t.Errorf("%s: a replayed cookie is still signed in", name)
		}
	}
	assertUnchanged(t, pool)
	// A new sign-in works.
	csrf = s.signIn(token)
	if res, _ := s.form("/platforms/alpha/pause", url.Values{"csrf": {csrf}, "back": {"/"}}); res.StatusCode != http.StatusSeeOther {
		t.Errorf("pause after signing in again: %d", res.StatusCode)
	}
}

// A NUL or bytes that are not UTF-8 in a path, a query parameter or a form
// field are bad input (400), not a failure: nothing is logged as an error
// or as the database being unreachable.
func TestBadBytes(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token}})
	for _, path := range []string{
		"/?after=%00", "/?after=%FF", "/?n=5&after=a%00b", "/platforms/alpha?before=%00", "/sources?platform=%00&url=x",
		"/sources?platform=alpha&url=%FE", "/platforms/%00", "/platforms/%C3", "/sources/%00", "/platforms?name=%00",
		"/login?back=%00", "/riverui/api/jobs?state=%00", "/?%00=1",
	} {
		if res, _ := s.do(http.MethodGet, path, nil); res.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", path, res.StatusCode)
		}
	}
	csrf := s.signIn(token)
	for _, reason := range []string{"a\x00b", "\xff\xfe"} {
		if res, _ := s.form("/platforms/alpha/pause", url.Values{"csrf": {csrf}, "reason": {reason}}); res.StatusCode != http.StatusBadRequest {
			t.Errorf("pause with the reason %q: %d, want 400", reason, res.StatusCode)
		}
	}
	assertUnchanged(t, pool)
	s.noFailureLogged()
}

// Every value from outside the dashboard — source URLs, failure reasons,
// pause, cooldown and hold reasons, validators, the workers' host names,
// versions and ids — is shown in a <bdi>, its bidirectional controls
// visible, so an override cannot reorder what the operator reads
// (…/\u202Egnp.exe is not shown as …/exe.png).
func TestBidiIsolation(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	ctx := context.Background()
	const rlo = "\u202e"
	storetest.Platform(t, pool, sources.Platform{Name: "bidi", RatePerSec: 1})
	id := storetest.Source(t, pool, sources.NewSource{Platform: "bidi", URL: "https://h.example/" + rlo + "gnp.exe"})
	exec(t, pool, `UPDATE fleetpace_source SET consecutive_failures = 1, last_checked_at = now(), due_at = now() - interval '1 minute',
		last_outcome = 'failed', last_error = $1, etag = $1, last_modified = $1 WHERE id = $2`, "reason "+rlo+"txet", id)
	exec(t, pool, `INSERT INTO fleetpace_check (source_id, platform, outcome, reason, worker) VALUES ($1, 'bidi', 'failed', $2, $2)`, id, "check "+rlo+"txet")
	exec(t, pool, `INSERT INTO fleetpace_worker (id, hostname, pid, version) VALUES ($1, $1, 1, $1)`, "w"+rlo+"1")
	if err := pacer.Pause(ctx, pool, "bidi", time.Time{}, "pause "+rlo+"txet"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := control.CoolDown(ctx, pool, "bidi", sources.CauseStop, time.Hour, "cool "+rlo+"txet", 1); err != nil {
		t.Fatal(err)
	}
	s := serve(t, pool, dashboard.ServerConfig{})
	const (
		link   = "https://h.example/[U+202E]gnp.exe"
		reason = "reason [U+202E]txet"
		pause  = "pause [U+202E]txet"
		cool   = "cool [U+202E]txet"
		w      = "w[U+202E]1"
	)
	source := fmt.Sprintf("/sources/%d", id)
	want := map[string][]string{
		"/":               {pause, cool, w},
		"/platforms/bidi": {pause, cool, link, reason},
		source:            {link, reason, "check [U+202E]txet", pause, cool},
	}
	for _, path := range []string{"/", "/platforms/bidi", source} {
		res, page := s.do(http.MethodGet, path, nil)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, res.StatusCode)
		}
		if strings.Contains(page, rlo) {
			t.Errorf("GET %s shows a raw U+202E", path)
		}
		outside := regexp.MustCompile(`(?s)<bdi>[^<]*</bdi>|<title>.*?</title>`).ReplaceAllString(page, "")
		if strings.Contains(outside, "[U+202E]") {
			t.Errorf("GET %s shows a value from outside that is not in a <bdi>:\n%s", path, outside)
		}
		for _, v := range want[path] {
			if !strings.Contains(page, "<bdi>"+v+"</bdi>") {
				t.Errorf("GET %s does not show %q in a <bdi>", path, v)
			}
		}
		if !strings.Contains(page, "[U+202E]") {
			t.Errorf("GET %s does not show the control", path)
		}
	}
}

// Behind a TLS-terminating proxy that says so (X-Forwarded-Proto: https),
// the session cookie is Secure when the server trusts the proxy's
// headers, and not otherwise.
func TestSecureCookieBehindProxy(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	for _, trust := range []bool{false, true} {
		s := serve(t, pool, dashboard.ServerConfig{Dashboard: dashboard.Config{AdminToken: token, TrustProxyHeaders: trust}})
		res, _ := s.form("/login", url.Values{"token": {token}}, "X-Forwarded-Proto", "https")
		if c := res.Cookies(); len(c) != 1 || c[0].Secure != trust {
			t.Errorf("trust %v: cookies %v, want one, Secure %v", trust, c, trust)
		}
	}
}

// Beyond loopback with a token, every page, River UI and the other
// endpoints need sign-in (a page is sent to sign in, the rest get 401);
// the sign-in page answers; PublicRead keeps the pages readable, not
// River UI. A token shorter than dashboard.MinTokenBytes is refused there.
func TestSignInToReadBeyondLoopback(t *testing.T) {
	t.Parallel()
	pool := fleetPool(t)
	status := dashboard.Endpoint{Pattern: "GET /status", Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "{}") })}
	open := dashboard.Endpoint{Pattern: "GET /healthz", Open: true, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })}
	for _, bad := range []string{"x", " ", strings.Repeat("x", dashboard.MinTokenBytes-1), " " + longToken, longToken + "\n"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // a Serve that takes it serves until then
		err := dashboard.Serve(ctx, dashboard.ServerConfig{Addr: "0.0.0.0:0", Dashboard: dashboard.Config{DB: pool, AdminToken: bad}})
		cancel()
		if !errors.Is(err, dashboard.ErrInvalidConfig) || !strings.Contains(err.Error(), "AdminToken") || (len(bad) > 8 && strings.Contains(err.Error(), strings.TrimSpace(bad))) {
			t.Errorf("Serve on 0.0.0.0 with a token of %d bytes: %v, want ErrInvalidConfig naming AdminToken, not the token", len(bad), err)
		}
	}
	s := serve(t, pool, dashboard.ServerConfig{Addr: "0.0.0.0:0", Dashboard: dashboard.Config{AdminToken: longToken, Endpoints: []dashboard.Endpoint{status, open}}})
	for path, want := range map[string]int{"/": http.StatusSeeOther, "/platforms/alpha": http.StatusSeeOther, "/riverui/": http.StatusSeeOther,
		"/riverui/api/jobs?state=available": http.StatusUnauthorized, "/login": http.StatusOK, "/assets/style.css": http.StatusOK, "/healthz": http.StatusOK} {
		if res, body := s.do(http.MethodGet, path, nil, "Accept", "text/html"); res.StatusCode != want || strings.Contains(body, "a.example") {
			t.Errorf("GET %s without sign-in beyond loopback: %d, want %d without data", path, res.StatusCode, want)
		}
	}
	if res, _ := s.do(http.MethodGet, "/status", nil); res.StatusCode != http.StatusSeeOther {
		t.Errorf("GET /status without sign-in beyond loopback: %d, want 303 to sign in", res.StatusCode)
	}
	if !strings.Contains(s.logs.String(), "need sign-in") || !strings.Contains(s.logs.String(), "/healthz") {
		t.Errorf("the start does not say what is public:\n%s", s.logs.String())
	}
	s.signIn(longToken)
	s.everyPageRenders(pages(t, pool))

	public := serve(t, pool, dashboard.ServerConfig{Addr: "0.0.0.0:0", Dashboard: dashboard.Config{AdminToken: longToken, PublicRead: true}})
	public.everyPageRenders(pages(t, pool))
	if res, _ := public.do(http.MethodGet, "/riverui/", nil, "Accept", "text/html"); res.StatusCode != http.StatusSeeOther {
		t.Errorf("River UI with PublicRead, not signed in: %d, want 303 to sign in", res.StatusCode)
	}
	if !strings.Contains(public.logs.String(), "level=WARN") || !strings.Contains(public.logs.String(), "public-read") {
		t.Errorf("the start with PublicRead does not warn:\n%s", public.logs.String())
	}
}

// A source whose URL holds a secret-looking query parameter is shown with
// the value masked (so is a URL in a failure reason), and queued by id
// alone: River UI, which shows job args, never has the secret.
func TestSecretQueryParameters(t *testing.T) {
	t.Parallel()
	pool := storetest.Pool(t, sources.Platform{Name: "api", RatePerSec: 1})
	id := storetest.Source(t, pool, sources.NewSource{Platform: "api", URL: "https://api.example/feed?page=2&api_key=s3cretKEY&Access-Token=s3cretTOK"})
	plain := storetest.Source(t, pool, sources.NewSource{Platform: "api", URL: "https://api.example/public?page=3"})
	exec(t, pool, `UPDATE fleetpace_source SET consecutive_failures = 1, last_checked_at = now(), due_at = now() - interval '1 minute'`)
	// A reason recorded before fetch masked it.
	exec(t, pool, `UPDATE fleetpace_source SET last_error = 'HTTP 302 Found to https://cdn.example/f?token=s3cretRSN (redirect not followed)' WHERE id = $1`, id)
	s := serve(t, pool, dashboard.ServerConfig{})
	job := queuedJob(t, pool, id)
	plainJob := queuedJob(t, pool, plain)
	for _, path := range []string{"/platforms/api", fmt.Sprintf("/sources/%d", id), fmt.Sprintf("/riverui/api/jobs/%d", job)} {
		_, page := s.do(http.MethodGet, path, nil, "Accept", "text/html,application/json")
		if strings.Contains(page, "s3cret") {
			t.Errorf("GET %s shows the secret", path)
		}
	}
	if _, page := s.do(http.MethodGet, "/platforms/api", nil); !strings.Contains(page, "api_key=xxxxx&amp;Access-Token=xxxxx") {
		t.Errorf("the platform page does not show the URL masked")
	}
	if _, page := s.do(http.MethodGet, fmt.Sprintf("/riverui/api/jobs/%d", plainJob), nil, "Accept", "application/json"); !strings.Contains(page, "public?page=3") {
		t.Errorf("a URL without secrets is not in its job's args: %s", page)
	}
}

// River UI in a real browser behind the guard, without a token (the case
// where any website could act): it renders under its Content-Security-
// Policy and its own Cancel button cancels a job (its script posts JSON as
// text/plain from the same origin); a page of another origin — another
// port of this host — that posts the same request does not cancel the
// other job, nor pause a platform.
func TestRiverUIInBrowser(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: drives a real browser")
	}
	pool := fleetPool(t)
	s := serve(t, pool, dashboard.ServerConfig{})
	ids := idsOf(t, pool, "alpha")
	mine, theirs := queuedJob(t, pool, ids[0]), queuedJob(t, pool, ids[1])
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `<!doctype html><title>evil</title><form id="f" method="post" action="%[1]s/platforms/beta/resume"></form><script>
fetch(%[1]q + "/riverui/api/jobs/cancel", {method: "POST", mode: "no-cors", body: JSON.stringify({ids: ["%[2]d"]})})
  .finally(() => { document.title = "sent"; });
</script>`, s.base, theirs)
	}))
	t.Cleanup(evil.Close)

	b := browser.New(t, 1200, 800)
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	run("River UI shows the job and cancels it with its own button",
		chromedp.Navigate(fmt.Sprintf("%s/riverui/jobs/%d", s.base, mine)),
		chromedp.WaitVisible(chromedp.Search(`//*[contains(text(), "fleetpace_fetch")]`)),
		chromedp.Click(chromedp.Search(`//button[normalize-space()="Cancel"]`)))
	waitFor(t, "River UI's cancel", func() bool { return jobState(t, pool, mine) == "cancelled" })

	run("a page of another origin posts to River UI", chromedp.Navigate(evil.URL),
		chromedp.Poll[chromedp.Void](`document.title === "sent"`))
	if state := jobState(t, pool, theirs); state != "available" {
		t.Errorf("job %d is %s after another origin's post, want available", theirs, state)
	}
	run("a page of another origin submits a form to the dashboard", chromedp.Navigate(evil.URL),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("f").submit()`))
	waitFor(t, "the form's answer", func() bool {
		page, err := chromedp.Run(b, chromedp.Evaluate[string](`location.href + " " + document.body.innerText`))
		return err == nil && strings.HasPrefix(page, s.base+"/platforms/beta/resume ") && strings.Contains(page, "cross-origin request refused")
	})
	assertUnchanged(t, pool)
	if !strings.Contains(s.logs.String(), "cross-origin request refused") {
		t.Errorf("the refusal is not logged")
	}
}

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
