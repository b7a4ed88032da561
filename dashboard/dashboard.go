// Package dashboard is fleetpace's web dashboard: what each platform is
// doing now, why, and the buttons to steer it. It is served by every
// worker's HTTP server at / and by `fleetpace dashboard` without a worker.
//
// Pages are rendered on the server with html/template from the database
// (through the owning packages: pacer, sources, fleet), with their assets
// embedded in the binary; they work with JavaScript off. JavaScript only
// refreshes the page in place and ticks the countdowns. Every query a page
// runs is bounded (pages of platforms and sources, keyset pagination) and
// indexed, so a page costs the same with ten platforms or ten thousand.
//
// Actions (pause, resume, clear a cooldown, reset a platform's pace, check
// a platform or a source now, change rate and burst, disable and enable a
// source) are POST forms, off unless the dashboard has an
// admin token: a browser signs in with it once per session (a signed,
// HttpOnly, SameSite=Strict cookie that signing out revokes everywhere)
// and every form carries a CSRF token derived from that session.
//
// The Handler is the whole site: the dashboard, River UI and the other
// endpoints of the server (Config.Endpoints), all behind one guard
// (guard.go) that checks the Host, refuses cross-origin state changes and
// bad input, bounds request bodies and asks for sign-in; Serve runs it
// with the server's timeouts.
package dashboard

import (
	"bytes"
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/redact"
)

// Defaults of Config.
const (
	DefaultPageSize     = 50
	MaxPageSize         = 500
	DefaultQueryTimeout = 5 * time.Second
	DefaultSessionTTL   = 12 * time.Hour
	DefaultRefresh      = 5 * time.Second
	DefaultReads        = 2
)

// RiverUIPath is where River UI is served (Config.RiverUI), which the
// dashboard links its job views to.
const RiverUIPath = "/riverui/"

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("invalid config")

// DB is what the dashboard needs from a pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Config configures the dashboard. The zero value of every field but DB
// means its default.
type Config struct {
	// DB is the database shown and acted on (a pool). Required.
	DB DB
	// AdminToken turns the actions on: a browser signs in with it once per
	// session. Empty: the dashboard is read-only. It must not begin or end
	// with a space nor hold control characters, and beyond loopback
	// (Listen) it must be at least MinTokenBytes long.
	AdminToken string
	// PageSize is how many platforms, or sources, a page lists. Default
	// DefaultPageSize, at most MaxPageSize.
	PageSize int
	// QueryTimeout bounds the reads of one page, or one action. Default
	// DefaultQueryTimeout.
	QueryTimeout time.Duration
	// Reads is how many pages read the database at once (each holds one
	// connection of DB while it reads); more wait their turn within
	// QueryTimeout, so a storm of page requests cannot take the pool.
	// Default DefaultReads.
	Reads int
	// SessionTTL is how long a sign-in lasts (the cookie also ends with the
	// browser session). Default DefaultSessionTTL.
	SessionTTL time.Duration
	// Refresh is how often a page refreshes itself in place when JavaScript
	// is on. Default DefaultRefresh.
	Refresh time.Duration
	// Degraded, if set, reports whether this process's pacer is pacing
	// locally because it cannot reach the database (the worker's); the
	// pages then say so in a banner.
	Degraded func() bool
	// RiverUI, if set, is River UI's handler (RiverUI returns one), served
	// at RiverUIPath behind the guard, and behind the sign-in when there is
	// an AdminToken; job-related views link to it. Nil: not served.
	RiverUI http.Handler
	// Queue, if set, queues the fetch jobs of the "check now" actions (an
	// insert-only River client will do). Nil: no check-now buttons.
	Queue *queue.Client
	// Endpoints are the server's other handlers (the worker's /healthz,
	// /readyz, /metrics, /status), served behind the same guard.
	Endpoints []Endpoint

	// Listen is the address the server listens on. Its IP address is one
	// of the allowed hosts (every interface's for an unspecified one), and
	// beyond loopback with an AdminToken every page needs sign-in unless
	// PublicRead. Nil: loopback.
	Listen net.Addr
	// AllowedHosts are the host names (or IP addresses) requests may name
	// in their Host header besides the loopback names (localhost, any
	// loopback address) and Listen's: a Host naming another server is
	// refused (421), which defeats DNS rebinding. Case does not matter; a
	// port, if given, is ignored.
	AllowedHosts []string
	// PublicRead keeps the pages (and Endpoints not marked Open) readable
	// without sign-in beyond loopback with an AdminToken; actions and
	// River UI still need it.
	PublicRead bool
	// TrustProxyHeaders trusts the X-Forwarded-Proto and X-Forwarded-For
	// headers of a TLS-terminating proxy in front of the server: a request
	// that the proxy says came over HTTPS gets a Secure session cookie, and
	// sign-in failures are counted by the address the proxy names. Set it
	// only when every request comes through such a proxy (a client could
	// otherwise spoof them).
	TrustProxyHeaders bool
	// Clock times sessions. Default: the real clock.
	Clock clock.Clock
	// Logger receives failed reads and every action taken. Default: discard.
	Logger *slog.Logger
}

// Endpoint is a handler of the server besides the dashboard's pages.
type Endpoint struct {
	// Pattern is its http.ServeMux pattern ("GET /readyz").
	Pattern string
	// Handler serves it.
	Handler http.Handler
	// Open endpoints answer whatever the Host and without sign-in: health
	// checks and metrics scrapes name the server by whatever reaches it (a
	// pod's address, a service name). They must not change state.
	Open bool
}

func (c Config) withDefaults() Config {
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.QueryTimeout = cmp.Or(c.QueryTimeout, DefaultQueryTimeout)
	c.Reads = cmp.Or(c.Reads, DefaultReads)
	c.SessionTTL = cmp.Or(c.SessionTTL, DefaultSessionTTL)
	c.Refresh = cmp.Or(c.Refresh, DefaultRefresh)
	c.Clock = clock.Or(c.Clock)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: dashboard.Config."+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.DB == nil:
		return bad("DB is required")
	case c.PageSize < 0 || c.PageSize > MaxPageSize:
		return bad("PageSize must be in 1..%d (0: default), got %d", MaxPageSize, c.PageSize)
	case c.QueryTimeout < 0:
		return bad("QueryTimeout must be > 0 (0: default), got %s", c.QueryTimeout)
	case c.Reads < 0:
		return bad("Reads must be ≥ 1 (0: default), got %d", c.Reads)
	case c.SessionTTL < 0:
		return bad("SessionTTL must be > 0 (0: default), got %s", c.SessionTTL)
	case c.Refresh < 0:
		return bad("Refresh must be > 0 (0: default), got %s", c.Refresh)
	}
	if err := CheckAdminToken(c.AdminToken, addrHost(c.Listen)); err != nil {
		return bad("AdminToken %v", err)
	}
	for _, host := range c.AllowedHosts {
		if err := CheckAllowedHost(host); err != nil {
			return bad("AllowedHosts %v", err)
		}
	}
	for _, e := range c.Endpoints {
		if e.Pattern == "" || e.Handler == nil {
			return bad("Endpoints must each have a Pattern and a Handler, got %q", e.Pattern)
		}
	}
	return nil
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Handler serves the dashboard's pages, actions and assets, River UI and
// the server's other endpoints, all behind the guard (ServeHTTP).
type Handler struct {
	cfg     Config
	mux     *http.ServeMux // everything but the open endpoints
	open    *http.ServeMux // the open endpoints
	tmpl    map[string]*template.Template
	session *sessions    // nil: actions off
	hosts   allowedHosts // what the Host header may name
	origin  *http.CrossOriginProtection
	reads   chan struct{} // a slot per page read at once
	// readNeedsSignIn: every page needs sign-in (a token beyond loopback,
	// not PublicRead).
	readNeedsSignIn bool
}

// New returns the dashboard's handler.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), open: http.NewServeMux(),
		hosts: newAllowedHosts(cfg.Listen, cfg.AllowedHosts), origin: http.NewCrossOriginProtection(),
		reads: make(chan struct{}, cfg.Reads)}
	var err error
	if h.tmpl, err = parseTemplates(); err != nil {
		return nil, err
	}
	if cfg.AdminToken != "" {
		h.session = newSessions(cfg.AdminToken, cfg.DB, cfg.SessionTTL, cfg.QueryTimeout, cfg.Clock)
		h.readNeedsSignIn = !cfg.PublicRead && !isLoopback(addrHost(cfg.Listen))
	}
	assets, err := fs.Sub(assetFS, "assets")
	if err != nil {
		return nil, err
	}
	h.mux.Handle("GET /assets/", http.StripPrefix("/assets/", cacheable(http.FileServerFS(assets))))
	h.mux.HandleFunc("GET /{$}", h.page("overview", h.overview))
	h.mux.HandleFunc("GET /platforms/{name}", h.page("platform", h.platform))
	h.mux.HandleFunc("GET /sources/{id}", h.page("source", h.source))
	h.mux.HandleFunc("GET /sources", h.findSource)
	h.mux.HandleFunc("GET /platforms", h.findPlatform)
	h.mux.HandleFunc("GET /login", h.loginForm)
	h.mux.HandleFunc("POST /login", h.login)
	h.mux.HandleFunc("POST /logout", h.logout)
	h.mux.HandleFunc("POST /platforms/{name}/pause", h.action(h.pause))
	h.mux.HandleFunc("POST /platforms/{name}/resume", h.action(h.resume))
	h.mux.HandleFunc("POST /platforms/{name}/clear-cooldown", h.action(h.clearCooldown))
	h.mux.HandleFunc("POST /platforms/{name}/limits", h.action(h.setLimits))
	h.mux.HandleFunc("POST /platforms/{name}/reset", h.action(h.reset))
	h.mux.HandleFunc("POST /platforms/{name}/check", h.action(h.checkPlatform))
	h.mux.HandleFunc("POST /sources/{id}/check", h.action(h.checkSource))
	h.mux.HandleFunc("POST /sources/{id}/enable", h.action(h.enableSource))
	h.mux.HandleFunc("POST /sources/{id}/disable", h.action(h.disableSource))
	if cfg.RiverUI != nil {
		h.mux.Handle(RiverUIPath, cfg.RiverUI)
		h.mux.Handle(RiverUIPath[:len(RiverUIPath)-1], http.RedirectHandler(RiverUIPath, http.StatusMovedPermanently))
	}
	for _, e := range cfg.Endpoints {
		if e.Open {
			h.open.Handle(e.Pattern, e.Handler)
		} else {
			h.mux.Handle(e.Pattern, e.Handler)
		}
	}
	return h, nil
}

func cacheable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		next.ServeHTTP(w, r)
	})
}

// base is what every page shows around its content.
type Base struct {
	Title     string
	Path      string // the page's path, where actions come back to
	Now       time.Time
	Admin     bool   // actions are on (the dashboard has a token)
	SignedIn  bool   // and this browser has signed in
	CanCheck  bool   // the "check now" actions can queue jobs (Config.Queue)
	CSRF      string // the session's CSRF token, for forms
	RiverUI   string // River UI's path ("": not served)
	RefreshMS int64
	Banners   []string // what is wrong: the database, the pacer
	Notice    string   // the result of the last action
	QueryTime time.Duration
}

func (b *Base) common() *Base { return b }

// view is what a page's loader returns: a struct embedding *Base.
type view interface{ common() *Base }

// loader reads a page's data. It returns errNotFound (wrapped) for a
// missing platform or source, a badRequest for bad parameters.
type loader func(ctx context.Context, r *http.Request, b *Base) (view, error)

var errNotFound = errors.New("not found")

// badRequest is bad input in a request: a field and why.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badf(format string, args ...any) error { return &badRequest{fmt.Sprintf(format, args...)} }

// page serves a page: it reads through load within QueryTimeout (waiting
// for one of the Reads slots first), renders the template into a buffer,
// and answers with Server-Timing (the reads' time and the whole answer's).
// A client that went away gets nothing, and is no failure of the
// database's.
func (h *Handler) page(name string, load loader) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		b := h.base(w, r)
		ctx, cancel := context.WithTimeout(r.Context(), h.cfg.QueryTimeout)
		v, err := h.withReadSlot(ctx, func(ctx context.Context) (view, error) { return load(ctx, r, b) })
		cancel()
		b.QueryTime = time.Since(start)
		tmpl, status := name, http.StatusOK
		var bad *badRequest
		switch {
		case err == nil:
		case r.Context().Err() != nil:
			h.cfg.Logger.Debug("dashboard: client went away", "page", name, "remote", r.RemoteAddr)
			return
		case errors.As(err, &bad):
			h.fail(w, r, b, http.StatusBadRequest, bad.msg)
			return
		case errors.Is(err, errNotFound):
			h.fail(w, r, b, http.StatusNotFound, err.Error())
			return
		case dbconn.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded):
			h.cfg.Logger.Warn("dashboard: database unreachable", "page", name, "err", redact.Text(err.Error()))
			b.Banners = append(b.Banners, "The database is unreachable: "+redact.Text(err.Error())+". The figures below are missing; workers pace locally until it is back.")
			w.Header().Set("Retry-After", "1")
			status, v, tmpl = http.StatusServiceUnavailable, &errorPage{Base: b}, "error"
		default:
			h.cfg.Logger.Error("dashboard: page failed", "page", name, "err", redact.Text(err.Error()))
			h.fail(w, r, b, http.StatusInternalServerError, redact.Text(err.Error()))
			return
		}
		h.render(w, tmpl, status, v, start)
	}
}

// withReadSlot runs fn in one of the Reads slots, waiting for one within
// ctx.
func (h *Handler) withReadSlot(ctx context.Context, fn func(context.Context) (view, error)) (view, error) {
	select {
	case h.reads <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("dashboard: waiting for a read slot: %w", context.Cause(ctx))
	}
	defer func() { <-h.reads }()
	return fn(ctx)
}

// base fills what every page shows.
func (h *Handler) base(_ http.ResponseWriter, r *http.Request) *Base {
	b := &Base{
		Path:      r.URL.RequestURI(),
		Now:       time.Now(),
		Admin:     h.session != nil,
		CanCheck:  h.cfg.Queue != nil,
		RefreshMS: h.cfg.Refresh.Milliseconds(),
		Notice:    notices[r.URL.Query().Get("done")],
	}
	if h.cfg.RiverUI != nil {
		b.RiverUI = RiverUIPath
	}
	if s, ok := sessionOf(r); ok {
		b.SignedIn, b.CSRF = true, h.session.csrf(s)
	}
	if h.cfg.Degraded != nil && h.cfg.Degraded() {
		b.Banners = append(b.Banners, "This process's pacer cannot reach the database and paces locally at rate / (fleet size + 1): shared state below may be stale.")
	}
	return b
}

// errorPage is a page that could not be shown, and why.
type errorPage struct {
	*Base
	Status  int
	Message string
}

func (h *Handler) fail(w http.ResponseWriter, _ *http.Request, b *Base, status int, msg string) {
	b.Title = http.StatusText(status)
	h.render(w, "error", status, &errorPage{Base: b, Status: status, Message: msg}, time.Now())
}

// render executes a page's template into a buffer and writes it with its
// status and timings.
func (h *Handler) render(w http.ResponseWriter, name string, status int, v view, start time.Time) {
	var buf bytes.Buffer
	if err := h.tmpl[name].ExecuteTemplate(&buf, "layout", v); err != nil {
		h.cfg.Logger.Error("dashboard: render", "page", name, "err", err)
		http.Error(w, "render failed", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Server-Timing", fmt.Sprintf("db;dur=%.1f, total;dur=%.1f",
		ms(v.common().QueryTime), ms(time.Since(start))))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pageSize reads ?n= (bounded), else the configured size.
func (h *Handler) pageSize(r *http.Request) (int, error) {
	s := r.URL.Query().Get("n")
	if s == "" {
		return h.cfg.PageSize, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxPageSize {
		return 0, badf("n must be a number in 1..%d, got %q", MaxPageSize, s)
	}
	return n, nil
}
