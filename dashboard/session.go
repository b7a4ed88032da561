package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/time/rate"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/redact"
)

// CookieName is the session cookie's name.
const CookieName = "fleetpace_session"

// sessions signs and checks browser sessions. A session is its start time,
// the sign-out epoch it was issued in and a random id, signed with a key
// derived from the admin token (changing the token signs every browser
// out); its CSRF token is derived from it, so a form from another session,
// or from another site, is refused. Signing out bumps the epoch, which is
// kept in the database (fleetpace_dashboard_epoch): every session issued
// before is refused from then on, by every process sharing the database,
// so a cookie copied before the sign-out cannot be replayed after it.
type sessions struct {
	token    []byte // the admin token, compared in constant time
	key      []byte
	db       DB
	ttl      time.Duration
	timeout  time.Duration // bounds a read or a bump of the epoch
	clock    clock.Clock
	failures failures
	// lastEpoch is the epoch last read, used while the database cannot be
	// reached (known: it has been read once).
	lastEpoch atomic.Int64
	known     atomic.Bool
}

func newSessions(token string, db DB, ttl, timeout time.Duration, c clock.Clock) *sessions {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("fleetpace dashboard session key v2"))
	return &sessions{token: []byte(token), key: m.Sum(nil), db: db, ttl: ttl, timeout: timeout, clock: c,
		failures: failures{byAddr: map[string]*rate.Limiter{}}}
}

// Sign-in attempts with a wrong token are limited per client address:
// SignInBurst of them at once, then one per SignInEvery. While an address
// is over its limit every attempt from it is refused (429 with
// Retry-After), the right token included, so guessing costs time whatever
// the guess.
const (
	SignInBurst = 5
	SignInEvery = 12 * time.Second
)

// maxTrackedAddrs bounds the addresses failures remembers: past it, the
// record starts afresh (an attacker with that many addresses gets at most
// SignInBurst more guesses each per reset).
const maxTrackedAddrs = 10_000

// failures limits sign-in failures per client address.
type failures struct {
	mu     sync.Mutex
	byAddr map[string]*rate.Limiter
}

// wait is how long the address must wait before its next attempt (0: it
// may try now).
func (f *failures) wait(addr string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	lim := f.byAddr[addr]
	if lim == nil {
		return 0
	}
	tokens := lim.TokensAt(now)
	if tokens >= 1 {
		return 0
	}
	return time.Duration(math.Ceil((1 - tokens) * float64(SignInEvery)))
}

// fail records a failed attempt from addr.
func (f *failures) fail(addr string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	lim := f.byAddr[addr]
	if lim == nil {
		if len(f.byAddr) >= maxTrackedAddrs {
			clear(f.byAddr)
		}
		lim = rate.NewLimiter(rate.Every(SignInEvery), SignInBurst)
		f.byAddr[addr] = lim
	}
	lim.AllowN(now, 1)
}

// clientAddr is the request's client address without its port: the unit
// sign-in failures are counted by. Behind a trusted proxy, the address the
// proxy names (the last of X-Forwarded-For).
func (h *Handler) clientAddr(r *http.Request) string {
	if h.cfg.TrustProxyHeaders {
		if fwd := lastValue(r.Header.Values("X-Forwarded-For")); fwd != "" {
			if ip, err := netip.ParseAddr(fwd); err == nil {
				return ip.String()
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// secure reports whether the request came over HTTPS: TLS to this server,
// or to a trusted proxy that says so (the last X-Forwarded-Proto).
func (h *Handler) secure(r *http.Request) bool {
	return r.TLS != nil || h.cfg.TrustProxyHeaders && strings.EqualFold(lastValue(r.Header.Values("X-Forwarded-Proto")), "https")
}

// lastValue is the last element of a list header's values (what the
// nearest proxy added), trimmed.
func lastValue(values []string) string {
	if len(values) == 0 {
		return ""
	}
	v := values[len(values)-1]
	if i := strings.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return strings.TrimSpace(v)
}

// session is a signed-in browser: 8 bytes of start time (Unix seconds), 8
// of the sign-out epoch it was issued in, 16 random bytes.
type session []byte

const sessionBytes = 32

func (s *sessions) mac(parts ...[]byte) []byte {
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// checkToken reports whether token is the admin token.
func (s *sessions) checkToken(token string) bool {
	return subtle.ConstantTimeCompare([]byte(token), s.token) == 1
}

// epoch is the current sign-out epoch: read from the database, or the last
// one read while it cannot be reached.
func (s *sessions) epoch(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var e int64
	if err := s.db.QueryRow(ctx, epochSQL).Scan(&e); err != nil {
		if s.known.Load() && ctx.Err() == nil {
			return s.lastEpoch.Load(), nil
		}
		return 0, fmt.Errorf("dashboard: read the sign-out epoch: %w", err)
	}
	s.lastEpoch.Store(e)
	s.known.Store(true)
	return e, nil
}

// signOut bumps the sign-out epoch: every session issued so far ends.
func (s *sessions) signOut(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var e int64
	if err := s.db.QueryRow(ctx, bumpEpochSQL).Scan(&e); err != nil {
		return fmt.Errorf("dashboard: bump the sign-out epoch: %w", err)
	}
	s.lastEpoch.Store(e)
	s.known.Store(true)
	return nil
}

// issue makes a new session in the current epoch and its cookie value.
func (s *sessions) issue(ctx context.Context) (string, error) {
	e, err := s.epoch(ctx)
	if err != nil {
		return "", err
	}
	id := make(session, sessionBytes)
	binary.BigEndian.PutUint64(id, uint64(s.clock.Now().Unix()))
	binary.BigEndian.PutUint64(id[8:], uint64(e))
	_, _ = rand.Read(id[16:])
	enc := base64.RawURLEncoding
	return enc.EncodeToString(id) + "." + enc.EncodeToString(s.mac([]byte("session"), id)), nil
}

// read returns the request's session if its cookie is signed by this key,
// not older than the TTL, and of the current epoch (not signed out).
func (s *sessions) read(r *http.Request) (session, bool) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return nil, false
	}
	payload, sig, ok := strings.Cut(c.Value, ".")
	if !ok {
		return nil, false
	}
	enc := base64.RawURLEncoding
	id, err1 := enc.DecodeString(payload)
	mac, err2 := enc.DecodeString(sig)
	if err1 != nil || err2 != nil || len(id) != sessionBytes || !hmac.Equal(mac, s.mac([]byte("session"), id)) {
		return nil, false
	}
	started := time.Unix(int64(binary.BigEndian.Uint64(id)), 0)
	if age := s.clock.Since(started); age < -time.Minute || age > s.ttl {
		return nil, false
	}
	e, err := s.epoch(r.Context())
	if err != nil || int64(binary.BigEndian.Uint64(id[8:])) != e {
		return nil, false
	}
	return session(id), true
}

// csrf is the session's CSRF token, which every form carries.
func (s *sessions) csrf(id session) string {
	return base64.RawURLEncoding.EncodeToString(s.mac([]byte("csrf"), id))
}

// checkCSRF reports whether the form's token is the session's.
func (s *sessions) checkCSRF(id session, token string) bool {
	want := s.csrf(id)
	return subtle.ConstantTimeCompare([]byte(token), []byte(want)) == 1
}

// loginPage asks for the admin token.
type loginPage struct {
	*Base
	Back  string
	Wrong bool
	// Wait is set when this address failed too often: how long until it
	// may try again.
	Wait string
}

func (h *Handler) loginForm(w http.ResponseWriter, r *http.Request) {
	b := h.base(w, r)
	b.Title = "Sign in"
	h.render(w, "login", http.StatusOK, &loginPage{Base: b, Back: localPath(r.URL.Query().Get("back"))}, time.Now())
}

// login checks the admin token and starts a session: a cookie that ends
// with the browser session (no Max-Age), HttpOnly, SameSite=Strict, Secure
// when the request came over HTTPS (h.secure). An address over its limit
// of wrong tokens is refused before its form is read.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	b := h.base(w, r)
	b.Title = "Sign in"
	if h.refused(w, r, b) {
		return
	}
	addr, now := h.clientAddr(r), h.session.clock.Now()
	if wait := h.session.failures.wait(addr, now); wait > 0 {
		secs := int(math.Ceil(wait.Seconds()))
		h.cfg.Logger.Warn("dashboard: sign-in refused (too many wrong tokens)", "remote", addr, "retry_after_s", secs)
		w.Header().Set("Retry-After", fmt.Sprint(secs))
		h.render(w, "login", http.StatusTooManyRequests, &loginPage{Base: b, Back: "/", Wait: fmt.Sprintf("%d s", secs)}, time.Now())
		return
	}
	if !h.readForm(w, r, b) {
		return
	}
	back := localPath(r.PostFormValue("back"))
	if !h.session.checkToken(r.PostFormValue("token")) {
		h.session.failures.fail(addr, now)
		h.cfg.Logger.Warn("dashboard: sign-in refused (wrong admin token)", "remote", addr)
		h.render(w, "login", http.StatusForbidden, &loginPage{Base: b, Back: back, Wrong: true}, time.Now())
		return
	}
	value, err := h.session.issue(r.Context())
	if err != nil {
		h.sessionFailed(w, r, b, "not signed in", err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: h.secure(r)})
	h.cfg.Logger.Info("dashboard: signed in", "remote", addr)
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// logout ends the browser's session and, when it is signed in, every
// session issued so far (the epoch), so the cookie cannot be replayed.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if _, ok := sessionOf(r); ok {
		if err := h.session.signOut(r.Context()); err != nil {
			h.sessionFailed(w, r, h.base(w, r), "not signed out", err)
			return
		}
		h.cfg.Logger.Info("dashboard: signed out (every session ends)", "remote", h.clientAddr(r))
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: h.secure(r)})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// sessionFailed answers a sign-in or sign-out that could not read or bump
// the sign-out epoch: 503 while the database is unreachable, else 500 (the
// schema may lack fleetpace_dashboard_epoch: `fleetpace schema apply`).
func (h *Handler) sessionFailed(w http.ResponseWriter, r *http.Request, b *Base, what string, err error) {
	if dbconn.IsUnavailable(err) {
		h.unreachable(w, r, b, what, err)
		return
	}
	h.cfg.Logger.Error("dashboard: "+what, "err", redact.Text(err.Error()))
	b.Title = "Sign-in failed"
	h.fail(w, r, b, http.StatusInternalServerError, what+": "+redact.Text(err.Error())+" (is the schema applied? fleetpace schema apply)")
}

// localPath is p if it is a path on this server, else "/": redirects never
// leave the dashboard. A browser reads a Location leniently — it drops
// tabs and newlines anywhere, reads '\' as '/', and "//host" as another
// server — so a path with a control or space character, a backslash, or a
// second '/' at its start is refused, and so is anything url.Parse does
// not read as a plain path.
func localPath(p string) string {
	if p == "" || p[0] != '/' || strings.HasPrefix(p, "//") || strings.ContainsRune(p, '\\') || !utf8.ValidString(p) ||
		strings.IndexFunc(p, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) }) >= 0 {
		return "/"
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return "/"
	}
	return p
}
