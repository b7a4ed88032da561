package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetpace/fleetpace/dashboard"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/status"
)

// server serves /healthz, /readyz, /metrics, /status, /riverui/ and the
// dashboard at /.
type server struct {
	http   *http.Server
	addr   net.Addr
	cancel context.CancelFunc
	done   chan struct{}
}

func startServer(ctx context.Context, cfg Config, pool *pgxpool.Pool, client *queue.Client, pc *pacer.Pacer, m *Metrics, log *slog.Logger) (*server, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		// A fresh connection, not a pooled one: after a database restart
		// the pool may still hold dead connections, and readiness is about
		// whether a connection can be made now (one attempt, bounded by the
		// connect timeout).
		conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.WithoutCancel(ctx))
		}
		if err != nil {
			unavailable(w, err)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		rep, err := status.Read(ctx, pool)
		switch {
		case dbconn.IsUnavailable(err):
			unavailable(w, err)
			return
		case err != nil:
			http.Error(w, redact.Text(err.Error()), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	})

	srvCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ui, err := dashboard.RiverUI(srvCtx, client, log)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("worker: %w", err)
	}
	dash, err := dashboard.New(dashboard.Config{DB: pool, AdminToken: cfg.AdminToken, RiverUI: dashboard.DefaultRiverUIPath,
		Degraded: func() bool { return pc.Stats().Down }, Logger: log})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("worker: %w", err)
	}
	dashboard.Mount(mux, dash.Guard(ui))
	mux.Handle("/", dash)

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("worker: http listen %s: %w", cfg.HTTPAddr, err)
	}
	if w := dashboard.ExposureWarning(ln.Addr(), cfg.AdminToken); w != "" {
		log.Warn(w)
	}
	s := &server{
		http:   &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		addr:   ln.Addr(),
		cancel: cancel,
		done:   make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server", "err", err)
		}
	}()
	log.Info("http server listening", "addr", s.addr.String())
	return s, nil
}

// unavailable answers 503 with Retry-After: 1 (the database could not be
// reached in one attempt; the client retries, not us).
func unavailable(w http.ResponseWriter, err error) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, "database unavailable: "+redact.Text(err.Error()), http.StatusServiceUnavailable)
}

// close shuts the server down, waiting up to 5 s for requests in flight.
func (s *server) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.http.Shutdown(ctx)
	s.cancel()
	<-s.done
	if err != nil {
		return fmt.Errorf("worker: http server: %w", err)
	}
	return nil
}
