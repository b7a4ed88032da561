// Package fakedest is the fake destination that fleetpace's tests, demo and
// benchmarks fetch from: an HTTP server that rate-limits, misbehaves on
// request, and records every request it receives.
//
// Behaviour is set per path prefix by a Rule (the longest matching prefix
// wins; the prefix "" matches every path): a limiter — a token bucket at a
// configurable rate, or a fixed window of N requests per aligned second or
// minute — that answers 429 (or 503) with a Retry-After once exceeded,
// optionally announcing its state in rate-limit headers (X-RateLimit-*,
// GitHub's epoch form, the IETF draft's fields, old and new); a forced
// status for everything (503, or 429 with a long Retry-After for cooldown
// tests); a redirect; hostile raw headers; a delay before answering, big
// bodies, and ETag / Last-Modified validators with 304 answers to matching
// conditional requests. Rules can be changed while the server runs, so a
// test can switch a destination's behaviour mid-run. Limiters follow
// Config.Now, so a test with a fake clock is exact.
//
// Every request is recorded (arrival time, method, path, status returned,
// whether the limiter refused it, the rate-limit headers sent, conditional
// headers, User-Agent). MaxInWindow, RateSeries and Tally turn the records
// into the figures tests and benchmarks assert on: the largest number of
// requests in any sliding window (a ceiling), a per-bucket rate (a chart),
// and accepted versus limited counts (goodput, 429 share). Recording costs
// about 200 bytes per request (more with rate-limit headers); long
// benchmarks should call Reset.
//
// It is the one test double fleetpace ships; it runs outside tests too (the
// demo, ListenAndServe), which is why it owns a real listener rather than
// using net/http/httptest.
package fakedest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultAddr is the address Start listens on when Config.Addr is empty: a
// free loopback port.
const DefaultAddr = "127.0.0.1:0"

// DefaultRetryAfter is the Retry-After sent with 429 and 503 answers when
// Rule.RetryAfter is zero.
const DefaultRetryAfter = time.Second

// NoRetryAfter, as Rule.RetryAfter, omits the Retry-After header (any negative
// value does the same).
const NoRetryAfter time.Duration = -1

// ErrInvalidRule is wrapped by errors about a bad Rule.
var ErrInvalidRule = errors.New("fakedest: invalid rule")

// Config configures a Server. The zero value listens on a free loopback port
// and answers 200 to everything, without limits.
type Config struct {
	// Addr is the listen address. Default: DefaultAddr ("127.0.0.1:0").
	Addr string

	// Rules are the initial rules, by path prefix. Default: none (every path
	// answers 200 at any rate).
	Rules map[string]Rule

	// Now is the clock for arrival times and token buckets. Default:
	// time.Now. Delays always use real time.
	Now func() time.Time

	// Logger receives server errors. Default: discard.
	Logger *slog.Logger
}

// Rule is the behaviour of the paths under one prefix. The zero Rule answers
// 200 with a short body, at any rate.
//
// A request is handled in this order: recorded; if Status is set, answered
// with it; else if RedirectTo is set, answered 302; else if the limiter
// (token bucket or fixed window) refuses it, answered with LimitStatus;
// else answered 304 if Validators is set and a conditional header matches;
// else 200 with the body. Delay is waited before any answer. Headers go
// with every answer the limiter decided (accepted or refused); RawHeaders
// with every answer.
type Rule struct {
	// Rate is the token bucket's refill rate, in requests per second.
	// Default (0): unlimited.
	Rate float64

	// Burst is the token bucket's size: requests allowed back to back.
	// Default: 1 when Rate is set.
	Burst int

	// Window, with WindowLimit, is a fixed-window limiter instead of the
	// token bucket: at most WindowLimit requests in each window of this
	// length, windows aligned as time.Time.Truncate aligns them (on the
	// second for 1 s, on the minute for 60 s) on Config.Now's clock. A
	// refused request gets Retry-After = the time to the window's end,
	// rounded up to whole seconds, unless RetryAfter is set. Default (0):
	// no window. Not with Rate.
	Window time.Duration

	// WindowLimit is the fixed window's quota; at least 1 with Window.
	WindowLimit int

	// Strict, with Rate, makes the limiter nginx's limit_req instead of a
	// token bucket: a leaky bucket counted in whole milliseconds that
	// refuses a request arriving earlier than 1/Rate after the last one it
	// accepted, beyond Burst requests of excess (nginx's burst with nodelay;
	// 0 by default here, not 1). A refusal changes nothing.
	Strict bool

	// Sliding, with Window and WindowLimit, makes the window a sliding log
	// instead of a fixed one: at most WindowLimit requests accepted in any
	// Window ending now. A refused request's Retry-After is the time until
	// the oldest of them leaves the window, unless RetryAfter is set.
	Sliding bool

	// Headers is the family of rate-limit headers sent with every answer
	// the limiter decides, describing the limiter's state after the request
	// (see HeaderStyle for exactly what is sent). Default None. Needs Rate
	// or Window.
	Headers HeaderStyle

	// LimitStatus is answered when the limiter refuses a request: 429 or
	// 503. Default: 429.
	LimitStatus int

	// Status, when set, is answered to every request under the prefix
	// without consulting the bucket (e.g. 503; or 429 with a long RetryAfter
	// to drive a platform into cooldown — see Blocked). Default: 0 (normal).
	Status int

	// RetryAfter is the Retry-After sent with every 429 and 503 (limited or
	// forced), rounded up to whole seconds. Default: DefaultRetryAfter (1 s).
	// NoRetryAfter (or any negative value) omits the header.
	RetryAfter time.Duration

	// RetryAfterDate sends Retry-After as an HTTP-date (now + RetryAfter)
	// instead of seconds.
	RetryAfterDate bool

	// Delay is waited before answering (any status); a client that hangs up
	// or a Close ends it early. Default: 0.
	Delay time.Duration

	// BodySize is the size of a 200 body in bytes. Default (0): a short line
	// naming the path and Version.
	BodySize int

	// Validators sends an ETag and a Last-Modified with 200 answers and
	// answers 304 to a request whose If-None-Match matches the ETag (or, with
	// no If-None-Match, whose If-Modified-Since is not before Last-Modified).
	Validators bool

	// Version is the content's version: changing it changes the body and
	// the ETag, as if the resource had been updated.
	Version int

	// LastModified is the Last-Modified sent when Validators is set.
	// Default: the server's creation time (whole seconds).
	LastModified time.Time

	// RedirectTo, when set, answers every request under the prefix with a
	// 302 to this URL (absolute or relative), without consulting the
	// limiter: for redirect chains, e.g. one ending at a private address
	// the SSRF guard must refuse. Not with Status.
	RedirectTo string

	// RawHeaders are added to every answer under the prefix as they are,
	// replacing a header the rule would send under the same name (compared
	// case-insensitively): names are written as given, not canonicalised,
	// and values are not checked, so they can carry
	// invalid UTF-8, NUL, megabyte values, an overflowing, negative or
	// fractional Retry-After, an HTTP-date in year 9999. net/http writes
	// each value's bytes unchanged, except CR and LF, which it sends as
	// spaces (no header injection). Names must be HTTP tokens.
	RawHeaders map[string][]string
}

// Blocked returns a Rule that answers 429 with the given Retry-After to every
// request: a platform that says "stop", for cooldown tests.
func Blocked(retryAfter time.Duration) Rule {
	return Rule{Status: http.StatusTooManyRequests, RetryAfter: retryAfter}
}

func (r Rule) validate(prefix string) error {
	switch {
	case math.IsNaN(r.Rate) || math.IsInf(r.Rate, 0) || r.Rate < 0:
		return fmt.Errorf("%w %q: Rate %v must be a finite number ≥ 0", ErrInvalidRule, prefix, r.Rate)
	case r.Burst < 0:
		return fmt.Errorf("%w %q: Burst %d must be ≥ 0", ErrInvalidRule, prefix, r.Burst)
	case r.LimitStatus != 0 && r.LimitStatus != http.StatusTooManyRequests && r.LimitStatus != http.StatusServiceUnavailable:
		return fmt.Errorf("%w %q: LimitStatus %d must be 429 or 503", ErrInvalidRule, prefix, r.LimitStatus)
	case r.Status != 0 && (r.Status < 200 || r.Status > 599):
		return fmt.Errorf("%w %q: Status %d must be a final HTTP status (200–599)", ErrInvalidRule, prefix, r.Status)
	case r.Delay < 0:
		return fmt.Errorf("%w %q: Delay %s must be ≥ 0", ErrInvalidRule, prefix, r.Delay)
	case r.BodySize < 0:
		return fmt.Errorf("%w %q: BodySize %d must be ≥ 0", ErrInvalidRule, prefix, r.BodySize)
	case r.Window < 0:
		return fmt.Errorf("%w %q: Window %s must be ≥ 0", ErrInvalidRule, prefix, r.Window)
	case r.Window > 0 && r.WindowLimit < 1:
		return fmt.Errorf("%w %q: WindowLimit %d must be ≥ 1 with Window", ErrInvalidRule, prefix, r.WindowLimit)
	case r.Strict && r.Rate == 0:
		return fmt.Errorf("%w %q: Strict needs a Rate", ErrInvalidRule, prefix)
	case r.Sliding && r.Window == 0:
		return fmt.Errorf("%w %q: Sliding needs a Window", ErrInvalidRule, prefix)
	case r.Window == 0 && r.WindowLimit != 0:
		return fmt.Errorf("%w %q: WindowLimit %d needs a Window", ErrInvalidRule, prefix, r.WindowLimit)
	case r.Window > 0 && r.Rate > 0:
		return fmt.Errorf("%w %q: Window and Rate are two limiters; set one", ErrInvalidRule, prefix)
	case r.Headers < None || r.Headers > IETFDraft:
		return fmt.Errorf("%w %q: Headers %d is not a HeaderStyle", ErrInvalidRule, prefix, int(r.Headers))
	case r.Headers != None && r.Rate == 0 && r.Window == 0:
		return fmt.Errorf("%w %q: Headers %s needs a limiter (Rate or Window)", ErrInvalidRule, prefix, r.Headers)
	case r.RedirectTo != "" && r.Status != 0:
		return fmt.Errorf("%w %q: RedirectTo and Status both answer every request; set one", ErrInvalidRule, prefix)
	}
	if r.RedirectTo != "" {
		if _, err := url.Parse(r.RedirectTo); err != nil {
			return fmt.Errorf("%w %q: RedirectTo: %v", ErrInvalidRule, prefix, err)
		}
	}
	for name := range r.RawHeaders {
		if !validHeaderName(name) {
			return fmt.Errorf("%w %q: RawHeaders name %q is not an HTTP token", ErrInvalidRule, prefix, name)
		}
	}
	return nil
}

func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// Request is one recorded request.
type Request struct {
	// Time is the arrival time (Config.Now when the handler started).
	Time time.Time
	// Done is when the answer was written; zero while in flight or if the
	// request was abandoned (client hung up or server closed during Delay).
	Done time.Time

	Method   string
	Path     string
	RawQuery string

	// Status is the status answered; 0 while in flight or if abandoned.
	Status int

	// Limited: the rule's limiter refused the request (answered with
	// LimitStatus), as opposed to a forced Status. Set on arrival.
	Limited bool

	// RateLimit holds the rate-limit headers sent with the answer —
	// Retry-After and the X-RateLimit-* and RateLimit* fields, as sent
	// (a RawHeaders value under one of those canonical names included) —
	// nil when none. Set when the answer is written.
	RateLimit http.Header

	IfNoneMatch     string
	IfModifiedSince string
	UserAgent       string
	RemoteAddr      string
}

// ruleState is an installed rule with its limiter.
type ruleState struct {
	rule  Rule
	limit *Limiter // nil when unlimited
}

func newRuleState(r Rule, created time.Time) *ruleState {
	if r.LastModified.IsZero() {
		r.LastModified = created
	}
	r.LastModified = r.LastModified.UTC().Truncate(time.Second)
	st := &ruleState{rule: r.withDefaults(), limit: newLimiter(r)}
	return st
}

// Server is a fake destination. Create it with New, then Start it; or mount
// it (it is an http.Handler) on a server of your own.
type Server struct {
	cfg     Config
	created time.Time

	mu       sync.Mutex
	rules    map[string]*ruleState
	requests []Request
	gen      int // incremented by Reset, so late answers do not touch new records
	origin   time.Time

	lifeMu   sync.Mutex
	listener net.Listener
	srv      *http.Server
	serveErr chan error
	closing  chan struct{}
	closed   bool
	inflight sync.WaitGroup
}

// New validates cfg and returns a Server that is not listening yet.
func New(cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	now := cfg.Now()
	s := &Server{
		cfg:     cfg,
		created: now,
		origin:  now,
		rules:   make(map[string]*ruleState, len(cfg.Rules)),
		closing: make(chan struct{}),
	}
	for prefix, r := range cfg.Rules {
		if err := r.validate(prefix); err != nil {
			return nil, err
		}
		s.rules[prefix] = newRuleState(r, now)
	}
	return s, nil
}

// Start listens on Config.Addr and serves in the background until Close.
func (s *Server) Start() error {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if s.closed {
		return errors.New("fakedest: Start after Close")
	}
	if s.listener != nil {
		return errors.New("fakedest: already started")
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("fakedest: listen on %s: %w", s.cfg.Addr, err)
	}
	s.listener = ln
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.serveErr = make(chan error, 1)
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil {
			s.cfg.Logger.Error("fakedest: serve", slog.Any("error", err))
		}
		s.serveErr <- err
	}()
	return nil
}

// URL is the server's base URL ("http://127.0.0.1:PORT"); empty before Start.
func (s *Server) URL() string {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if s.listener == nil {
		return ""
	}
	return "http://" + s.listener.Addr().String()
}

// Close stops the server at once: it closes the listener and every
// connection, ends pending delays (those requests are recorded with status
// 0), and waits for every handler to return. Safe to call more than once.
func (s *Server) Close() error {
	s.lifeMu.Lock()
	if s.closed {
		s.lifeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	srv, serveErr := s.srv, s.serveErr
	s.lifeMu.Unlock()

	var err error
	if srv != nil {
		err = srv.Close()
		if e := <-serveErr; err == nil {
			err = e
		}
	}
	s.inflight.Wait()
	if err != nil {
		return fmt.Errorf("fakedest: close: %w", err)
	}
	return nil
}

// ListenAndServe runs a fake destination on addr with cfg's rules until ctx
// ends, then closes it and returns nil (or the error that stopped it from
// starting). For running the fake destination as its own process.
func ListenAndServe(ctx context.Context, addr string, cfg Config) error {
	cfg.Addr = addr
	s, err := New(cfg)
	if err != nil {
		return err
	}
	if err := s.Start(); err != nil {
		return err
	}
	s.cfg.Logger.InfoContext(ctx, "fakedest: listening", slog.String("url", s.URL()))
	select {
	case <-ctx.Done():
	case err := <-s.serveErr:
		s.serveErr <- err // for Close
	}
	return s.Close()
}

// SetRule installs (or replaces) the rule for a path prefix, effective for
// the next request. A replaced rule's bucket starts full.
func (s *Server) SetRule(prefix string, r Rule) error {
	if err := r.validate(prefix); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules[prefix] = newRuleState(r, s.created)
	return nil
}

// DeleteRule removes the rule for a path prefix.
func (s *Server) DeleteRule(prefix string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.rules, prefix)
}

// Reset forgets every recorded request, refills every bucket and moves the
// origin of RateSeries to now. Rules are kept.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
	s.gen++
	s.origin = s.cfg.Now()
	for prefix, st := range s.rules {
		s.rules[prefix] = newRuleState(st.rule, s.created)
	}
}

// Origin is the server's creation time, or the time of the last Reset: the
// start of RateSeries.
func (s *Server) Origin() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.origin
}

// Tally counts requests by how they were answered.
type Tally struct {
	// Requests is every request counted, answered or not.
	Requests int
	// Accepted were answered 2xx or 304: the goodput.
	Accepted int
	// Limited were refused by the rule's limiter (Request.Limited).
	Limited int
}

// LimitedShare is Limited / Requests (0 for no requests): the 429 share.
func (t Tally) LimitedShare() float64 {
	if t.Requests == 0 {
		return 0
	}
	return float64(t.Limited) / float64(t.Requests)
}

// Tally counts the recorded requests under prefix that arrived in
// [from, to); a zero from or to leaves that side open.
func (s *Server) Tally(prefix string, from, to time.Time) Tally {
	s.mu.Lock()
	defer s.mu.Unlock()
	var t Tally
	for _, r := range s.requests {
		if !strings.HasPrefix(r.Path, prefix) ||
			!from.IsZero() && r.Time.Before(from) || !to.IsZero() && !r.Time.Before(to) {
			continue
		}
		t.Requests++
		if r.Status >= 200 && r.Status < 300 || r.Status == http.StatusNotModified {
			t.Accepted++
		}
		if r.Limited {
			t.Limited++
		}
	}
	return t
}

// Requests returns a copy of every recorded request, in arrival order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count is the number of recorded requests whose path starts with prefix
// ("" counts all).
func (s *Server) Count(prefix string) int {
	return len(s.Arrivals(prefix))
}

// CountStatus is the number of recorded requests under prefix answered with
// status.
func (s *Server) CountStatus(prefix string, status int) int {
	return len(s.Arrivals(prefix, status))
}

// Arrivals returns the arrival times of the recorded requests whose path
// starts with prefix, in arrival order; with statuses, only those answered
// with one of them.
func (s *Server) Arrivals(prefix string, statuses ...int) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Time
	for _, r := range s.requests {
		if !strings.HasPrefix(r.Path, prefix) {
			continue
		}
		if len(statuses) > 0 && !containsInt(statuses, r.Status) {
			continue
		}
		out = append(out, r.Time)
	}
	return out
}

// MaxInWindow is the largest number of requests under prefix (any status)
// that arrived within any sliding window of the given length. See the
// package function MaxInWindow.
func (s *Server) MaxInWindow(prefix string, window time.Duration) int {
	return MaxInWindow(s.Arrivals(prefix), window)
}

// RateSeries is the request rate under prefix (any status), in requests per
// second, per bucket of the given length from Origin. See the package
// function RateSeries.
func (s *Server) RateSeries(prefix string, bucket time.Duration) []float64 {
	return RateSeries(s.Arrivals(prefix), s.Origin(), bucket)
}

// MaxInWindow returns the largest number of times that fall within one
// half-open window [t, t+window), over every t. The times need not be sorted.
// A window ≤ 0 holds nothing.
func MaxInWindow(times []time.Time, window time.Duration) int {
	if window <= 0 || len(times) == 0 {
		return 0
	}
	sorted := append([]time.Time(nil), times...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Before(sorted[j]) })
	// The busiest window can always be slid to start at one of the times.
	best, lo := 0, 0
	for hi := range sorted {
		for sorted[hi].Sub(sorted[lo]) >= window {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// RateSeries returns, for each bucket [origin + i·bucket, origin + (i+1)·bucket),
// the number of times in it divided by the bucket's length in seconds, up to
// the bucket holding the latest time. Times before origin are ignored; a
// bucket ≤ 0 returns nil.
func RateSeries(times []time.Time, origin time.Time, bucket time.Duration) []float64 {
	if bucket <= 0 {
		return nil
	}
	var counts []int
	for _, t := range times {
		d := t.Sub(origin)
		if d < 0 {
			continue
		}
		i := int(d / bucket)
		for len(counts) <= i {
			counts = append(counts, 0)
		}
		counts[i]++
	}
	out := make([]float64, len(counts))
	for i, c := range counts {
		out[i] = float64(c) / bucket.Seconds()
	}
	return out
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// match returns the rule with the longest prefix of path, or nil.
func (s *Server) match(path string) *ruleState {
	var best *ruleState
	bestLen := -1
	for prefix, st := range s.rules {
		if len(prefix) > bestLen && strings.HasPrefix(path, prefix) {
			best, bestLen = st, len(prefix)
		}
	}
	return best
}

// ServeHTTP answers a request according to the rule for its path.
func (s *Server) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	s.lifeMu.Lock()
	if s.closed {
		s.lifeMu.Unlock()
		return
	}
	s.inflight.Add(1) // under lifeMu, so never concurrent with Close's Wait
	s.lifeMu.Unlock()
	defer s.inflight.Done()

	s.mu.Lock()
	now := s.cfg.Now()
	idx := len(s.requests)
	s.requests = append(s.requests, Request{
		Time:            now,
		Method:          req.Method,
		Path:            req.URL.Path,
		RawQuery:        req.URL.RawQuery,
		IfNoneMatch:     req.Header.Get("If-None-Match"),
		IfModifiedSince: req.Header.Get("If-Modified-Since"),
		UserAgent:       req.Header.Get("User-Agent"),
		RemoteAddr:      req.RemoteAddr,
	})
	st := s.match(req.URL.Path)
	var rule Rule
	var d Decision
	limited, decided := false, false
	if st != nil {
		rule = st.rule
		if rule.Status == 0 && rule.RedirectTo == "" && st.limit != nil {
			d = st.limit.Admit(now)
			limited, decided = !d.OK, true
		}
	}
	s.requests[idx].Limited = limited
	gen := s.gen
	s.mu.Unlock()

	h := w.Header()
	finish := func(status int) {
		sent := sentRateLimitHeaders(h)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gen == gen {
			s.requests[idx].Status = status
			s.requests[idx].Done = s.cfg.Now()
			s.requests[idx].RateLimit = sent
		}
	}

	if rule.Delay > 0 {
		t := time.NewTimer(rule.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-req.Context().Done():
			return
		case <-s.closing:
			panic(http.ErrAbortHandler) // drop the connection without an answer
		}
	}

	h.Set("Cache-Control", "no-store")
	if decided {
		for name, vs := range d.Header {
			h[name] = vs
		}
	}
	// writeHeader adds RawHeaders last, so they replace what the rule sent.
	writeHeader := func(status int) {
		for name := range rule.RawHeaders {
			delete(h, http.CanonicalHeaderKey(name))
		}
		for name, values := range rule.RawHeaders {
			h[name] = append([]string(nil), values...)
		}
		w.WriteHeader(status)
	}
	switch {
	case rule.Status != 0:
		if rule.Status == http.StatusTooManyRequests || rule.Status == http.StatusServiceUnavailable {
			retryAfter := rule.RetryAfter
			if retryAfter == 0 {
				retryAfter = DefaultRetryAfter
			}
			s.setRetryAfter(h, rule, retryAfter)
		}
		writeHeader(rule.Status)
		fmt.Fprintf(w, "fakedest: forced %d\n", rule.Status)
		finish(rule.Status)
		return
	case rule.RedirectTo != "":
		h.Set("Location", rule.RedirectTo)
		writeHeader(http.StatusFound)
		finish(http.StatusFound)
		return
	case limited:
		writeHeader(rule.LimitStatus)
		if rule.Window > 0 {
			fmt.Fprintf(w, "fakedest: over %d requests per %s\n", rule.WindowLimit, rule.Window)
		} else {
			fmt.Fprintf(w, "fakedest: over %v req/s (burst %d)\n", rule.Rate, max(rule.Burst, 1))
		}
		finish(rule.LimitStatus)
		return
	}

	line := fmt.Sprintf("fakedest %s v%d\n", req.URL.Path, rule.Version)
	size := len(line)
	if rule.BodySize > 0 {
		size = rule.BodySize
	}
	if rule.Validators {
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%d", req.URL.Path, rule.Version, size)))
		etag := `"` + hex.EncodeToString(sum[:8]) + `"`
		h.Set("ETag", etag)
		h.Set("Last-Modified", rule.LastModified.Format(http.TimeFormat))
		if notModified(req, etag, rule.LastModified) {
			writeHeader(http.StatusNotModified)
			finish(http.StatusNotModified)
			return
		}
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(size))
	writeHeader(http.StatusOK)
	writeBody(w, line, size)
	finish(http.StatusOK)
}

// setRetryAfter sends d as Retry-After in r's form (none if d < 0 or
// r.RetryAfter < 0).
func (s *Server) setRetryAfter(h http.Header, r Rule, d time.Duration) {
	setRetryAfter(h, r, d, s.cfg.Now())
}

// notModified applies RFC 9110's conditional GET rules: If-None-Match, when
// present, decides (weak comparison, "*" matches); otherwise If-Modified-Since.
func notModified(req *http.Request, etag string, lastModified time.Time) bool {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return false
	}
	if inm := req.Header.Get("If-None-Match"); inm != "" {
		for _, tag := range strings.Split(inm, ",") {
			tag = strings.TrimPrefix(strings.TrimSpace(tag), "W/")
			if tag == "*" || tag == etag {
				return true
			}
		}
		return false
	}
	if ims := req.Header.Get("If-Modified-Since"); ims != "" {
		t, err := http.ParseTime(ims)
		return err == nil && !lastModified.After(t)
	}
	return false
}

// writeBody writes size bytes: line repeated and truncated.
func writeBody(w http.ResponseWriter, line string, size int) {
	chunk := []byte(strings.Repeat(line, max(1, 32<<10/len(line))))
	for size > 0 {
		n := min(size, len(chunk))
		if _, err := w.Write(chunk[:n]); err != nil {
			return
		}
		size -= n
	}
}
