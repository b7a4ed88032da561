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
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultAddr is the address Start listens on when Config.Addr is empty: a
// free loopback port.
const DefaultAddr = "127.0.0.1:0"

// Config configures a Server. The zero value listens on a free loopback port
// and answers 200 to everything, without limits.
type Config struct {
	// Addr is the listen address. Default: DefaultAddr ("127.0.0.1:0").
	Addr string

	// Rules are the initial rules, by path prefix. Default: none (every path
	// answers 200 at any rate).
	Rules map[string]Rule

	// Now is the clock for arrival times and token buckets. Default:
	// time.Now, and then a request started with Start arrives when the
	// kernel received it (on Linux), not when its handler ran. Delays
	// always use real time.
	Now func() time.Time

	// Logger receives server errors. Default: discard.
	Logger *slog.Logger
}

// Server is a fake destination. Create it with New, then Start it; or mount
// it (it is an http.Handler) on a server of your own.
type Server struct {
	cfg     Config
	created time.Time

	// kernelTime: arrivals are the kernel's receive times where known
	// (Config.Now is the real clock).
	kernelTime bool

	mu        sync.Mutex
	rules     map[string]*ruleState
	requests  []*Request // in arrival order
	lastAdmit time.Time  // the latest time a limiter was asked at: limiters see time go forward
	gen       int        // incremented by Reset, so late answers do not touch new records
	origin    time.Time

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
	kernelTime := cfg.Now == nil
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	now := cfg.Now()
	s := &Server{
		cfg:        cfg,
		kernelTime: kernelTime,
		created:    now,
		origin:     now,
		rules:      make(map[string]*ruleState, len(cfg.Rules)),
		closing:    make(chan struct{}),
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
	stamped := stampListener(ln) // before Start returns: a client may dial at once
	s.srv = &http.Server{
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if sc, ok := c.(*stampConn); ok {
				return context.WithValue(ctx, connKey{}, sc)
			}
			return ctx
		},
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.serveErr = make(chan error, 1)
	go func() {
		err := s.srv.Serve(stamped)
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
	kernel := false
	if sc, ok := req.Context().Value(connKey{}).(*stampConn); ok && s.kernelTime {
		if t, ok := sc.received(); ok && t.Before(now) {
			now, kernel = t, true
		}
	}
	rec := &Request{
		Time:            now,
		KernelTime:      kernel,
		Method:          req.Method,
		Path:            req.URL.Path,
		RawQuery:        req.URL.RawQuery,
		IfNoneMatch:     req.Header.Get("If-None-Match"),
		IfModifiedSince: req.Header.Get("If-Modified-Since"),
		UserAgent:       req.Header.Get("User-Agent"),
		RemoteAddr:      req.RemoteAddr,
	}
	// In arrival order: a request that arrived earlier may reach this line
	// later.
	i := len(s.requests)
	for i > 0 && s.requests[i-1].Time.After(now) {
		i--
	}
	s.requests = slices.Insert(s.requests, i, rec)
	if s.kernelTime {
		if now.Before(s.lastAdmit) {
			now = s.lastAdmit
		}
		s.lastAdmit = now
	}
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
	rec.Limited = limited
	gen := s.gen
	s.mu.Unlock()

	h := w.Header()
	finish := func(status int) {
		sent := sentRateLimitHeaders(h)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.gen == gen {
			rec.Status = status
			rec.Done = s.cfg.Now()
			rec.RateLimit = sent
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

// connKey is the context key of a request's *stampConn.
type connKey struct{}
