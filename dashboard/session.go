package dashboard

import (
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
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetpace/fleetpace/clock"
)

// CookieName is the session cookie's name.
const CookieName = "fleetpace_session"

// sessions signs and checks browser sessions. Nothing is stored: a session
// is a random id and its start time, signed with a key derived from the
// admin token (changing the token signs every browser out), and its CSRF
// token is derived from the session, so a form from another session, or
// from another site, is refused.
type sessions struct {
	token    []byte // the admin token, compared in constant time
	key      []byte
	ttl      time.Duration
	clock    clock.Clock
	failures failures
}

func newSessions(token string, ttl time.Duration, c clock.Clock) *sessions {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("fleetpace dashboard session key v1"))
	return &sessions{token: []byte(token), key: m.Sum(nil), ttl: ttl, clock: c,
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
// sign-in failures are counted by.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// session is a signed-in browser: 8 bytes of start time (Unix seconds) and
// 16 random bytes.
type session []byte

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

// issue makes a new session and its cookie value.
func (s *sessions) issue() (session, string) {
	id := make(session, 24)
	binary.BigEndian.PutUint64(id, uint64(s.clock.Now().Unix()))
	_, _ = rand.Read(id[8:])
	enc := base64.RawURLEncoding
	return id, enc.EncodeToString(id) + "." + enc.EncodeToString(s.mac([]byte("session"), id))
}

// read returns the request's session if its cookie is signed by this key
// and not older than the TTL.
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
	if err1 != nil || err2 != nil || len(id) != 24 || !hmac.Equal(mac, s.mac([]byte("session"), id)) {
		return nil, false
	}
	started := time.Unix(int64(binary.BigEndian.Uint64(id)), 0)
	if age := s.clock.Since(started); age < -time.Minute || age > s.ttl {
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

// crossSite reports a request a browser says comes from another site (the
// Origin header, or Sec-Fetch-Site): refused before anything else.
func crossSite(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return true
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	u, err := url.Parse(origin)
	return err != nil || u.Host != r.Host
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
// when the request came over TLS.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	b := h.base(w, r)
	b.Title = "Sign in"
	if h.refused(w, r, b) {
		return
	}
	back := localPath(r.PostFormValue("back"))
	addr, now := clientAddr(r), h.session.clock.Now()
	if wait := h.session.failures.wait(addr, now); wait > 0 {
		secs := int(math.Ceil(wait.Seconds()))
		h.cfg.Logger.Warn("dashboard: sign-in refused (too many wrong tokens)", "remote", r.RemoteAddr, "retry_after_s", secs)
		w.Header().Set("Retry-After", fmt.Sprint(secs))
		h.render(w, "login", http.StatusTooManyRequests, &loginPage{Base: b, Back: back, Wait: fmt.Sprintf("%d s", secs)}, time.Now())
		return
	}
	if !h.session.checkToken(r.PostFormValue("token")) {
		h.session.failures.fail(addr, now)
		h.cfg.Logger.Warn("dashboard: sign-in refused (wrong admin token)", "remote", r.RemoteAddr)
		h.render(w, "login", http.StatusForbidden, &loginPage{Base: b, Back: back, Wrong: true}, time.Now())
		return
	}
	_, value := h.session.issue()
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	h.cfg.Logger.Info("dashboard: signed in", "remote", r.RemoteAddr)
	http.Redirect(w, r, back, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	if crossSite(r) {
		h.fail(w, r, h.base(w, r), http.StatusForbidden, "cross-site request refused")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// localPath is p if it is a path on this server, else "/": redirects never
// leave the dashboard.
func localPath(p string) string {
	if p == "" || p[0] != '/' || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") || strings.ContainsAny(p, "\r\n") {
		return "/"
	}
	return p
}

// Guard serves next only to a signed-in browser when the dashboard has an
// admin token, so that River UI — its job actions (cancel, retry, delete)
// and the job args it shows — is behind the same sign-in as the
// dashboard's own actions. A page request without a session is sent to
// sign in and back; any other request (River UI's API) gets 401. Without
// a token next is served as it is (ExposureWarning names that risk).
func (h *Handler) Guard(next http.Handler) http.Handler {
	if h.session == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := h.session.read(r); ok {
			next.ServeHTTP(w, r)
			return
		}
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && !strings.Contains(r.URL.Path, "/api/") {
			http.Redirect(w, r, "/login?back="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		http.Error(w, "sign in to the dashboard with the admin token first", http.StatusUnauthorized)
	})
}
