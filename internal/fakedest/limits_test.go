package fakedest

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/ratelimit"
)

// A fixed window admits WindowLimit requests per aligned window, refuses the
// rest with Retry-After = the time to the window's end (rounded up), and
// starts afresh at the boundary, not a window's length after the first
// request.
func TestFixedWindow(t *testing.T) {
	t.Parallel()
	clock := &fakeNow{t: epoch} // epoch is on a whole minute
	s := setup(t, Config{Now: clock.Now, Rules: map[string]Rule{
		"/s/": {Window: time.Second, WindowLimit: 3},
		"/m/": {Window: time.Minute, WindowLimit: 2},
		"/x/": {Window: time.Second, WindowLimit: 1, RetryAfter: 7 * time.Second},
		"/d/": {Window: time.Minute, WindowLimit: 1, RetryAfterDate: true},
	}})

	clock.Advance(200 * time.Millisecond)
	if got := statuses(t, s.URL()+"/s/a", 5); got[200] != 3 || got[429] != 2 {
		t.Fatalf("5 requests in one window of 3: %v", got)
	}
	if r := get(t, s.URL()+"/s/a"); r.status != 429 || r.header.Get("Retry-After") != "1" {
		t.Fatalf("refused at 0.2 s: %d Retry-After %q, want 429 \"1\" (0.8 s rounded up)", r.status, r.header.Get("Retry-After"))
	}
	clock.Advance(799 * time.Millisecond) // 0.999 s: same window
	if r := get(t, s.URL()+"/s/a"); r.status != 429 {
		t.Fatalf("at 0.999 s: %d, want 429", r.status)
	}
	clock.Advance(time.Millisecond) // 1.000 s: a new window
	if got := statuses(t, s.URL()+"/s/a", 4); got[200] != 3 || got[429] != 1 {
		t.Fatalf("new window: %v, want 3×200 1×429", got)
	}

	// Aligned, not sliding: one just before a boundary and one just after
	// both pass a window of 1.
	clock.Advance(1900 * time.Millisecond) // 2.9 s
	if r := get(t, s.URL()+"/x/a"); r.status != 200 {
		t.Fatalf("/x/ at 2.9 s: %d", r.status)
	}
	if r := get(t, s.URL()+"/x/a"); r.status != 429 || r.header.Get("Retry-After") != "7" {
		t.Fatalf("/x/ refused: %d Retry-After %q, want 429 \"7\" (explicit RetryAfter)", r.status, r.header.Get("Retry-After"))
	}
	clock.Advance(200 * time.Millisecond) // 3.1 s
	if r := get(t, s.URL()+"/x/a"); r.status != 200 {
		t.Fatalf("/x/ at 3.1 s, next aligned window: %d, want 200", r.status)
	}

	// 60-s windows, aligned on the minute.
	clock.Advance(6900 * time.Millisecond) // 10 s
	if got := statuses(t, s.URL()+"/m/a", 3); got[200] != 2 || got[429] != 1 {
		t.Fatalf("/m/: %v", got)
	}
	if r := get(t, s.URL()+"/m/a"); r.header.Get("Retry-After") != "50" {
		t.Fatalf("/m/ at 10 s: Retry-After %q, want \"50\"", r.header.Get("Retry-After"))
	}
	clock.Advance(49500 * time.Millisecond) // 59.5 s
	if r := get(t, s.URL()+"/m/a"); r.header.Get("Retry-After") != "1" {
		t.Fatalf("/m/ at 59.5 s: Retry-After %q, want \"1\"", r.header.Get("Retry-After"))
	}
	get(t, s.URL()+"/d/a")
	if r := get(t, s.URL()+"/d/a"); r.header.Get("Retry-After") != epoch.Add(time.Minute).Format(http.TimeFormat) {
		t.Fatalf("/d/ date form: Retry-After %q, want the window's end", r.header.Get("Retry-After"))
	}
	clock.Advance(500 * time.Millisecond) // 60 s
	if got := statuses(t, s.URL()+"/m/a", 3); got[200] != 2 {
		t.Fatalf("/m/ next minute: %v", got)
	}

	// Limited is recorded for the limiter's refusals only.
	n := 0
	for _, r := range s.Requests() {
		if r.Limited != (r.Status == 429) {
			t.Fatalf("record %+v: Limited %v with status %d", r, r.Limited, r.Status)
		}
		if r.Limited {
			n++
		}
	}
	if n != s.CountStatus("", 429) || n == 0 {
		t.Fatalf("%d limited records, %d×429", n, s.CountStatus("", 429))
	}
}

// Each header style, on a token bucket and on fixed windows, parses back
// with ratelimit.Parse to exactly what an independent model of the limiter
// says, request after request (accepted and refused), and the record holds
// the headers sent.
func TestRateLimitHeadersParseBack(t *testing.T) {
	t.Parallel()
	// Steps between requests, in eighths of a second (exact in binary, so
	// the bucket's float arithmetic is exact too).
	steps := []int{0, 0, 0, 0, 1, 0, 2, 0, 0, 3, 8, 0, 0, 0, 0, 0, 4, 1, 1, 40, 0, 0, 480, 0, 7}
	models := []struct {
		name string
		rule Rule
	}{
		{"bucket 4/s burst 3", Rule{Rate: 4, Burst: 3}},
		{"bucket 8/s burst 1", Rule{Rate: 8}},
		{"bucket 0.5/s burst 2", Rule{Rate: 0.5, Burst: 2}},
		{"window 5 per 1s", Rule{Window: time.Second, WindowLimit: 5}},
		{"window 3 per 60s", Rule{Window: time.Minute, WindowLimit: 3}},
	}
	for _, style := range []HeaderStyle{XRateLimit, XRateLimitEpoch, IETF, IETFDraft} {
		for _, m := range models {
			t.Run(style.String()+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				clock := &fakeNow{t: epoch.Add(300 * time.Millisecond)}
				rule := m.rule
				rule.Headers = style
				s := setup(t, Config{Now: clock.Now, Rules: map[string]Rule{"/q/": rule}})
				model := newModel(rule, clock.Now())
				for i, step := range steps {
					clock.Advance(time.Duration(step) * time.Second / 8)
					now := clock.Now()
					wantOK, want := model.request(now, style)
					r := get(t, s.URL()+"/q/x")
					if (r.status == 200) != wantOK {
						t.Fatalf("request %d at %v: status %d, model says ok=%v", i, now.Sub(epoch), r.status, wantOK)
					}
					got := ratelimit.Parse(r.header, now)
					if got != want {
						t.Fatalf("request %d at %v (status %d), headers %v:\n got %+v\nwant %+v", i, now.Sub(epoch), r.status, r.header, got, want)
					}
					rec := s.Requests()[i]
					if rec.Limited == wantOK || ratelimit.Parse(rec.RateLimit, now) != want {
						t.Fatalf("request %d: record Limited %v RateLimit %v", i, rec.Limited, rec.RateLimit)
					}
				}
			})
		}
	}
}

// model is an independent model of a rule's limiter and of the headers it
// documents, for TestRateLimitHeadersParseBack.
type model struct {
	rule   Rule
	tokens float64
	last   time.Time
	winAt  time.Time
	count  int
}

func newModel(r Rule, now time.Time) *model {
	return &model{rule: r, tokens: float64(max(r.Burst, 1)), last: now}
}

// request decides a request at now and returns the Info ratelimit.Parse
// should read from the answer.
func (m *model) request(now time.Time, style HeaderStyle) (bool, ratelimit.Info) {
	var ok bool
	var limit, remaining, q, w int
	var reset time.Duration
	if m.rule.Rate > 0 {
		burst := float64(max(m.rule.Burst, 1))
		m.tokens = math.Min(burst, m.tokens+m.rule.Rate*now.Sub(m.last).Seconds())
		m.last = now
		if ok = m.tokens >= 1; ok {
			m.tokens--
		}
		limit, remaining = int(burst), int(m.tokens)
		reset = time.Duration((burst - m.tokens) / m.rule.Rate * float64(time.Second))
		w = max(1, int(math.Ceil(burst/m.rule.Rate)))
		q = int(m.rule.Rate * float64(w))
	} else {
		start := now.Truncate(m.rule.Window)
		if !start.Equal(m.winAt) {
			m.winAt, m.count = start, 0
		}
		if ok = m.count < m.rule.WindowLimit; ok {
			m.count++
		}
		limit, remaining = m.rule.WindowLimit, m.rule.WindowLimit-m.count
		reset = start.Add(m.rule.Window).Sub(now)
		q, w = m.rule.WindowLimit, int(math.Ceil(m.rule.Window.Seconds()))
	}
	ceilTo := func(d, unit time.Duration) time.Duration { return (d + unit - 1) / unit * unit }
	info := ratelimit.Info{Remaining: float64(remaining), HasRemaining: true, HasReset: true}
	switch style {
	case XRateLimit:
		info.Form, info.Limit, info.Reset = ratelimit.XRateLimit, float64(limit), ceilTo(reset, time.Millisecond)
	case XRateLimitEpoch:
		info.Form, info.Limit = ratelimit.XRateLimit, float64(limit)
		info.Reset = now.Add(reset).Add(time.Second - 1).Truncate(time.Second).Sub(now)
	case IETF, IETFDraft:
		info.Form = ratelimit.IETF
		if style == IETFDraft {
			info.Form = ratelimit.IETFDraft
		}
		info.Limit, info.Window, info.Reset = float64(q), time.Duration(w)*time.Second, ceilTo(reset, time.Second)
	}
	if !ok {
		info.HasRetryAfter, info.RetryAfter = true, DefaultRetryAfter
		if m.rule.Window > 0 {
			info.RetryAfter = ceilTo(reset, time.Second)
		}
	}
	return ok, info
}

// rawGet sends a GET over a plain TCP connection and returns the answer's
// bytes as they arrived.
func rawGet(t *testing.T, s *Server, path string) []byte {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: fakedest\r\nConnection: close\r\n\r\n", path)
	b, err := io.ReadAll(conn)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// RawHeaders arrive byte for byte (invalid UTF-8, NUL, 1 MiB), replace the
// rule's own header of the same name, and go with every status.
func TestRawHeaders(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("a", 1<<20)
	hostile := map[string][]string{
		"ETag":          {"\"\xff\xfe\x00\""},
		"Last-Modified": {"\xc3\x28 Mon, 02 Jan 2006"},
		"X-Big":         {big},
		"Retry-After":   {"99999999999999999999"},
		"x-lower-case":  {"kept as written"},
	}
	s := setup(t, Config{Rules: map[string]Rule{
		"/h/":    {Status: 429, RawHeaders: hostile},
		"/ok/":   {RawHeaders: map[string][]string{"Retry-After": {"-5", "0.5", "Fri, 31 Dec 9999 23:59:59 GMT"}}},
		"/lim/":  {Rate: 1, Headers: XRateLimit, RawHeaders: map[string][]string{"X-RateLimit-Reset": {"NaN"}}},
		"/crlf/": {RawHeaders: map[string][]string{"X-Split": {"a\r\nInjected: yes"}}},
	}})

	b := rawGet(t, s, "/h/x")
	for _, want := range []string{
		"HTTP/1.1 429 ",
		"\r\nETag: \"\xff\xfe\x00\"\r\n",
		"\r\nLast-Modified: \xc3\x28 Mon, 02 Jan 2006\r\n",
		"\r\nX-Big: " + big + "\r\n",
		"\r\nRetry-After: 99999999999999999999\r\n",
		"\r\nx-lower-case: kept as written\r\n",
	} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("answer lacks %.60q", want)
		}
	}
	if n := bytes.Count(b, []byte("Retry-After:")); n != 1 {
		t.Errorf("%d Retry-After lines, want 1 (the raw one replaces the rule's)", n)
	}

	b = rawGet(t, s, "/ok/x")
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 200 ")) ||
		!bytes.Contains(b, []byte("\r\nRetry-After: -5\r\nRetry-After: 0.5\r\nRetry-After: Fri, 31 Dec 9999 23:59:59 GMT\r\n")) {
		t.Errorf("200 with repeated raw Retry-After: %q", b)
	}
	b = rawGet(t, s, "/lim/x")
	if !bytes.Contains(b, []byte("\r\nX-RateLimit-Reset: NaN\r\n")) || !bytes.Contains(b, []byte("\r\nX-Ratelimit-Remaining: 0\r\n")) ||
		bytes.Contains(b, []byte("\r\nX-Ratelimit-Reset:")) {
		t.Errorf("limited rule with a raw override: %q", b)
	}
	// net/http turns CR and LF into spaces: no header injection.
	b = rawGet(t, s, "/crlf/x")
	if !bytes.Contains(b, []byte("\r\nX-Split: a  Injected: yes\r\n")) || bytes.Contains(b, []byte("\r\nInjected:")) {
		t.Errorf("CR LF in a raw value: %q", b)
	}
}

// RedirectTo answers 302 without consulting the limiter; a chain of rules
// redirects hop by hop.
func TestRedirectTo(t *testing.T) {
	t.Parallel()
	s := setup(t, Config{Rules: map[string]Rule{
		"/r1/": {RedirectTo: "/r2/next", Rate: 1},
		"/r2/": {RedirectTo: "http://169.254.169.254/latest/meta-data/"},
	}})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	// The bucket on /r1/ (1/s) would refuse the second request: it is not
	// consulted.
	for _, hop := range []struct{ path, location string }{
		{"/r1/x", "/r2/next"}, {"/r1/x", "/r2/next"}, {"/r1/x", "/r2/next"},
		{"/r2/next", "http://169.254.169.254/latest/meta-data/"},
	} {
		resp, err := client.Get(s.URL() + hop.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 302 || resp.Header.Get("Location") != hop.location {
			t.Fatalf("%s: %d Location %q, want 302 to %s", hop.path, resp.StatusCode, resp.Header.Get("Location"), hop.location)
		}
	}
	if s.CountStatus("", 302) != 4 {
		t.Fatalf("recorded %d×302, want 4", s.CountStatus("", 302))
	}
}

// Tally counts accepted and limited requests in a time range: goodput and
// 429 share.
func TestTally(t *testing.T) {
	t.Parallel()
	clock := &fakeNow{t: epoch}
	s := setup(t, Config{Now: clock.Now, Rules: map[string]Rule{
		"/a/":    {Window: time.Second, WindowLimit: 2},
		"/gone/": {Status: 429},
	}})
	for i := range 10 { // 5 per second over 2 s: 2 accepted, 3 limited per second
		get(t, s.URL()+"/a/"+strconv.Itoa(i))
		clock.Advance(200 * time.Millisecond)
	}
	get(t, s.URL()+"/gone/x") // forced: not Limited
	all := s.Tally("/a/", time.Time{}, time.Time{})
	if all != (Tally{Requests: 10, Accepted: 4, Limited: 6}) || all.LimitedShare() != 0.6 {
		t.Fatalf("Tally(/a/) = %+v share %v", all, all.LimitedShare())
	}
	second := s.Tally("", epoch.Add(time.Second), epoch.Add(2*time.Second))
	if second != (Tally{Requests: 5, Accepted: 2, Limited: 3}) {
		t.Fatalf("Tally(second 1) = %+v", second)
	}
	if g := s.Tally("/gone/", time.Time{}, time.Time{}); g != (Tally{Requests: 1}) {
		t.Fatalf("forced 429: %+v, want counted but not Limited", g)
	}
	if (Tally{}).LimitedShare() != 0 {
		t.Fatal("empty tally share")
	}
}
