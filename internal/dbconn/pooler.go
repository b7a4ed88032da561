package dbconn

import (
	"context"
	"errors"
	"fmt"
	"github.com/fleetpace/fleetpace/redact"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pooler says what a database URL leads to: PostgreSQL itself, or a
// connection pooler in transaction mode (PgBouncer's pool_mode =
// transaction), behind which named prepared statements, LISTEN and session
// settings do not survive from one transaction to the next.
type Pooler string

// The values of Pooler; the zero value "" is PoolerNone.
const (
	// PoolerNone: connections go to PostgreSQL (or to a pooler in session
	// mode); nothing is checked or changed.
	PoolerNone Pooler = "none"
	// PoolerAuto: ResolvePooler decides with one connection. A pool made
	// while undecided (the database was unreachable) checks each new
	// connection and refuses one that goes through a pooler (ErrPooler).
	PoolerAuto Pooler = "auto"
	// PoolerTransaction: connections go through a transaction pooler.
	// Statements are sent as unnamed prepared statements described once
	// (pgx's cache_describe mode, unless the URL sets
	// default_query_exec_mode), and the startup parameters fleetpace sets
	// itself (PooledStartupParams), which a pooler refuses or drops, are not
	// sent. LISTEN is the caller's to turn off (pacer.Config.PollOnly).
	PoolerTransaction Pooler = "transaction"
)

// ParsePooler reads a Pooler's name: "none", "auto" or "transaction" ("":
// PoolerNone).
func ParsePooler(s string) (Pooler, error) {
	switch Pooler(s) {
	case "", PoolerNone:
		return PoolerNone, nil
	case PoolerAuto, PoolerTransaction:
		return Pooler(s), nil
	}
	return "", fmt.Errorf("%w: dbconn.Config.Pooler must be one of none, auto, transaction, got %q", ErrInvalidConfig, s)
}

// PooledStartupParams are the startup parameters fleetpace's packages set
// on their connections (the pacer's, the recorder's) that a transaction
// pooler refuses ("unsupported startup parameter") unless told to ignore
// them: they are not sent through one.
var PooledStartupParams = []string{"synchronous_commit", "plan_cache_mode"}

// ErrPooler is wrapped by the error a PoolerAuto pool gives for a new
// connection that turns out to go through a pooler.
var ErrPooler = errors.New("the database URL leads to a connection pooler (PgBouncer?), not to PostgreSQL")

// backendPIDSQL asks the server which backend runs the session (simple
// protocol: no prepared statement, safe behind any pooler).
const backendPIDSQL = "SELECT pg_backend_pid()"

// behindPooler reports whether pgc goes through a pooler. PostgreSQL tells
// a client its backend's process id when it connects (BackendKeyData, for
// cancel requests); a pooler cannot — the backend serving a client changes —
// and sends one of its own making, which pg_backend_pid() then contradicts.
func behindPooler(ctx context.Context, pgc *pgconn.PgConn) (bool, error) {
	results, err := pgc.Exec(ctx, backendPIDSQL).ReadAll()
	if err != nil {
		return false, err
	}
	if len(results) != 1 || len(results[0].Rows) != 1 || len(results[0].Rows[0]) != 1 {
		return false, fmt.Errorf("dbconn: %s: unexpected result", backendPIDSQL)
	}
	pid, err := strconv.ParseUint(string(results[0].Rows[0][0]), 10, 32)
	if err != nil {
		return false, fmt.Errorf("dbconn: %s: %w", backendPIDSQL, err)
	}
	return uint32(pid) != pgc.PID(), nil
}

// ResolvePooler decides a PoolerAuto configuration with one connection
// attempt (bounded by the connect timeout, one per host) and returns cfg
// with Pooler PoolerNone or PoolerTransaction. When the database cannot be
// reached it returns cfg unchanged, still PoolerAuto, with the error. Any
// other Pooler is returned as it is, without connecting.
func ResolvePooler(ctx context.Context, cfg Config) (Config, error) {
	if cfg.Pooler != PoolerAuto {
		return cfg, nil
	}
	probe := cfg
	probe.Pooler = PoolerNone
	pc, err := PoolConfig(probe)
	if err != nil {
		return cfg, err
	}
	conn, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	if err != nil {
		return cfg, fmt.Errorf("dbconn: %w", redact.Error(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	pooled, err := behindPooler(ctx, conn.PgConn())
	if err != nil {
		return cfg, fmt.Errorf("dbconn: %w", redact.Error(err))
	}
	cfg.Pooler = PoolerNone
	if pooled {
		cfg.Pooler = PoolerTransaction
	}
	return cfg, nil
}

// applyPooler sets up pc for cfg.Pooler (PoolConfig).
func applyPooler(pc *pgxpool.Config, cfg Config) {
	switch cfg.Pooler {
	case PoolerTransaction:
		if !strings.Contains(cfg.URL, "default_query_exec_mode") {
			pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
		// Set by the caller after PoolConfig (the pacer, the recorder):
		// removed from each connection's copy of the configuration.
		before := pc.BeforeConnect
		pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
			if before != nil {
				if err := before(ctx, cc); err != nil {
					return err
				}
			}
			for _, name := range PooledStartupParams {
				delete(cc.RuntimeParams, name)
			}
			return nil
		}
	case PoolerAuto:
		// Undecided: check each new connection until one is seen to go to
		// PostgreSQL itself.
		var direct atomic.Bool
		after := pc.ConnConfig.AfterConnect
		pc.ConnConfig.AfterConnect = func(ctx context.Context, pgc *pgconn.PgConn) error {
			if !direct.Load() {
				pooled, err := behindPooler(ctx, pgc)
				switch {
				case err != nil:
					return err
				case pooled:
					err := fmt.Errorf("%w: its connections would lose their prepared statements between transactions; "+
						"set the pooler mode to transaction (fleetpace: --pooler transaction)", ErrPooler)
					if cfg.OnPooler != nil {
						cfg.OnPooler(err)
					}
					return err
				}
				direct.Store(true)
			}
			if after != nil {
				return after(ctx, pgc)
			}
			return nil
		}
	}
}
