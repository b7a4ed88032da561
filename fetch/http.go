package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/buildinfo"
	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sendby"
)

// Defaults of HTTPConfig.
const (
	DefaultTimeout          = 30 * time.Second
	DefaultMaxBodyBytes     = 10 << 20 // 10 MiB
	DefaultMaxRedirects     = 5
	DefaultRateLimitedAfter = 60 * time.Second
)

// Bounds of HTTPConfig: beyond them a setting is a mistake. A body larger
// than MaxBodyBytesLimit is not a feed; a Retry-After is capped at
// ratelimit.MaxWait, so a longer RateLimitedAfter could never be reached.
const (
	MaxTimeout          = time.Hour
	MaxBodyBytesLimit   = 1 << 30 // 1 GiB
	MaxRedirectsLimit   = 100
	MaxRateLimitedAfter = ratelimit.MaxWait
)

// DefaultUserAgent is the User-Agent sent when HTTPConfig.UserAgent is empty:
// "fleetpace/<version> (+https://github.com/fleetpace/fleetpace)", the
// version taken from the binary's build information ("dev" when unknown;
// see internal/buildinfo).
var DefaultUserAgent = "fleetpace/" + buildinfo.Version() + " (+https://github.com/fleetpace/fleetpace)"

// HTTPConfig configures the built-in HTTP fetcher. The zero value is valid
// and means every default.
type HTTPConfig struct {
	// UserAgent is sent with every request. Default DefaultUserAgent.
	UserAgent string
	// Timeout bounds a whole fetch: connection, redirects, headers and body.
	// Default 30 s.
	Timeout time.Duration
	// MaxBodyBytes caps a 2xx body. A larger body is not stored and the fetch
	// is Failed ("body exceeds N bytes"): a truncated body would get a hash
	// that looks like a real change. The cap applies after transparent gzip
	// decoding. Default 10 MiB.
	MaxBodyBytes int64
	// MaxRedirects is how many redirects are followed; one more is Failed.
	// Default 5; -1 follows none (the 3xx is then Failed).
	MaxRedirects int
	// StoreDir, when set, keeps every 2xx body content-addressed at
	// <StoreDir>/<hash[0:2]>/<hash> (hex SHA-256), written atomically (temp
	// file, fsync, rename) and never rewritten once present. Default "":
	// bodies are hashed and discarded. Created if missing.
	StoreDir string
	// AllowPrivateNetworks turns the SSRF guard off. By default connections
	// to every address IANA's special-purpose registries mark as not
	// globally reachable are refused — loopback, private (RFC 1918,
	// fc00::/7), link-local, unspecified, CGNAT (100.64/10), documentation,
	// benchmarking, reserved and broadcast, multicast, Teredo, local-use
	// NAT64 — and so are IPv4-mapped, NAT64 (64:ff9b::/96) and 6to4
	// (2002::/16) addresses embedding one of them; see guard.go. The check
	// is made at dial time after DNS resolution, so on every redirect hop
	// too. A refused fetch is Failed with Err matching ErrRefusedAddress.
	// Default false.
	AllowPrivateNetworks bool
	// RateLimitedAfter: a 429 or 503 whose Retry-After is longer than this
	// is RateLimited (the platform cools down) rather than RatePressure (the
	// pacer backs off). Default 60 s. Retry-After and every other duration
	// read from a response's headers is capped at ratelimit.MaxWait (24 h)
	// before it is compared or returned.
	RateLimitedAfter time.Duration
	// GuardExempt lists exact address:port pairs the SSRF guard lets
	// through although it refuses their address; every other port of that
	// address, and every other address, stays refused. For tests only —
	// never in production: it lets a test server on loopback stand in for
	// a public host while the guard is on, and anything that redirects to
	// an exempt pair reaches it. Default: none.
	GuardExempt []netip.AddrPort
	// Resolver looks up host names before the guard checks the addresses.
	// Default net.DefaultResolver.
	Resolver Resolver
	// Clock is what HTTP-date Retry-After values and epoch reset times are
	// measured against and Result.Duration is timed with. Default (nil):
	// the real clock.
	Clock clock.Clock
}

// ErrInvalidConfig is wrapped by every error of HTTPConfig.Validate.
var ErrInvalidConfig = errors.New("invalid config")

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c HTTPConfig) Validate() error {
	switch {
	case c.Timeout < 0 || c.Timeout > MaxTimeout:
		return fmt.Errorf("%w: fetch.HTTPConfig.Timeout must be in (0, %s] (0: default), got %s", ErrInvalidConfig, MaxTimeout, c.Timeout)
	case c.MaxBodyBytes < 0 || c.MaxBodyBytes > MaxBodyBytesLimit:
		return fmt.Errorf("%w: fetch.HTTPConfig.MaxBodyBytes must be in [1, %d] (0: default), got %d", ErrInvalidConfig, MaxBodyBytesLimit, c.MaxBodyBytes)
	case c.MaxRedirects < -1 || c.MaxRedirects > MaxRedirectsLimit:
		return fmt.Errorf("%w: fetch.HTTPConfig.MaxRedirects must be in [-1, %d] (-1: none, 0: default), got %d", ErrInvalidConfig, MaxRedirectsLimit, c.MaxRedirects)
	case c.RateLimitedAfter < 0 || c.RateLimitedAfter > MaxRateLimitedAfter:
		return fmt.Errorf("%w: fetch.HTTPConfig.RateLimitedAfter must be in (0, %s] (0: default), got %s", ErrInvalidConfig, MaxRateLimitedAfter, c.RateLimitedAfter)
	}
	return nil
}

func (c HTTPConfig) withDefaults() HTTPConfig {
	if c.UserAgent == "" {
		c.UserAgent = DefaultUserAgent
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	switch c.MaxRedirects {
	case 0:
		c.MaxRedirects = DefaultMaxRedirects
	case -1:
		c.MaxRedirects = 0
	}
	if c.RateLimitedAfter == 0 {
		c.RateLimitedAfter = DefaultRateLimitedAfter
	}
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	c.Clock = clock.Or(c.Clock)
	return c
}

// HTTP is the built-in fetcher: conditional GETs, Retry-After in both forms
// and the destination's rate-limit headers (package ratelimit), capped body
// size, time and redirects, sanitised validators, content-addressed storage
// and an SSRF guard. Safe for concurrent use.
type HTTP struct {
	cfg    HTTPConfig
	guard  *guard
	client *http.Client
}

var _ Fetcher = (*HTTP)(nil)

// NewHTTP returns an HTTP fetcher configured by cfg.
//
// The transport is built here and cannot be replaced: the SSRF guard lives in
// its dialer. It also ignores HTTP_PROXY and friends, since a proxy would
// make every connection go to the proxy's address and blind the guard.
func NewHTTP(cfg HTTPConfig) (*HTTP, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.StoreDir != "" {
		if err := os.MkdirAll(cfg.StoreDir, 0o755); err != nil {
			return nil, fmt.Errorf("fetch: HTTPConfig.StoreDir: %w", err)
		}
	}
	h := &HTTP{cfg: cfg, guard: &guard{allowPrivate: cfg.AllowPrivateNetworks}}
	for _, ap := range cfg.GuardExempt {
		h.guard.allow = append(h.guard.allow, netip.AddrPortFrom(ap.Addr().WithZone("").Unmap(), ap.Port()))
	}
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           sendby.Dial(newDialer(h.guard, cfg.Resolver).DialContext),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	h.client = &http.Client{
		Transport: transport,
		Timeout:   cfg.Timeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if cfg.MaxRedirects == 0 {
				return http.ErrUseLastResponse // the 3xx is classified as Failed
			}
			if len(via) > cfg.MaxRedirects {
				return &redirectError{fmt.Sprintf("stopped after %d redirects", cfg.MaxRedirects)}
			}
			if s := req.URL.Scheme; s != "http" && s != "https" {
				return &redirectError{fmt.Sprintf("redirect to unsupported scheme %q", s)}
			}
			return nil
		},
	}
	return h, nil
}

// CloseIdleConnections closes the fetcher's idle keep-alive connections.
func (h *HTTP) CloseIdleConnections() { h.client.CloseIdleConnections() }

type redirectError struct{ msg string }

func (e *redirectError) Error() string { return e.msg }

// storeError is a failure to write a body to the store (not the source's fault).
type storeError struct{ err error }

func (e *storeError) Error() string { return "store: " + e.err.Error() }
func (e *storeError) Unwrap() error { return e.err }

var errBodyTooLarge = errors.New("body too large")

// Fetch performs a conditional GET of req.URL and classifies the response:
// 2xx → OK, 304 → NotModified, 429/503 → RatePressure (RateLimited when
// Retry-After exceeds RateLimitedAfter), anything else → Failed.
func (h *HTTP) Fetch(ctx context.Context, req Request) Result {
	start := h.cfg.Clock.Now()
	res := h.fetch(ctx, req)
	res.Duration = h.cfg.Clock.Since(start)
	return res
}

func (h *HTTP) fetch(ctx context.Context, req Request) Result {
	// Validators carry over unless a response replaces them; an invalid one
	// (stored before validators were sanitised, or set by hand) is dropped.
	etag, lastModified := SanitizeValidator(req.ETag), SanitizeValidator(req.LastModified)
	res := Result{ETag: etag, LastModified: lastModified}
	fail := func(reason string) Result {
		res.Outcome, res.Reason = Failed, reason
		return res
	}
	failErr := func(err error) Result {
		res.Err = err
		return fail(h.errorReason(ctx, err))
	}

	u, err := url.Parse(req.URL)
	if err != nil {
		res.Err = err
		return fail(fmt.Sprintf("invalid URL: %v", err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fail(fmt.Sprintf("unsupported URL scheme %q (only http and https)", u.Scheme))
	}
	if u.Host == "" {
		return fail("invalid URL: no host")
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		res.Err = err
		return fail(fmt.Sprintf("invalid URL: %v", err))
	}
	hreq.Header.Set("User-Agent", h.cfg.UserAgent)
	if etag != "" {
		hreq.Header.Set("If-None-Match", etag)
	}
	if lastModified != "" {
		hreq.Header.Set("If-Modified-Since", lastModified)
	}

	gctx, gate, cancel := sendby.Arm(hreq.Context(), req.SendBy, h.cfg.Clock)
	defer cancel()
	resp, err := h.client.Do(hreq.WithContext(gctx))
	res.Sent = gate.Sent()
	if err != nil {
		if gate.Refused() {
			res.Err = fmt.Errorf("%w (%s after it)", ErrLate, h.cfg.Clock.Since(req.SendBy).Round(time.Millisecond))
			return fail("late: " + res.Err.Error())
		}
		return failErr(err)
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.RateLimit = ratelimit.Parse(resp.Header, h.cfg.Clock.Now())
	code := resp.StatusCode

	switch {
	case code >= 200 && code < 300:
		hash, n, err := h.readBody(resp.Body)
		if err != nil {
			return failErr(err)
		}
		res.Outcome = OK
		res.ETag = SanitizeValidator(resp.Header.Get("ETag"))
		res.LastModified = SanitizeValidator(resp.Header.Get("Last-Modified"))
		res.ContentHash, res.Bytes = hash, n
		return res

	case code == http.StatusNotModified:
		drain(resp.Body)
		res.Outcome = NotModified
		if v := SanitizeValidator(resp.Header.Get("ETag")); v != "" {
			res.ETag = v
		}
		if v := SanitizeValidator(resp.Header.Get("Last-Modified")); v != "" {
			res.LastModified = v
		}
		return res

	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		drain(resp.Body)
		res.Outcome = RatePressure
		res.Reason = statusText(code)
		res.RetryAfter = res.RateLimit.RetryAfter // 0 when absent, capped at ratelimit.MaxWait
		if res.RetryAfter > 0 {
			res.Reason += fmt.Sprintf(", Retry-After %s", res.RetryAfter)
		}
		if res.RetryAfter > h.cfg.RateLimitedAfter {
			res.Outcome = RateLimited
			res.Reason = fmt.Sprintf("%s with Retry-After %s (over %s)",
				statusText(code), res.RetryAfter, h.cfg.RateLimitedAfter)
		}
		return res

	default:
		drain(resp.Body)
		reason := statusText(code)
		if code >= 300 && code < 400 {
			if loc := resp.Header.Get("Location"); loc != "" {
				reason += " to " + redact.URL(loc) + " (redirect not followed)" // reasons are shown and logged
			}
		}
		return fail(reason)
	}
}

func statusText(code int) string {
	if t := http.StatusText(code); t != "" {
		return fmt.Sprintf("HTTP %d %s", code, t)
	}
	return fmt.Sprintf("HTTP %d", code)
}

// drain reads a little of an unused body so the connection can be reused.
func drain(body io.Reader) { _, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10)) }

// errorReason turns a transport or body error into a Result.Reason.
func (h *HTTP) errorReason(ctx context.Context, err error) string {
	var refused *refusedError
	var redirect *redirectError
	var store *storeError
	var netErr net.Error
	switch {
	case errors.As(err, &refused):
		return refused.Error()
	case errors.As(err, &redirect):
		return redirect.Error()
	case errors.As(err, &store):
		return store.Error()
	case errors.Is(err, errBodyTooLarge):
		return fmt.Sprintf("body exceeds %d bytes", h.cfg.MaxBodyBytes)
	case ctx.Err() != nil:
		return "canceled: " + context.Cause(ctx).Error()
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout():
		return fmt.Sprintf("timeout: no complete response within %s", h.cfg.Timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // drop the "Get \"url\":" prefix; the caller knows the URL
	}
	return "transport: " + err.Error()
}

// readBody hashes the body while streaming it (into the store when one is
// configured), failing with errBodyTooLarge past MaxBodyBytes.
func (h *HTTP) readBody(body io.Reader) (hash string, n int64, err error) {
	hasher := sha256.New()
	var w io.Writer = hasher
	var tmp *os.File
	if h.cfg.StoreDir != "" {
		tmp, err = os.CreateTemp(h.cfg.StoreDir, ".tmp-*")
		if err != nil {
			return "", 0, &storeError{err}
		}
		defer func() {
			if tmp != nil { // not committed
				tmp.Close()
				os.Remove(tmp.Name())
			}
		}()
		w = io.MultiWriter(hasher, storeWriter{tmp})
	}
	// One byte over the cap tells "too large" from "exactly the cap"; the
	// addition saturates, for a cap of math.MaxInt64.
	n, err = io.Copy(w, io.LimitReader(body, satAdd(h.cfg.MaxBodyBytes, 1)))
	if err != nil {
		return "", 0, err
	}
	if n > h.cfg.MaxBodyBytes {
		return "", 0, errBodyTooLarge
	}
	hash = hex.EncodeToString(hasher.Sum(nil))
	if tmp != nil {
		if err := commit(tmp, h.cfg.StoreDir, hash); err != nil {
			return "", 0, &storeError{err}
		}
		tmp = nil
	}
	return hash, n, nil
}

// satAdd is a + b for b ≥ 0, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

type storeWriter struct{ f *os.File }

func (s storeWriter) Write(p []byte) (int, error) {
	n, err := s.f.Write(p)
	if err != nil {
		err = &storeError{err}
	}
	return n, err
}

// StorePath is where a body with the given hex SHA-256 (Result.ContentHash)
// lives under dir: <dir>/<hash[0:2]>/<hash>.
func StorePath(dir, hash string) string {
	if len(hash) < 2 {
		return filepath.Join(dir, hash)
	}
	return filepath.Join(dir, hash[:2], hash)
}

// commit moves a fully written temp file to its content address, unless a
// file is already there (same hash, same content: nothing to do). It always
// closes tmp and removes it if it was not renamed.
func commit(tmp *os.File, dir, hash string) error {
	final := StorePath(dir, hash)
	if _, err := os.Lstat(final); err == nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil
	}
	err := tmp.Chmod(0o644)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.MkdirAll(filepath.Dir(final), 0o755)
	}
	if err == nil {
		// Two fetchers racing on the same content rename identical files:
		// either result is correct.
		err = os.Rename(tmp.Name(), final)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
