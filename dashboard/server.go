package dashboard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"riverqueue.com/riverui"

	"github.com/fleetpace/fleetpace/queue"
)

// DefaultAddr is where `fleetpace dashboard` listens: loopback only, and
// not the worker's port, so both can run on one machine.
const DefaultAddr = "127.0.0.1:9470"

// Defaults of ServerConfig. Every answer of the server is short (a page's
// reads are bounded by Config.QueryTimeout, River UI's and the worker's
// endpoints by theirs), so a whole answer is bounded too.
const (
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = 10 * time.Second
	DefaultWriteTimeout      = 30 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultShutdownTimeout   = 2 * time.Second
	// MaxHeaderBytes bounds a request's header (a session cookie and a
	// browser's usual headers take 2 KiB).
	MaxHeaderBytes = 32 << 10
)

// RiverUI returns River UI's handler for client, to be served at
// RiverUIPath (Config.RiverUI); it runs until ctx ends.
func RiverUI(ctx context.Context, client *queue.Client, log *slog.Logger) (http.Handler, error) {
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    log,
		Prefix:    RiverUIPath[:len(RiverUIPath)-1],
	})
	if err != nil {
		return nil, fmt.Errorf("dashboard: river ui: %w", err)
	}
	if err := ui.Start(ctx); err != nil {
		return nil, fmt.Errorf("dashboard: river ui: %w", err)
	}
	return ui, nil
}

// ServerConfig configures Serve. The zero value of every field but
// Dashboard.DB means its default.
type ServerConfig struct {
	// Dashboard configures the pages, the guard and the other endpoints;
	// Serve sets its Listen (and RiverUI, with RiverClient).
	Dashboard Config
	// Addr is the listen address. Default DefaultAddr.
	Addr string
	// RiverClient, if set, serves River UI at RiverUIPath (an insert-only
	// client will do) and is the dashboard's Queue unless that is set.
	RiverClient *queue.Client
	// ReadHeaderTimeout bounds reading a request's header, ReadTimeout the
	// whole request (a body sent slowly is cut off), WriteTimeout an answer
	// (from the end of the request's header), IdleTimeout a keep-alive
	// connection waiting for its next request. Defaults
	// DefaultReadHeaderTimeout, DefaultReadTimeout, DefaultWriteTimeout,
	// DefaultIdleTimeout.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ShutdownTimeout is how long requests in flight may finish once ctx
	// ends; the connections still open then are closed. Default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Ready, if set, is called with the bound address once listening.
	Ready func(net.Addr)
}

func (c ServerConfig) withDefaults() ServerConfig {
	c.Addr = cmp.Or(c.Addr, DefaultAddr)
	c.ReadHeaderTimeout = cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	c.ReadTimeout = cmp.Or(c.ReadTimeout, DefaultReadTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	return c
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig,
// before anything listens: the dashboard's configuration, the admin token
// for the address it will listen on (CheckAdminToken), the timeouts.
func (c ServerConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: dashboard."+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return bad("ServerConfig.Addr must be host:port, got %q", c.Addr)
		}
	}
	for name, d := range map[string]time.Duration{"ReadHeaderTimeout": c.ReadHeaderTimeout, "ReadTimeout": c.ReadTimeout,
		"WriteTimeout": c.WriteTimeout, "IdleTimeout": c.IdleTimeout, "ShutdownTimeout": c.ShutdownTimeout} {
		if d < 0 {
			return bad("ServerConfig.%s must be > 0 (0: default), got %s", name, d)
		}
	}
	if err := CheckAdminToken(c.Dashboard.AdminToken, ListenHost(cmp.Or(c.Addr, DefaultAddr))); err != nil {
		return bad("Config.AdminToken %v", err)
	}
	return c.Dashboard.Validate()
}

// Serve serves the dashboard, River UI (with RiverClient) and the
// configured endpoints on cfg.Addr until ctx ends, every request through
// the guard, with the server's timeouts. Then it shuts down: requests in
// flight get ShutdownTimeout to finish, and the connections still open
// after it (a client sending its body slowly, an idle keep-alive) are
// closed. A shutdown that had to close connections is no error.
func Serve(ctx context.Context, cfg ServerConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	dc := cfg.Dashboard.withDefaults()
	log := dc.Logger
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("dashboard: listen %s: %w", cfg.Addr, err)
	}
	defer ln.Close()
	srvCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	if cfg.RiverClient != nil {
		if dc.RiverUI, err = RiverUI(srvCtx, cfg.RiverClient, log); err != nil {
			return err
		}
	}
	dc.Listen = ln.Addr()
	if dc.Queue == nil {
		dc.Queue = cfg.RiverClient
	}
	dash, err := New(dc)
	if err != nil {
		return err
	}
	if level, msg := exposure(dc); msg != "" {
		log.Log(ctx, level, msg)
	}
	srv := &http.Server{
		Handler:           dash,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	log.Info("http server listening", "addr", ln.Addr().String(), "actions", dc.AdminToken != "",
		"hosts", strings.Join(dash.hosts.list(), ","))
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr())
	}
	select {
	case err := <-done:
		return fmt.Errorf("dashboard: %w", err)
	case <-ctx.Done():
	}
	shutCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer stop()
	if err := srv.Shutdown(shutCtx); errors.Is(err, context.DeadlineExceeded) {
		log.Warn("dashboard: requests still open after the shutdown timeout: their connections are closed", "timeout", cfg.ShutdownTimeout)
		err = srv.Close()
		if err != nil {
			log.Warn("dashboard: closing connections", "err", err)
		}
	} else if err != nil {
		return fmt.Errorf("dashboard: shutdown: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("dashboard: %w", err)
	}
	return nil
}

// exposure returns what to log about who can reach a server with the
// dashboard configured by cfg (its Listen set), and at which level; ""
// when it listens on loopback only.
func exposure(cfg Config) (slog.Level, string) {
	if isLoopback(addrHost(cfg.Listen)) {
		return slog.LevelInfo, ""
	}
	public := "the sign-in page"
	if open := endpointPaths(cfg.Endpoints, true); open != "" {
		public += ", " + open
	}
	switch {
	case cfg.AdminToken == "":
		return slog.LevelWarn, fmt.Sprintf("the dashboard listens on %s, beyond loopback, without an admin token: anyone who can reach it "+
			"sees every platform, source URL (secrets masked) and failure reason, and River UI at %s lets them cancel, retry and delete jobs; "+
			"bind 127.0.0.1, or set --admin-token to put every page and River UI behind a sign-in", cfg.Listen, RiverUIPath)
	case cfg.PublicRead:
		if more := endpointPaths(cfg.Endpoints, false); more != "" {
			public += ", " + more
		}
		return slog.LevelWarn, fmt.Sprintf("the dashboard listens on %s, beyond loopback, with --public-read: anyone who can reach it reads "+
			"every page (platforms, source URLs with their secrets masked, failure reasons) and %s; actions and River UI need sign-in",
			cfg.Listen, public)
	}
	return slog.LevelInfo, fmt.Sprintf("the dashboard listens on %s, beyond loopback: every page and River UI need sign-in with the admin token; "+
		"public: %s", cfg.Listen, public)
}

// endpointPaths lists the paths of the open (or the other) endpoints.
func endpointPaths(endpoints []Endpoint, open bool) string {
	var paths []string
	for _, e := range endpoints {
		if e.Open == open {
			_, path, _ := strings.Cut(e.Pattern, " ")
			paths = append(paths, cmp.Or(path, e.Pattern))
		}
	}
	return strings.Join(paths, ", ")
}
