package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"riverqueue.com/riverui"

	"github.com/fleetpace/fleetpace/queue"
)

// DefaultAddr is where `fleetpace dashboard` listens: loopback only, and
// not the worker's port, so both can run on one machine.
const DefaultAddr = "127.0.0.1:9470"

// RiverUI returns River UI's handler for client, served under
// DefaultRiverUIPath; it runs until ctx ends.
func RiverUI(ctx context.Context, client *queue.Client, log *slog.Logger) (http.Handler, error) {
	ui, err := riverui.NewHandler(&riverui.HandlerOpts{
		Endpoints: riverui.NewEndpoints(client, nil),
		Logger:    log,
		Prefix:    DefaultRiverUIPath[:len(DefaultRiverUIPath)-1],
	})
	if err != nil {
		return nil, fmt.Errorf("dashboard: river ui: %w", err)
	}
	if err := ui.Start(ctx); err != nil {
		return nil, fmt.Errorf("dashboard: river ui: %w", err)
	}
	return ui, nil
}

// Mount adds River UI to mux at DefaultRiverUIPath (and a redirect from the
// path without its slash).
func Mount(mux *http.ServeMux, riverUI http.Handler) {
	mux.Handle(DefaultRiverUIPath, riverUI)
	mux.Handle(DefaultRiverUIPath[:len(DefaultRiverUIPath)-1], http.RedirectHandler(DefaultRiverUIPath, http.StatusMovedPermanently))
}

// ExposureWarning returns the warning to log when a server with the
// dashboard listens on addr (the bound address) beyond loopback without
// an admin token, naming the risk; "" when there is none.
func ExposureWarning(addr net.Addr, adminToken string) string {
	if adminToken != "" {
		return ""
	}
	if tcp, ok := addr.(*net.TCPAddr); ok && tcp.IP.IsLoopback() {
		return ""
	}
	return fmt.Sprintf("the dashboard listens on %s, beyond loopback, without an admin token: anyone who can reach it "+
		"sees every platform, source URL and failure reason, and River UI at %s lets them cancel, retry and delete jobs; "+
		"bind 127.0.0.1, or put it behind an authenticating proxy (--admin-token turns the dashboard's own actions on "+
		"and puts River UI behind the same sign-in)", addr, DefaultRiverUIPath)
}

// ServerConfig configures Serve.
type ServerConfig struct {
	// Dashboard configures the pages.
	Dashboard Config
	// Addr is the listen address. Default DefaultAddr.
	Addr string
	// RiverClient, if set, serves River UI at DefaultRiverUIPath (an
	// insert-only client will do).
	RiverClient *queue.Client
	// Ready, if set, is called with the bound address once listening.
	Ready func(net.Addr)
}

// Serve serves the dashboard (and River UI) on cfg.Addr until ctx ends,
// then shuts down, letting requests in flight finish for up to 5 s.
func Serve(ctx context.Context, cfg ServerConfig) error {
	dc := cfg.Dashboard
	if cfg.RiverClient != nil {
		dc.RiverUI = DefaultRiverUIPath
	}
	dash, err := New(dc)
	if err != nil {
		return err
	}
	log := dash.cfg.Logger
	mux := http.NewServeMux()
	srvCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	if cfg.RiverClient != nil {
		ui, err := RiverUI(srvCtx, cfg.RiverClient, log)
		if err != nil {
			return err
		}
		Mount(mux, dash.Guard(ui))
	}
	mux.Handle("/", dash)
	addr := cfg.Addr
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("dashboard: listen %s: %w", addr, err)
	}
	if w := ExposureWarning(ln.Addr(), dc.AdminToken); w != "" {
		log.Warn(w)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	log.Info("dashboard listening", "url", "http://"+ln.Addr().String()+"/", "actions", dc.AdminToken != "")
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr())
	}
	select {
	case err := <-done:
		return fmt.Errorf("dashboard: %w", err)
	case <-ctx.Done():
	}
	shutCtx, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer stop()
	err = srv.Shutdown(shutCtx)
	if serveErr := <-done; !errors.Is(serveErr, http.ErrServerClosed) {
		err = errors.Join(err, serveErr)
	}
	if err != nil {
		return fmt.Errorf("dashboard: shutdown: %w", err)
	}
	return nil
}
