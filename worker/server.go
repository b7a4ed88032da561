package worker

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/status"
)

// ReadyMaxAge is how old the answer of /readyz may be: the database is
// pinged at most once per ReadyMaxAge, however many probes ask.
const ReadyMaxAge = time.Second

// endpointTimeout bounds one read of /readyz's or /status's snapshot.
const endpointTimeout = 3 * time.Second

// server is the worker's HTTP server (dashboard.Serve): the dashboard at /,
// River UI at /riverui/, and /healthz, /readyz, /metrics (open: any Host,
// no sign-in) and /status.
type server struct {
	addr net.Addr
	stop context.CancelFunc
	done chan error
}

func startServer(ctx context.Context, cfg Config, pool *pgxpool.Pool, client *queue.Client, pc *pacer.Pacer, m *Metrics, log *slog.Logger) (*server, error) {
	// /readyz and /status answer from snapshots: each reads the database at
	// most once per period on one pooled connection, whatever the number of
	// requests, so a storm of probes takes neither the pool nor new
	// connections (the pacer's included).
	ready := &snapshot[struct{}]{every: ReadyMaxAge, timeout: endpointTimeout, clock: cfg.Clock,
		read: func(ctx context.Context) (struct{}, error) { return struct{}{}, pool.Ping(ctx) }}
	report := &snapshot[*status.Report]{every: cmp.Or(cfg.MetricsMaxAge, status.DefaultMaxAge), timeout: endpointTimeout, clock: cfg.Clock,
		read: func(ctx context.Context) (*status.Report, error) { return status.ReadTop(ctx, pool, cfg.TopKeys) }}
	endpoints := []dashboard.Endpoint{
		{Pattern: "GET /healthz", Open: true, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, "ok")
		})},
		{Pattern: "GET /readyz", Open: true, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, err := ready.get(r.Context()); err != nil {
				failed(w, r, err)
				return
			}
			fmt.Fprintln(w, "ready")
		})},
		{Pattern: "GET /metrics", Open: true, Handler: promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})},
		{Pattern: "GET /status", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rep, err := report.get(r.Context())
			if err != nil {
				failed(w, r, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rep)
		})},
	}
	s := &server{done: make(chan error, 1)}
	srvCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = stop
	bound := make(chan net.Addr, 1)
	go func() {
		s.done <- dashboard.Serve(srvCtx, dashboard.ServerConfig{
			Addr:        cfg.HTTPAddr,
			RiverClient: client,
			Ready:       func(addr net.Addr) { bound <- addr },
			Dashboard: dashboard.Config{DB: pool, AdminToken: cfg.AdminToken, Endpoints: endpoints,
				AllowedHosts: cfg.AllowedHosts, PublicRead: cfg.PublicRead, TrustProxyHeaders: cfg.TrustProxyHeaders,
				Degraded: func() bool { return pc.Stats().Down }, Logger: log},
		})
	}()
	select {
	case s.addr = <-bound:
		return s, nil
	case err := <-s.done:
		stop()
		return nil, fmt.Errorf("worker: http server: %w", err)
	}
}

// failed answers 503 with Retry-After: 1 when the database could not be
// reached (the client retries, not us), 500 for another failure, and
// nothing to a client that went away.
func failed(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case r.Context().Err() != nil:
	case dbconn.IsUnavailable(err):
		w.Header().Set("Retry-After", "1")
		http.Error(w, "database unavailable: "+redact.Text(err.Error()), http.StatusServiceUnavailable)
	default:
		http.Error(w, redact.Text(err.Error()), http.StatusInternalServerError)
	}
}

// close shuts the server down (dashboard.Serve: requests in flight get its
// shutdown timeout, then their connections are closed).
func (s *server) close() error {
	s.stop()
	if err := <-s.done; err != nil {
		return fmt.Errorf("worker: http server: %w", err)
	}
	return nil
}
