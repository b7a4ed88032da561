package fakedest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeNow is a settable clock for arrival times and buckets.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeNow) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeNow) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var epoch = time.Date(2026, 6, 2, 6, 0, 0, 0, time.UTC)

// setup starts a server with cfg and closes it when the test ends.
func setup(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// response is what get observed.
type response struct {
	status int
	header http.Header
	body   string
}

func get(t *testing.T, url string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return response{resp.StatusCode, resp.Header, string(body)}
}

// statuses sends n GETs to url one after another and counts the statuses.
func statuses(t *testing.T, url string, n int) map[int]int {
	t.Helper()
	out := map[int]int{}
	for range n {
		out[get(t, url).status]++
	}
	return out
}

// With a frozen clock the bucket is exact: burst requests pass, then 429s
// with Retry-After; one second later, rate more pass. Buckets are per prefix.
func TestRateLimitExact(t *testing.T) {
	t.Parallel()
	clock := &fakeNow{t: epoch}
	s := setup(t, Config{Now: clock.Now, Rules: map[string]Rule{
		"/a/": {Rate: 10, Burst: 5},
		"/c/": {Rate: 2},
	}})

	if got := statuses(t, s.URL()+"/a/feed", 20); got[200] != 5 || got[429] != 15 {
		t.Fatalf("frozen clock, burst 5: statuses %v, want 5×200 and 15×429", got)
	}
	r := get(t, s.URL()+"/a/feed")
	if r.status != 429 || r.header.Get("Retry-After") != "1" {
		t.Fatalf("over the limit: status %d Retry-After %q, want 429 and \"1\"", r.status, r.header.Get("Retry-After"))
	}
	if got := statuses(t, s.URL()+"/c/x", 3); got[200] != 1 || got[429] != 2 {
		t.Fatalf("/c/ (burst defaults to 1): statuses %v, want 1×200, 2×429", got)
	}
	if got := statuses(t, s.URL()+"/b/other", 30); got[200] != 30 {
		t.Fatalf("path under no rule: statuses %v, want all 200", got)
	}

	clock.Advance(100 * time.Millisecond) // one token at 10/s
	if got := statuses(t, s.URL()+"/a/feed", 3); got[200] != 1 || got[429] != 2 {
		t.Fatalf("100 ms later at 10/s: statuses %v, want 1×200 and 2×429", got)
	}
	clock.Advance(time.Hour) // idle time refills to burst, never beyond
	if got := statuses(t, s.URL()+"/a/feed", 8); got[200] != 5 {
		t.Fatalf("after an idle hour: statuses %v, want 5×200 (burst)", got)
	}

	// A greedy client over one second (full bucket, a request every 10 ms
	// from 0 to 1000 ms inclusive) gets burst + rate = 15 through.
	clock.Advance(time.Hour)
	s.Reset()
	for range 101 {
		get(t, s.URL()+"/a/feed")
		clock.Advance(10 * time.Millisecond)
	}
	if got := s.CountStatus("/a/", 200); got != 15 {
		t.Fatalf("greedy second: %d×200, want 15 (burst 5 + 10/s)", got)
	}
	if got := MaxInWindow(s.Arrivals("/a/", 200), time.Second); got != 14 {
		t.Fatalf("MaxInWindow(accepted, 1s) = %d, want 14 (the half-open window drops the request at 1000 ms)", got)
	}
}

// With the real clock, N fast requests get roughly burst + rate·elapsed
// through; the rest are 429 with the configured Retry-After.
func TestRateLimitRealClock(t *testing.T) {
	t.Parallel()
	s := setup(t, Config{Rules: map[string]Rule{"/a/": {Rate: 20, Burst: 5, RetryAfter: 3 * time.Second}}})
	const n = 60
	start := time.Now()
	var ok, limited int
	for range n {
		r := get(t, s.URL()+"/a/x")
		switch r.status {
		case 200:
			ok++
		case 429:
			limited++
			if ra := r.header.Get("Retry-After"); ra != "3" {
				t.Fatalf("429 with Retry-After %q, want \"3\"", ra)
			}
		default:
			t.Fatalf("unexpected status %d", r.status)
		}
	}
	elapsed := time.Since(start)
	ceiling := 5 + int(20*elapsed.Seconds()) + 1
	if ok < 5 || ok > ceiling || ok+limited != n {
		t.Fatalf("%d of %d passed in %v, want between burst 5 and %d", ok, n, elapsed, ceiling)
	}
	if s.CountStatus("/a/", 429) != limited || s.Count("/a/") != n {
		t.Fatalf("recorded %d requests, %d×429; want %d, %d", s.Count("/a/"), s.CountStatus("/a/", 429), n, limited)
	}
	t.Logf("%d/%d passed in %v (burst 5 + 20/s)", ok, n, elapsed)
}

func TestRetryAfterForms(t *testing.T) {
	t.Parallel()
	clock := &fakeNow{t: epoch}
	s := setup(t, Config{Now: clock.Now})
	tests := []struct {
		name       string
		rule       Rule
		wantStatus int
		wantRA     string
	}{
		{"seconds rounded up", Rule{Rate: 1, RetryAfter: 1500 * time.Millisecond}, 429, "2"},
		{"http date", Rule{Rate: 1, RetryAfter: 90 * time.Second, RetryAfterDate: true}, 429, "Tue, 02 Jun 2026 06:01:30 GMT"},
		{"omitted", Rule{Rate: 1, RetryAfter: NoRetryAfter}, 429, ""},
		{"503 when limited", Rule{Rate: 1, LimitStatus: 503, RetryAfter: 5 * time.Second}, 503, "5"},
	}
	for i, tt := range tests {
		prefix := fmt.Sprintf("/ra%d/", i)
		if err := s.SetRule(prefix, tt.rule); err != nil {
			t.Fatal(err)
		}
		if r := get(t, s.URL()+prefix+"x"); r.status != 200 {
			t.Fatalf("%s: first request %d, want 200", tt.name, r.status)
		}
		r := get(t, s.URL()+prefix+"x")
		_, present := r.header["Retry-After"]
		if r.status != tt.wantStatus || r.header.Get("Retry-After") != tt.wantRA || present != (tt.wantRA != "") {
			t.Errorf("%s: status %d Retry-After %q, want %d %q", tt.name, r.status, r.header.Get("Retry-After"), tt.wantStatus, tt.wantRA)
		}
	}
}

// ETag / Last-Modified validators and 304 answers, RFC 9110 precedence.
func TestConditionalRequests(t *testing.T) {
	t.Parallel()
	lm := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	s := setup(t, Config{Rules: map[string]Rule{"/e/": {Validators: true, LastModified: lm}}})
	url := s.URL() + "/e/feed.xml"

	first := get(t, url)
	etag := first.header.Get("ETag")
	if first.status != 200 || !strings.HasPrefix(etag, `"`) || first.header.Get("Last-Modified") != lm.Format(http.TimeFormat) {
		t.Fatalf("first GET: status %d ETag %q Last-Modified %q", first.status, etag, first.header.Get("Last-Modified"))
	}
	tests := []struct {
		name    string
		headers []string
		want    int
	}{
		{"matching etag", []string{"If-None-Match", etag}, 304},
		{"weak matching etag in a list", []string{"If-None-Match", `"other", W/` + etag}, 304},
		{"star", []string{"If-None-Match", "*"}, 304},
		{"other etag", []string{"If-None-Match", `"stale"`}, 200},
		{"etag decides over a matching date", []string{"If-None-Match", `"stale"`, "If-Modified-Since", lm.Format(http.TimeFormat)}, 200},
		{"same date", []string{"If-Modified-Since", lm.Format(http.TimeFormat)}, 304},
		{"later date", []string{"If-Modified-Since", lm.Add(time.Hour).Format(http.TimeFormat)}, 304},
		{"earlier date", []string{"If-Modified-Since", lm.Add(-time.Second).Format(http.TimeFormat)}, 200},
		{"unconditional", nil, 200},
	}
	for _, tt := range tests {
		if r := get(t, url, tt.headers...); r.status != tt.want {
			t.Errorf("%s: status %d, want %d", tt.name, r.status, tt.want)
		} else if r.status == 304 && r.body != "" {
			t.Errorf("%s: 304 with a body %q", tt.name, r.body)
		}
	}

	// A new version changes the ETag and the body: the old ETag no longer matches.
	if err := s.SetRule("/e/", Rule{Validators: true, LastModified: lm, Version: 2}); err != nil {
		t.Fatal(err)
	}
	r := get(t, url, "If-None-Match", etag, "User-Agent", "fleetpace-test/1")
	if r.status != 200 || r.header.Get("ETag") == etag || r.body == first.body {
		t.Fatalf("after a version bump: status %d ETag %q body %q; want 200, a new ETag and body", r.status, r.header.Get("ETag"), r.body)
	}
	reqs := s.Requests()
	last := reqs[len(reqs)-1]
	if last.IfNoneMatch != etag || last.UserAgent != "fleetpace-test/1" || last.Status != 200 {
		t.Fatalf("recorded %+v; want If-None-Match %s, the User-Agent and status 200", last, etag)
	}
	if got := s.CountStatus("/e/", 304); got != 5 {
		t.Fatalf("recorded %d×304, want 5", got)
	}
}

// Forced statuses, switched at runtime; the longest prefix wins; "" is a
// catch-all.
func TestForcedStatusAndRuntimeSwitch(t *testing.T) {
	t.Parallel()
	s := setup(t, Config{})
	url := s.URL() + "/p/item"
	if r := get(t, url); r.status != 200 {
		t.Fatalf("no rule: %d, want 200", r.status)
	}
	if err := s.SetRule("/p/", Rule{Status: 503}); err != nil {
		t.Fatal(err)
	}
	if r := get(t, url); r.status != 503 || r.header.Get("Retry-After") != "1" {
		t.Fatalf("503 mode: %d Retry-After %q, want 503 \"1\"", r.status, r.header.Get("Retry-After"))
	}
	if err := s.SetRule("/p/", Blocked(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if r := get(t, url); r.status != 429 || r.header.Get("Retry-After") != "600" {
			t.Fatalf("blocked: %d Retry-After %q, want 429 \"600\"", r.status, r.header.Get("Retry-After"))
		}
	}
	if err := s.SetRule("/p/open/", Rule{}); err != nil {
		t.Fatal(err)
	}
	if r := get(t, s.URL()+"/p/open/x"); r.status != 200 {
		t.Fatalf("longer prefix /p/open/: %d, want 200", r.status)
	}
	if err := s.SetRule("", Rule{Status: 500}); err != nil {
		t.Fatal(err)
	}
	if r := get(t, s.URL()+"/elsewhere"); r.status != 500 {
		t.Fatalf("catch-all: %d, want 500", r.status)
	}
	s.DeleteRule("/p/")
	if r := get(t, url); r.status != 500 {
		t.Fatalf("after DeleteRule(/p/), the catch-all answers: %d, want 500", r.status)
	}
}

// A slow rule delays the answer; a client that gives up leaves a record with
// status 0; Close ends pending delays at once.
func TestSlowResponses(t *testing.T) {
	t.Parallel()
	s := setup(t, Config{Rules: map[string]Rule{
		"/slow/":    {Delay: 300 * time.Millisecond},
		"/glacial/": {Delay: time.Hour},
	}})

	start := time.Now()
	if r := get(t, s.URL()+"/slow/x"); r.status != 200 {
		t.Fatalf("slow: %d", r.status)
	}
	if took := time.Since(start); took < 300*time.Millisecond {
		t.Fatalf("slow answer took %v, want ≥ 300ms", took)
	}

	client := &http.Client{Timeout: 100 * time.Millisecond}
	if _, err := client.Get(s.URL() + "/slow/y"); err == nil {
		t.Fatal("a 100ms client got an answer from a 300ms rule")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		reqs := s.Requests()
		last := reqs[len(reqs)-1]
		if last.Path == "/slow/y" && last.Status == 0 && last.Done.IsZero() {
			break // recorded as abandoned
		}
		if time.Now().After(deadline) {
			t.Fatalf("abandoned request recorded as %+v", last)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Close during an hour-long delay returns promptly.
	s2 := setup(t, Config{Rules: map[string]Rule{"/": {Delay: time.Hour}}})
	errc := make(chan error, 1)
	go func() {
		resp, err := http.Get(s2.URL() + "/z")
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	for s2.Count("/") == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	start = time.Now()
	if err := s2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close took %v with a pending delay", took)
	}
	if err := <-errc; err == nil {
		t.Fatal("a request pending at Close got an answer")
	}
}

func TestBigBodies(t *testing.T) {
	t.Parallel()
	const size = 5<<20 + 3
	s := setup(t, Config{Rules: map[string]Rule{"/big/": {BodySize: size}}})
	r := get(t, s.URL()+"/big/blob")
	if r.status != 200 || len(r.body) != size || r.header.Get("Content-Length") != fmt.Sprint(size) {
		t.Fatalf("big body: status %d, %d bytes, Content-Length %q; want %d", r.status, len(r.body), r.header.Get("Content-Length"), size)
	}
	if !strings.HasPrefix(r.body, "fakedest /big/blob v0\n") {
		t.Fatalf("body starts %q", r.body[:40])
	}
}

// Requests, Count, Arrivals, MaxInWindow, RateSeries and Reset on a
// controlled timeline.
func TestRecording(t *testing.T) {
	t.Parallel()
	clock := &fakeNow{t: epoch}
	s := setup(t, Config{Now: clock.Now, Rules: map[string]Rule{"/a/": {Rate: 1, Burst: 1}}})

	// 3 requests at 0 s (1 passes), 2 at 0.5 s, 1 at 2 s, plus one on /b/.
	for range 3 {
		get(t, s.URL()+"/a/1?page=2", "User-Agent", "ua-1")
	}
	clock.Advance(500 * time.Millisecond)
	get(t, s.URL()+"/a/2")
	get(t, s.URL()+"/a/2")
	clock.Advance(1500 * time.Millisecond)
	get(t, s.URL()+"/a/3")
	get(t, s.URL()+"/b/1")

	reqs := s.Requests()
	if len(reqs) != 7 || s.Count("/a/") != 6 || s.Count("") != 7 {
		t.Fatalf("recorded %d requests (/a/: %d), want 7 (6)", len(reqs), s.Count("/a/"))
	}
	r0 := reqs[0]
	if r0.Method != "GET" || r0.Path != "/a/1" || r0.RawQuery != "page=2" || r0.UserAgent != "ua-1" ||
		r0.Status != 200 || !r0.Time.Equal(epoch) || r0.Done.Before(r0.Time) || r0.RemoteAddr == "" {
		t.Fatalf("first record %+v", r0)
	}
	if got := s.CountStatus("/a/", 200); got != 2 { // t=0 and t=2 s (t=0.5 s: half a token)
		t.Fatalf("%d×200 on /a/, want 2", got)
	}
	if got := s.MaxInWindow("/a/", time.Second); got != 5 {
		t.Fatalf("MaxInWindow(/a/, 1s) = %d, want 5", got)
	}
	if got := s.RateSeries("/a/", time.Second); fmt.Sprint(got) != "[5 0 1]" {
		t.Fatalf("RateSeries(/a/, 1s) = %v, want [5 0 1]", got)
	}
	if got := s.Arrivals("/a/", 429); len(got) != 4 || !got[3].Equal(epoch.Add(500*time.Millisecond)) {
		t.Fatalf("Arrivals(/a/, 429) = %v", got)
	}

	reqs[0].Path = "changed"
	if s.Requests()[0].Path != "/a/1" {
		t.Fatal("Requests does not return a copy")
	}

	clock.Advance(10 * time.Second)
	s.Reset()
	if s.Count("") != 0 || !s.Origin().Equal(epoch.Add(12*time.Second)) {
		t.Fatalf("after Reset: %d records, origin %v", s.Count(""), s.Origin())
	}
	if r := get(t, s.URL()+"/a/x"); r.status != 200 {
		t.Fatalf("after Reset the bucket is full again: %d", r.status)
	}
	if got := s.RateSeries("", time.Second); fmt.Sprint(got) != "[1]" {
		t.Fatalf("RateSeries after Reset = %v, want [1]", got)
	}
}

func TestMaxInWindow(t *testing.T) {
	t.Parallel()
	at := func(ss ...float64) []time.Time {
		out := make([]time.Time, len(ss))
		for i, s := range ss {
			out[i] = epoch.Add(time.Duration(s * float64(time.Second)))
		}
		return out
	}
	tests := []struct {
		name   string
		times  []time.Time
		window time.Duration
		want   int
	}{
		{"empty", nil, time.Second, 0},
		{"one", at(3), time.Second, 1},
		{"window is half-open", at(0, 1), time.Second, 1},
		{"just inside", at(0, 0.999999999), time.Second, 2},
		{"busiest window is not aligned to seconds", at(0, 0.1, 0.2, 0.95, 1.0, 1.05, 2.5), time.Second, 5},
		{"unsorted input", at(2.5, 1.05, 0, 0.95, 0.2, 1.0, 0.1), time.Second, 5},
		{"simultaneous", at(1, 1, 1, 1), time.Millisecond, 4},
		{"steady 10/s for 10 s has 10 per window", steady(10, 10*time.Second), time.Second, 10},
		{"zero window", at(0, 0), 0, 0},
		{"wide window", at(0, 5, 9), 10 * time.Second, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := MaxInWindow(tt.times, tt.window); got != tt.want {
				t.Fatalf("MaxInWindow = %d, want %d", got, tt.want)
			}
		})
	}

	// Property: agrees with brute force on random timelines, and does not
	// reorder its input.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		n := rng.IntN(60)
		times := make([]time.Time, n)
		for i := range times {
			times[i] = epoch.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
		}
		before := append([]time.Time(nil), times...)
		window := time.Duration(1+rng.IntN(2000)) * time.Millisecond
		if got, want := MaxInWindow(times, window), bruteMaxInWindow(times, window); got != want {
			t.Fatalf("MaxInWindow(%v, %v) = %d, brute force %d", times, window, got, want)
		}
		for i := range times {
			if !times[i].Equal(before[i]) {
				t.Fatal("MaxInWindow reordered its input")
			}
		}
	}
}

// steady returns arrivals at rate/s over span, starting at epoch.
func steady(rate int, span time.Duration) []time.Time {
	var out []time.Time
	step := time.Second / time.Duration(rate)
	for t := time.Duration(0); t < span; t += step {
		out = append(out, epoch.Add(t))
	}
	return out
}

func bruteMaxInWindow(times []time.Time, window time.Duration) int {
	best := 0
	for _, start := range times {
		n := 0
		for _, t := range times {
			if !t.Before(start) && t.Before(start.Add(window)) {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

func TestRateSeries(t *testing.T) {
	t.Parallel()
	times := []time.Time{
		epoch.Add(-time.Second), // before origin: ignored
		epoch, epoch.Add(100 * time.Millisecond), epoch.Add(499 * time.Millisecond),
		epoch.Add(1600 * time.Millisecond),
	}
	if got := fmt.Sprint(RateSeries(times, epoch, 500*time.Millisecond)); got != "[6 0 0 2]" {
		t.Fatalf("RateSeries(500ms) = %s, want [6 0 0 2] (3 and 1 requests per half second)", got)
	}
	if got := fmt.Sprint(RateSeries(times, epoch, time.Second)); got != "[3 1]" {
		t.Fatalf("RateSeries(1s) = %s, want [3 1]", got)
	}
	if RateSeries(times, epoch, 0) != nil || len(RateSeries(nil, epoch, time.Second)) != 0 {
		t.Fatal("degenerate inputs should give an empty series")
	}
}

func TestInvalidRules(t *testing.T) {
	t.Parallel()
	tests := []struct {
		rule  Rule
		field string
	}{
		{Rule{Rate: -1}, "Rate"},
		{Rule{Burst: -1}, "Burst"},
		{Rule{LimitStatus: 500}, "LimitStatus"},
		{Rule{Status: 42}, "Status"},
		{Rule{Delay: -time.Second}, "Delay"},
		{Rule{BodySize: -1}, "BodySize"},
		{Rule{Window: -time.Second, WindowLimit: 1}, "Window"},
		{Rule{Window: time.Second}, "WindowLimit"},
		{Rule{WindowLimit: 3}, "WindowLimit"},
		{Rule{Window: time.Second, WindowLimit: 1, Rate: 1}, "Window and Rate"},
		{Rule{Rate: 1, Headers: 9}, "Headers"},
		{Rule{Headers: XRateLimit}, "Headers"},
		{Rule{RedirectTo: "/x", Status: 500}, "RedirectTo"},
		{Rule{RedirectTo: "http://[::1"}, "RedirectTo"},
		{Rule{RawHeaders: map[string][]string{"Bad Name": {"v"}}}, "RawHeaders"},
		{Rule{RawHeaders: map[string][]string{"": {"v"}}}, "RawHeaders"},
	}
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		if err := s.SetRule("/x/", tt.rule); !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), tt.field) || !strings.Contains(err.Error(), `"/x/"`) {
			t.Errorf("SetRule(%+v) = %v, want ErrInvalidRule naming %s and the prefix", tt.rule, err, tt.field)
		}
		if _, err := New(Config{Rules: map[string]Rule{"/y/": tt.rule}}); !errors.Is(err, ErrInvalidRule) {
			t.Errorf("New with %+v = %v, want ErrInvalidRule", tt.rule, err)
		}
	}
}

// Many concurrent clients while rules change: no race, every request recorded.
func TestConcurrentUseWhileSwitching(t *testing.T) {
	t.Parallel()
	s := setup(t, Config{Rules: map[string]Rule{"/a/": {Rate: 1000, Burst: 10}}})
	const workers, each = 8, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				resp, err := http.Get(fmt.Sprintf("%s/a/%d/%d", s.URL(), w, i))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for i := range 50 {
		if err := s.SetRule("/a/", Rule{Rate: float64(100 + i), Burst: 5, Status: []int{0, 503}[i%2]}); err != nil {
			t.Fatal(err)
		}
		_ = s.MaxInWindow("/a/", time.Second)
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	if got := s.Count("/a/"); got != workers*each {
		t.Fatalf("recorded %d requests, want %d", got, workers*each)
	}
	for _, r := range s.Requests() {
		if r.Status != 200 && r.Status != 429 && r.Status != 503 {
			t.Fatalf("request %+v has status %d", r, r.Status)
		}
	}
}

func TestListenAndServe(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- ListenAndServe(ctx, addr, Config{Rules: map[string]Rule{"/": {Status: 418}}})
	}()
	var resp *http.Response
	for deadline := time.Now().Add(5 * time.Second); ; {
		resp, err = http.Get("http://" + addr + "/x")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("standalone server never answered: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 418 {
		t.Fatalf("standalone server answered %d, want the configured 418", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ListenAndServe = %v, want nil after ctx ends", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ListenAndServe did not return after ctx ended")
	}
	if _, err := http.Get("http://" + addr + "/x"); err == nil {
		t.Fatal("server still answering after ListenAndServe returned")
	}
}

// A request's arrival is when the kernel received it, not when its
// handler ran: with the server held (its lock taken, as a process the
// scheduler has not run), a request written at w arrives at w at the
// latest, although its handler stamps it after the hold. (Linux.)
func TestArrivalIsTheKernelsReceiveTime(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("kernel receive times are read on Linux")
	}
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	// The kernel turns receive times on in the background when a process
	// first asks: wait until the server reads them.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(s.URL() + "/warm")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		reqs := s.Requests()
		if reqs[len(reqs)-1].KernelTime {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no kernel receive time in %d requests over 10 s", len(reqs))
		}
	}
	s.Reset()

	s.mu.Lock() // every handler waits for this
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
	if err != nil {
		s.mu.Unlock()
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		s.mu.Unlock()
		t.Fatal(err)
	}
	written := time.Now() // on loopback the kernel has stamped the segment by now
	for time.Since(written) < 5*time.Millisecond {
		runtime.Gosched() // the hold: the handler cannot stamp before this ends
	}
	released := time.Now()
	s.mu.Unlock()
	if _, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil {
		t.Fatal(err)
	}
	reqs := s.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests recorded, want 1", len(reqs))
	}
	if !reqs[0].KernelTime {
		t.Errorf("arrival %s not marked KernelTime", reqs[0].Time.Format(time.RFC3339Nano))
	}
	if at := reqs[0].Time; at.After(written) {
		t.Errorf("arrival %s after the write (%s) and %s before the handler could run: stamped by the handler, not the kernel",
			at.Sub(written), written.Format(time.RFC3339Nano), released.Sub(at))
	}
}
