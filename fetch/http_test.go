package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/jonboulle/clockwork"
)

// setup returns an HTTP fetcher for cfg, closed when the test ends.
func setup(t *testing.T, cfg HTTPConfig) *HTTP {
	t.Helper()
	h, err := NewHTTP(cfg)
	if err != nil {
		t.Fatalf("NewHTTP: %v", err)
	}
	t.Cleanup(h.CloseIdleConnections)
	return h
}

// server starts a test server on 127.0.0.1 counting its requests.
func server(t *testing.T, handler http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		handler(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestConditionalGet(t *testing.T) {
	t.Parallel()
	body := []byte("the feed, version 1")
	const lastMod = "Mon, 02 Jan 2006 15:04:05 GMT"
	var gotINM, gotIMS, gotUA atomic.Value
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		gotINM.Store(r.Header.Get("If-None-Match"))
		gotIMS.Store(r.Header.Get("If-Modified-Since"))
		gotUA.Store(r.Header.Get("User-Agent"))
		if r.Header.Get("If-None-Match") == `"v1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("ETag", `"v1"`)
		w.Header().Set("Last-Modified", lastMod)
		w.Write(body)
	})
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true})

	res := h.Fetch(t.Context(), Request{URL: srv.URL})
	if res.Outcome != OK || res.Status != 200 {
		t.Fatalf("first fetch: %+v, want ok 200", res)
	}
	if res.ETag != `"v1"` || res.LastModified != lastMod {
		t.Errorf("validators = %q %q", res.ETag, res.LastModified)
	}
	if res.ContentHash != sha(body) || res.Bytes != int64(len(body)) {
		t.Errorf("hash/bytes = %s %d, want %s %d", res.ContentHash, res.Bytes, sha(body), len(body))
	}
	if res.Duration <= 0 {
		t.Errorf("Duration = %v", res.Duration)
	}
	if gotINM.Load() != "" || gotIMS.Load() != "" {
		t.Errorf("first request was conditional: %q %q", gotINM.Load(), gotIMS.Load())
	}
	if ua := gotUA.Load().(string); ua != DefaultUserAgent || !strings.HasPrefix(ua, "fleetpace/") {
		t.Errorf("User-Agent = %q, want %q", ua, DefaultUserAgent)
	}

	res2 := h.Fetch(t.Context(), Request{URL: srv.URL, ETag: res.ETag, LastModified: res.LastModified})
	if res2.Outcome != NotModified || res2.Status != 304 {
		t.Fatalf("second fetch: %+v, want not_modified 304", res2)
	}
	if gotINM.Load() != `"v1"` || gotIMS.Load() != lastMod {
		t.Errorf("conditional headers sent = %q %q", gotINM.Load(), gotIMS.Load())
	}
	// The 304 carried no validators: the request's are kept.
	if res2.ETag != `"v1"` || res2.LastModified != lastMod || res2.ContentHash != "" {
		t.Errorf("304 result = %+v, want validators kept and no hash", res2)
	}
}

func TestCustomUserAgent(t *testing.T) {
	t.Parallel()
	var ua atomic.Value
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) { ua.Store(r.Header.Get("User-Agent")) })
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true, UserAgent: "mybot/1.0"})
	if res := h.Fetch(t.Context(), Request{URL: srv.URL}); res.Outcome != OK {
		t.Fatalf("fetch: %+v", res)
	}
	if ua.Load() != "mybot/1.0" {
		t.Errorf("User-Agent = %q", ua.Load())
	}
}

func TestStatusClassification(t *testing.T) {
	t.Parallel()
	fake := clocktest.New()
	now := fake.Now()
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		// /STATUS?ra=VALUE
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		if ra := r.URL.Query().Get("ra"); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		w.WriteHeader(code)
		fmt.Fprint(w, "error page")
	})
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }

	tests := []struct {
		name      string
		path      string
		retryAfer string
		limitAt   time.Duration // HTTPConfig.RateLimitedAfter
		want      Outcome
		wantRA    time.Duration
		reason    string // substring of Reason
	}{
		{name: "429 seconds", path: "/429", retryAfer: "30", want: RatePressure, wantRA: 30 * time.Second},
		{name: "429 http-date", path: "/429", retryAfer: date(45 * time.Second), want: RatePressure, wantRA: 45 * time.Second},
		{name: "429 no retry-after", path: "/429", want: RatePressure},
		{name: "429 garbage", path: "/429", retryAfer: "soon", want: RatePressure},
		{name: "429 negative", path: "/429", retryAfer: "-5", want: RatePressure},
		{name: "429 past date", path: "/429", retryAfer: date(-time.Hour), want: RatePressure},
		{name: "429 at threshold", path: "/429", retryAfer: "60", want: RatePressure, wantRA: time.Minute},
		{name: "429 promoted", path: "/429", retryAfer: "61", want: RateLimited, wantRA: 61 * time.Second, reason: "HTTP 429 Too Many Requests with Retry-After 1m1s (over 1m0s)"},
		{name: "429 date promoted", path: "/429", retryAfer: date(10 * time.Minute), want: RateLimited, wantRA: 10 * time.Minute, reason: "Retry-After 10m0s"},
		{name: "429 custom threshold", path: "/429", retryAfer: "30", limitAt: 10 * time.Second, want: RateLimited, wantRA: 30 * time.Second, reason: "over 10s"},
		{name: "429 overflowing", path: "/429", retryAfer: "99999999999999999999", want: RateLimited, wantRA: ratelimit.MaxWait, reason: "Retry-After 24h0m0s"},
		{name: "429 over a day", path: "/429", retryAfer: "86401", want: RateLimited, wantRA: ratelimit.MaxWait},
		{name: "429 year 9999", path: "/429", retryAfer: "Fri, 31 Dec 9999 23:59:59 GMT", want: RateLimited, wantRA: ratelimit.MaxWait},
		{name: "429 fractional", path: "/429", retryAfer: "1.5", want: RatePressure},
		{name: "429 64 KiB of digits", path: "/429", retryAfer: strings.Repeat("9", 64<<10), want: RateLimited, wantRA: ratelimit.MaxWait},
		{name: "503", path: "/503", want: RatePressure},
		{name: "503 seconds", path: "/503", retryAfer: "5", want: RatePressure, wantRA: 5 * time.Second},
		{name: "503 promoted", path: "/503", retryAfer: "3600", want: RateLimited, wantRA: time.Hour, reason: "HTTP 503"},
		{name: "500", path: "/500", want: Failed, reason: "HTTP 500 Internal Server Error"},
		{name: "404", path: "/404", want: Failed, reason: "HTTP 404 Not Found"},
		{name: "403 ignores retry-after", path: "/403", retryAfer: "3600", want: Failed, reason: "HTTP 403 Forbidden"},
		{name: "unknown status", path: "/599", want: Failed, reason: "HTTP 599"},
		{name: "204", path: "/204", want: OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t, HTTPConfig{
				AllowPrivateNetworks: true,
				RateLimitedAfter:     tt.limitAt,
				Clock:                fake,
			})
			u := srv.URL + tt.path
			if tt.retryAfer != "" {
				u += "?ra=" + strings.ReplaceAll(tt.retryAfer, " ", "%20")
			}
			req := Request{URL: u, ETag: `"old"`, LastModified: "then"}
			res := h.Fetch(t.Context(), req)
			if res.Outcome != tt.want || res.RetryAfter != tt.wantRA {
				t.Fatalf("got %s RetryAfter %v (%q), want %s %v", res.Outcome, res.RetryAfter, res.Reason, tt.want, tt.wantRA)
			}
			if res.RetryAfter != 0 && res.RateLimit.RetryAfter != res.RetryAfter {
				t.Errorf("RateLimit.RetryAfter = %v, RetryAfter %v", res.RateLimit.RetryAfter, res.RetryAfter)
			}
			if !strings.Contains(res.Reason, tt.reason) {
				t.Errorf("Reason = %q, want it to contain %q", res.Reason, tt.reason)
			}
			if (res.Outcome == Failed || res.Outcome == RateLimited) && res.Reason == "" {
				t.Errorf("no Reason for %s", res.Outcome)
			}
			if want, _ := strconv.Atoi(tt.path[1:]); res.Status != want {
				t.Errorf("Status = %d, want %d", res.Status, want)
			}
			if res.Outcome != OK {
				if res.ETag != req.ETag || res.LastModified != req.LastModified || res.ContentHash != "" || res.Bytes != 0 {
					t.Errorf("non-ok result must carry the request's validators and no body: %+v", res)
				}
			} else if res.ContentHash != sha(nil) {
				t.Errorf("204 hash = %q, want hash of empty body", res.ContentHash)
			}
		})
	}
}

// Every response's rate-limit headers reach Result.RateLimit, whatever the
// status, parsed against HTTPConfig.Clock.
func TestRateLimitInfo(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 30, 12, 0, 0, 0, time.UTC)
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		w.Header().Set("X-RateLimit-Limit", "60")
		w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(code%7))
		w.Header().Set("X-RateLimit-Reset", strconv.FormatInt(now.Add(30*time.Second).Unix(), 10))
		if code == 429 {
			w.Header().Set("Retry-After", "99999999999999999999")
		}
		w.WriteHeader(code)
	})
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true, Clock: clockwork.NewFakeClockAt(now)})
	for _, code := range []int{200, 304, 404, 429, 503} {
		res := h.Fetch(t.Context(), Request{URL: fmt.Sprintf("%s/%d", srv.URL, code), ETag: `"e"`})
		want := ratelimit.Info{Limit: 60, Remaining: float64(code % 7), HasRemaining: true,
			Reset: 30 * time.Second, HasReset: true, Form: ratelimit.XRateLimit}
		if code == 429 {
			want.RetryAfter, want.HasRetryAfter = ratelimit.MaxWait, true
		}
		if res.RateLimit != want {
			t.Errorf("%d: RateLimit = %+v, want %+v", code, res.RateLimit, want)
		}
	}
	res := h.Fetch(t.Context(), Request{URL: "http://127.0.0.1:1/"})
	if res.RateLimit != (ratelimit.Info{}) {
		t.Errorf("no response: RateLimit = %+v, want zero", res.RateLimit)
	}
}

// Invalid validators never leave the fetcher: a response's are dropped (the
// request's carried over for a 304), and an invalid stored one is neither
// sent nor carried over.
func TestValidatorsSanitised(t *testing.T) {
	t.Parallel()
	var gotINM atomic.Value
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		gotINM.Store(r.Header.Get("If-None-Match"))
		// Raw bytes, as a hostile server sends them.
		w.Header()["Etag"] = []string{r.URL.Query().Get("etag")}
		w.Header()["Last-Modified"] = []string{r.URL.Query().Get("lm")}
		code, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		w.WriteHeader(code)
	})
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true})
	q := func(code int, etag, lm string) string {
		return fmt.Sprintf("%s/%d?etag=%s&lm=%s", srv.URL, code, url.QueryEscape(etag), url.QueryEscape(lm))
	}
	long := `"` + strings.Repeat("a", MaxValidatorLen) + `"`
	const date = "Mon, 02 Jan 2006 15:04:05 GMT"

	tests := []struct {
		name             string
		url              string
		req              Request
		wantETag, wantLM string
		wantSent         string // If-None-Match received
	}{
		{"200 invalid UTF-8 etag dropped", q(200, "\"\xff\xfe\"", date), Request{}, "", date, ""},
		{"200 over-long etag dropped", q(200, long, "\xc3"), Request{}, "", "", ""},
		{"200 C1 control dropped", q(200, "\"a\u0085\"", date), Request{}, "", date, ""},
		{"200 fine kept", q(200, `"ok"`, date), Request{}, `"ok"`, date, ""},
		{"304 invalid: the request's kept", q(304, "\"\xff\"", "\xff"), Request{ETag: `"v1"`, LastModified: date}, `"v1"`, date, `"v1"`},
		{"stored invalid etag neither sent nor kept", q(500, "", ""), Request{ETag: "\"\xff\"", LastModified: "a\x00b"}, "", "", ""},
		{"stored fine etag sent and kept", q(500, "", ""), Request{ETag: `"v2"`}, `"v2"`, "", `"v2"`},
	}
	for _, tt := range tests {
		tt.req.URL = tt.url
		res := h.Fetch(t.Context(), tt.req)
		if res.Status == 0 {
			t.Fatalf("%s: %+v", tt.name, res)
		}
		if res.ETag != tt.wantETag || res.LastModified != tt.wantLM || gotINM.Load() != tt.wantSent {
			t.Errorf("%s: ETag %q Last-Modified %q sent %q; want %q %q %q", tt.name, res.ETag, res.LastModified, gotINM.Load(), tt.wantETag, tt.wantLM, tt.wantSent)
		}
	}
}

func TestBodyCap(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Write([]byte(strings.Repeat("x", n)))
	})
	dir := t.TempDir()
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true, MaxBodyBytes: 1000, StoreDir: dir})

	res := h.Fetch(t.Context(), Request{URL: srv.URL + "?n=1000"})
	if res.Outcome != OK || res.Bytes != 1000 {
		t.Fatalf("body at cap: %+v, want ok 1000 bytes", res)
	}
	res = h.Fetch(t.Context(), Request{URL: srv.URL + "?n=1001"})
	if res.Outcome != Failed || res.Reason != "body exceeds 1000 bytes" || res.ContentHash != "" {
		t.Fatalf("body over cap: %+v, want failed \"body exceeds 1000 bytes\"", res)
	}
	res = h.Fetch(t.Context(), Request{URL: srv.URL + "?n=5000000"})
	if res.Outcome != Failed || res.Reason != "body exceeds 1000 bytes" {
		t.Fatalf("big body: %+v", res)
	}
	// The largest cap works; a larger one (MaxInt64, whose + 1 once
	// overflowed into "no body at all") is refused.
	huge := setup(t, HTTPConfig{AllowPrivateNetworks: true, MaxBodyBytes: MaxBodyBytesLimit})
	if res := huge.Fetch(t.Context(), Request{URL: srv.URL + "?n=10"}); res.Outcome != OK || res.Bytes != 10 {
		t.Fatalf("MaxBodyBytes = MaxBodyBytesLimit: %+v, want ok 10 bytes", res)
	}
	if _, err := NewHTTP(HTTPConfig{MaxBodyBytes: math.MaxInt64}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("MaxBodyBytes = MaxInt64: %v, want ErrInvalidConfig", err)
	}
	// Only the body within the cap was stored; no temp file is left behind.
	files := storeFiles(t, dir)
	if len(files) != 1 || filepath.Base(files[0]) != sha([]byte(strings.Repeat("x", 1000))) {
		t.Errorf("store holds %v, want only the 1000-byte body", files)
	}
}

// storeFiles lists every regular file under dir.
func storeFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestRedirects(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		// /r/N redirects N more times, then answers 200.
		if rest, ok := strings.CutPrefix(r.URL.Path, "/r/"); ok {
			n, _ := strconv.Atoi(rest)
			if n > 0 {
				http.Redirect(w, r, fmt.Sprintf("/r/%d", n-1), http.StatusFound)
				return
			}
			fmt.Fprint(w, "arrived")
			return
		}
		if r.URL.Path == "/signed" {
			http.Redirect(w, r, "https://cdn.example/f?X-Amz-Signature=s3cret&v=1", http.StatusFound)
			return
		}
		if r.URL.Path == "/ftp" {
			http.Redirect(w, r, "ftp://example.com/file", http.StatusFound)
			return
		}
		if r.URL.Path == "/file" {
			http.Redirect(w, r, "file:///etc/passwd", http.StatusFound)
		}
	})

	tests := []struct {
		name     string
		max      int
		path     string
		want     Outcome
		status   int
		reason   string
		wantBody string
	}{
		{name: "5 redirects allowed", path: "/r/5", want: OK, status: 200, wantBody: "arrived"},
		{name: "6 redirects refused", path: "/r/6", want: Failed, reason: "stopped after 5 redirects"},
		{name: "custom cap", max: 2, path: "/r/3", want: Failed, reason: "stopped after 2 redirects"},
		{name: "custom cap ok", max: 2, path: "/r/2", want: OK, status: 200, wantBody: "arrived"},
		{name: "none followed", max: -1, path: "/r/1", want: Failed, status: 302, reason: "HTTP 302 Found to /r/0 (redirect not followed)"},
		{name: "not followed, secret masked", max: -1, path: "/signed", want: Failed, status: 302, reason: "HTTP 302 Found to https://cdn.example/f?X-Amz-Signature=xxxxx&v=1 (redirect not followed)"},
		{name: "ftp scheme", path: "/ftp", want: Failed, reason: `redirect to unsupported scheme "ftp"`},
		{name: "file scheme", path: "/file", want: Failed, reason: `redirect to unsupported scheme "file"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t, HTTPConfig{AllowPrivateNetworks: true, MaxRedirects: tt.max})
			res := h.Fetch(t.Context(), Request{URL: srv.URL + tt.path})
			if res.Outcome != tt.want || res.Status != tt.status || res.Reason != tt.reason {
				t.Fatalf("got %s %d %q, want %s %d %q", res.Outcome, res.Status, res.Reason, tt.want, tt.status, tt.reason)
			}
			if tt.wantBody != "" && res.ContentHash != sha([]byte(tt.wantBody)) {
				t.Errorf("hash is not the final hop's body")
			}
		})
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	body := []byte("stored body")
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) { w.Write(body) })
	dir := filepath.Join(t.TempDir(), "store", "nested") // created by NewHTTP
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true, StoreDir: dir})

	res := h.Fetch(t.Context(), Request{URL: srv.URL})
	if res.Outcome != OK {
		t.Fatalf("fetch: %+v", res)
	}
	path := filepath.Join(dir, res.ContentHash[:2], res.ContentHash)
	if StorePath(dir, res.ContentHash) != path {
		t.Errorf("StorePath = %s, want %s", StorePath(dir, res.ContentHash), path)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != string(body) {
		t.Fatalf("stored file %s: %q, %v", path, got, err)
	}
	// Backdate it: a rewrite would produce a new inode and a fresh mtime.
	old := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}

	res2 := h.Fetch(t.Context(), Request{URL: srv.URL})
	if res2.Outcome != OK || res2.ContentHash != res.ContentHash {
		t.Fatalf("second fetch: %+v", res2)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(old) {
		t.Errorf("identical body rewrote the stored file (same file %v, mtime %v)", os.SameFile(before, after), after.ModTime())
	}
	if files := storeFiles(t, dir); len(files) != 1 {
		t.Errorf("store holds %v, want exactly one file (no temp files)", files)
	}
}

func TestDiscardWithoutStore(t *testing.T) {
	t.Parallel()
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "discarded") })
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true})
	res := h.Fetch(t.Context(), Request{URL: srv.URL})
	if res.Outcome != OK || res.ContentHash != sha([]byte("discarded")) {
		t.Fatalf("fetch: %+v", res)
	}
}

// stall answers after headers (or before, with ?headers=0) by waiting until
// the client goes away.
func stall(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Get("headers") != "0" {
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(200)
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
	}
	select {
	case <-r.Context().Done():
	case <-time.After(20 * time.Second):
	}
}

func TestContextCancellation(t *testing.T) {
	t.Parallel()
	stalled(t, HTTPConfig{AllowPrivateNetworks: true}, "canceled", "after a cancel at 100ms",
		func(t *testing.T) context.Context {
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(100*time.Millisecond, cancel)
			return ctx
		},
		func(reason string) bool { return strings.HasPrefix(reason, "canceled:") })
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	stalled(t, HTTPConfig{AllowPrivateNetworks: true, Timeout: 200 * time.Millisecond}, "timeout", "with a 200ms timeout",
		(*testing.T).Context,
		func(reason string) bool { return reason == "timeout: no complete response within 200ms" })
}

// stalled fetches with cfg, in the context ctx makes, from a server that
// never finishes (20 s), stalling before its headers and then within its
// body: each fetch must fail with a reason ok accepts (want names it) well
// before the 30 s default timeout (within 5 s; why names the cause).
func stalled(t *testing.T, cfg HTTPConfig, want, why string, ctx func(*testing.T) context.Context, ok func(reason string) bool) {
	t.Helper()
	srv, _ := server(t, stall)
	for _, path := range []string{"/?headers=0", "/"} {
		t.Run("path"+path, func(t *testing.T) {
			t.Parallel()
			h := setup(t, cfg)
			ctx := ctx(t)
			start := time.Now()
			res := h.Fetch(ctx, Request{URL: srv.URL + path})
			elapsed := time.Since(start)
			if res.Outcome != Failed || !ok(res.Reason) {
				t.Fatalf("got %+v, want failed %s", res, want)
			}
			if elapsed > 5*time.Second {
				t.Errorf("fetch took %v %s", elapsed, why)
			}
		})
	}
}

func TestBadURLs(t *testing.T) {
	t.Parallel()
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true})
	tests := []struct{ url, reason string }{
		{"ftp://example.com/x", `unsupported URL scheme "ftp" (only http and https)`},
		{"file:///etc/passwd", `unsupported URL scheme "file" (only http and https)`},
		{"example.com/feed", `unsupported URL scheme "" (only http and https)`},
		{"http:///path", "invalid URL: no host"},
		{"http://exa mple.com/", "invalid URL"},
	}
	for _, tt := range tests {
		res := h.Fetch(t.Context(), Request{URL: tt.url})
		if res.Outcome != Failed || !strings.HasPrefix(res.Reason, tt.reason) {
			t.Errorf("%q: got %s %q, want failed %q", tt.url, res.Outcome, res.Reason, tt.reason)
		}
	}
}

func TestConnectionRefused(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true})
	res := h.Fetch(t.Context(), Request{URL: url})
	if res.Outcome != Failed || res.Status != 0 || !strings.HasPrefix(res.Reason, "transport: ") || !strings.Contains(res.Reason, "refused") {
		t.Fatalf("got %+v, want failed transport error", res)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg   HTTPConfig
		field string
	}{
		{HTTPConfig{Timeout: -1}, "Timeout"},
		{HTTPConfig{MaxBodyBytes: -1}, "MaxBodyBytes"},
		{HTTPConfig{MaxRedirects: -2}, "MaxRedirects"},
		{HTTPConfig{RateLimitedAfter: -time.Second}, "RateLimitedAfter"},
	}
	for _, tt := range tests {
		_, err := NewHTTP(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), "HTTPConfig."+tt.field) {
			t.Errorf("%+v: err = %v, want one naming %s", tt.cfg, err, tt.field)
		}
	}
	h, err := NewHTTP(HTTPConfig{})
	if err != nil {
		t.Fatalf("zero config: %v", err)
	}
	c := h.cfg
	if c.Timeout != 30*time.Second || c.MaxBodyBytes != 10<<20 || c.MaxRedirects != 5 ||
		c.RateLimitedAfter != time.Minute || c.UserAgent != DefaultUserAgent || c.AllowPrivateNetworks {
		t.Errorf("defaults = %+v", c)
	}
}

func TestOutcomeValid(t *testing.T) {
	t.Parallel()
	for _, o := range Outcomes {
		if !o.Valid() {
			t.Errorf("%q not valid", o)
		}
	}
	for _, o := range []Outcome{"", "OK", "error"} {
		if o.Valid() {
			t.Errorf("%q valid", o)
		}
	}
	if len(Outcomes) != 5 {
		t.Errorf("Outcomes = %q, want the five", Outcomes)
	}
}
