package dashboard

import (
	"context"
	"errors"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The guard: every request the server answers goes through ServeHTTP,
// which refuses, before any handler runs or any body is read,
//
//   - a Host header that names neither a loopback name, nor the address
//     the server listens on, nor Config.AllowedHosts (421): a page of
//     another site that rebinds its name to this server's address is
//     refused, whatever it asks;
//   - a path or query parameter that is not UTF-8 or holds a NUL (400):
//     PostgreSQL would refuse it as text;
//   - a state-changing request (any method but GET, HEAD, OPTIONS) that a
//     browser says comes from another origin — Sec-Fetch-Site other than
//     same-origin (a sibling same-site origin included), or an Origin
//     that is not this server's (403), with or without a token; to River
//     UI's API, without either header (no browser said where it comes
//     from), one that is not Content-Type: application/json (415); to the
//     dashboard, one that is not a URL-encoded form (415);
//   - a body over MaxBodyBytes (413, read through http.MaxBytesReader);
//   - with an admin token, River UI without sign-in; and beyond loopback
//     every page too (Config.PublicRead turns that off): pages are sent
//     to sign in and back, other requests get 401.
//
// Endpoints marked Open (health checks, metrics) skip the Host check and
// the sign-in. Every answer carries the security headers (securityHeaders).

// MaxBodyBytes bounds the body of any request: the dashboard's forms and
// River UI's API requests are a few hundred bytes.
const MaxBodyBytes = 64 << 10

// MinTokenBytes is the shortest admin token accepted for a server that
// listens beyond loopback, where anyone who can reach it may guess.
const MinTokenBytes = 32

// csp is the dashboard's Content-Security-Policy: its own scripts, styles
// and images only, never framed, forms posted to itself only.
const csp = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; object-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"

// riverUICSP is River UI's: the same, except that its components set
// inline styles.
const riverUICSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; object-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"

// securityHeaders forbid framing and sniffing, keep the URL (and its query)
// from other sites, and allow only the server's own scripts and styles.
func securityHeaders(w http.ResponseWriter, riverUI bool) {
	hd := w.Header()
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	if riverUI {
		hd.Set("Content-Security-Policy", riverUICSP)
	} else {
		hd.Set("Content-Security-Policy", csp)
	}
}

// ServeHTTP is the guard (see above), then the route.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	riverUI := h.cfg.RiverUI != nil && strings.HasPrefix(r.URL.Path, RiverUIPath[:len(RiverUIPath)-1])
	securityHeaders(w, riverUI)
	if _, pattern := h.open.Handler(r); pattern != "" {
		h.open.ServeHTTP(w, r)
		return
	}
	if !h.hosts.allow(r.Host) {
		h.cfg.Logger.Debug("dashboard: request for another host refused", "host", r.Host, "remote", r.RemoteAddr) // scanners send any: no warning
		refuse(w, http.StatusMisdirectedRequest, fmt.Sprintf("this server does not answer to the host %q (allowed: the loopback names, the address it listens on, and the allowed hosts it was given)", r.Host))
		return
	}
	if msg := badInput(r); msg != "" {
		refuse(w, http.StatusBadRequest, msg)
		return
	}
	if unsafeMethod(r.Method) {
		if h.origin.Check(r) != nil {
			h.cfg.Logger.Warn("dashboard: cross-origin request refused", "path", r.URL.Path, "origin", r.Header.Get("Origin"),
				"sec_fetch_site", r.Header.Get("Sec-Fetch-Site"), "remote", r.RemoteAddr)
			refuse(w, http.StatusForbidden, "cross-origin request refused: the dashboard and River UI take state changes from their own pages only")
			return
		}
		if msg := badContentType(r, riverUI); msg != "" {
			refuse(w, http.StatusUnsupportedMediaType, msg)
			return
		}
		// On a copy of the request: net/http looks at the original's body
		// after the handler to decide whether to drain it or close the
		// connection, and would wait to drain a bounded one.
		bounded := r.WithContext(r.Context())
		bounded.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		r = bounded
	}
	if h.session != nil && !strings.HasPrefix(r.URL.Path, "/assets/") {
		if s, ok := h.session.read(r); ok {
			r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, s))
		} else if riverUI || (h.readNeedsSignIn && !publicPath(r.URL.Path)) {
			signInFirst(w, r, riverUI)
			return
		}
	}
	h.mux.ServeHTTP(w, r)
}

// sessionKey is the request context's key of the signed-in session the
// guard read.
type sessionKey struct{}

// sessionOf returns the request's signed-in session, if the guard found
// one.
func sessionOf(r *http.Request) (session, bool) {
	s, ok := r.Context().Value(sessionKey{}).(session)
	return s, ok
}

// publicPath reports the paths served without sign-in whatever the
// configuration: signing in and out, and the assets of the sign-in page.
func publicPath(p string) bool {
	return p == "/login" || p == "/logout" || strings.HasPrefix(p, "/assets/")
}

// signInFirst sends a page request to sign in and back; any other request
// (River UI's API, an action, a script) gets 401.
func signInFirst(w http.ResponseWriter, r *http.Request, riverUI bool) {
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && !(riverUI && strings.Contains(r.URL.Path, "/api/")) {
		http.Redirect(w, r, "/login?back="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	refuse(w, http.StatusUnauthorized, "sign in to the dashboard with the admin token first")
}

// refuse answers a request the guard refused with a short text; nothing
// of the request is read further.
func refuse(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Connection", "close")
	http.Error(w, msg, status)
}

func unsafeMethod(m string) bool {
	return m != http.MethodGet && m != http.MethodHead && m != http.MethodOptions
}

// badInput says what is wrong with a request's path or query parameters
// ("" if nothing): not UTF-8, or a NUL. PostgreSQL stores neither as text.
func badInput(r *http.Request) string {
	if !cleanText(r.URL.Path) {
		return "the path must be UTF-8 without NUL characters"
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return "the query string is malformed"
	}
	for k, vs := range q {
		for _, v := range append(vs, k) {
			if !cleanText(v) {
				return fmt.Sprintf("query parameter %q must be UTF-8 without NUL characters", strings.ToValidUTF8(strings.ReplaceAll(k, "\x00", ""), "?"))
			}
		}
	}
	return ""
}

// cleanText reports text PostgreSQL can store: UTF-8 without NUL.
func cleanText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// badContentType says why a state-changing request's body is refused ("":
// it is not). River UI's API takes JSON: a request without Origin and
// Sec-Fetch-Site (so not from a page of this server's, whose browser says
// so) must say Content-Type: application/json, which no cross-site form
// can send. The dashboard's actions are URL-encoded forms: a multipart
// upload is refused before anything reads it.
func badContentType(r *http.Request, riverUI bool) string {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		mt = ""
	}
	switch {
	case riverUI:
		if r.Header.Get("Origin") == "" && r.Header.Get("Sec-Fetch-Site") == "" && mt != "application/json" {
			return "River UI's API takes Content-Type: application/json"
		}
	case r.Header.Get("Content-Type") != "" && mt != "application/x-www-form-urlencoded":
		return "the dashboard's forms are application/x-www-form-urlencoded"
	}
	return ""
}

// allowedHosts are the names a request's Host header may give.
type allowedHosts struct {
	names map[string]bool // lower case, without port or brackets
	addrs map[netip.Addr]bool
}

// newAllowedHosts allows the loopback names, listen's address (or, when it
// is unspecified, every interface's) and extra.
func newAllowedHosts(listen net.Addr, extra []string) allowedHosts {
	a := allowedHosts{names: map[string]bool{"localhost": true}, addrs: map[netip.Addr]bool{}}
	for _, n := range extra {
		a.add(n)
	}
	ip, err := netip.ParseAddr(addrHost(listen))
	switch {
	case err != nil && addrHost(listen) != "":
		a.add(addrHost(listen))
	case err == nil && ip.IsUnspecified():
		a.addrs[ip.Unmap()] = true // a client may dial it, and name it
		ifaces, _ := net.InterfaceAddrs()
		for _, ia := range ifaces {
			if p, err := netip.ParsePrefix(ia.String()); err == nil {
				a.addrs[p.Addr().Unmap()] = true
			}
		}
	case err == nil:
		a.addrs[ip.Unmap()] = true
	}
	return a
}

func (a allowedHosts) add(host string) {
	host = hostOnly(host)
	if ip, err := netip.ParseAddr(host); err == nil {
		a.addrs[ip.Unmap()] = true
		return
	}
	a.names[host] = true
}

// allow reports whether a Host header names this server.
func (a allowedHosts) allow(hostHeader string) bool {
	host := hostOnly(hostHeader)
	if ip, err := netip.ParseAddr(host); err == nil {
		ip = ip.Unmap()
		return ip.IsLoopback() || a.addrs[ip]
	}
	return host != "" && a.names[host]
}

// list is the allowed names and addresses, sorted, for the log.
func (a allowedHosts) list() []string {
	out := []string{"loopback"}
	for n := range a.names {
		out = append(out, n)
	}
	for ip := range a.addrs {
		out = append(out, ip.String())
	}
	slices.Sort(out[1:])
	return out
}

// hostOnly is a host[:port] without its port and brackets, in lower case,
// without a final dot.
func hostOnly(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	return strings.ToLower(host)
}

// addrHost is the host of a listen address ("" for none).
func addrHost(addr net.Addr) string {
	if addr == nil {
		return ""
	}
	if tcp, ok := addr.(*net.TCPAddr); ok {
		if tcp.IP == nil {
			return "::"
		}
		return tcp.IP.String()
	}
	h, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return h
}

// isLoopback reports whether a listen host reaches loopback only: a
// loopback address or "localhost". "" (the default of a Config without
// Listen) counts as loopback.
func isLoopback(host string) bool {
	if host == "" || strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	return err == nil && ip.Unmap().IsLoopback()
}

// ListenHost is the host of a listen address as configured (host:port,
// ":port" for every interface), for CheckAdminToken before listening.
func ListenHost(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return "::" // every interface
	}
	return host
}

// CheckAllowedHost says why host cannot be an allowed host (nil if it
// can): it must be a host name or an IP address, optionally with a port.
func CheckAllowedHost(host string) error {
	if hostOnly(host) == "" || strings.ContainsAny(host, "/@?#\\ \t\r\n,") {
		return fmt.Errorf("must be host names or IP addresses, got %q", host)
	}
	return nil
}

// CheckAdminToken says why token cannot guard a server listening on host
// (nil if it can): a token that begins or ends with a space or holds a
// control character is a mistake of copying; beyond loopback a token
// shorter than MinTokenBytes can be guessed. The error never contains the
// token.
func CheckAdminToken(token, host string) error {
	switch {
	case token == "":
		return nil
	case strings.TrimSpace(token) != token || strings.IndexFunc(token, unicode.IsControl) >= 0:
		return errors.New("must not begin or end with a space nor hold control characters")
	case !isLoopback(host) && len(token) < MinTokenBytes:
		return fmt.Errorf("must be at least %d bytes for a server listening beyond loopback (%s), got %d", MinTokenBytes, host, len(token))
	}
	return nil
}
