// Package dbconn opens fleetpace's connection pools with its one rule for
// connections: one attempt, fail fast.
//
// Every pool gets a bounded connect timeout (2 s by default), MinConns 0 (no
// background re-dial while the database is down) and no retry wrapper. pgx
// would otherwise make hidden extra attempts: sslmode=prefer (libpq's default)
// tries TLS and then plain text, and a host name that resolves to several
// addresses is tried address by address. dbconn keeps one attempt per host
// named in the URL: for sslmode=prefer that is the TLS attempt (set
// sslmode=disable for a server without TLS, as the embedded one is), for
// sslmode=allow the plain one, and only the first address a host name
// resolves to. A URL that names several hosts (host=a,b, or
// postgres://a:5432,b:5432/db — a primary and its standby, with
// target_session_attrs=read-write) keeps one attempt per named host, in
// order, each bounded by its own connect timeout (pgx's rule): a host that
// hangs costs one timeout and the next is still tried, so one attempt over
// n hosts takes at most n × the timeout.
package dbconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/redact"
)

// DefaultConnectTimeout bounds one connection attempt.
const DefaultConnectTimeout = 2 * time.Second

// MaxConnectTimeout is the longest Config.ConnectTimeout: one attempt that
// takes longer has failed.
const MaxConnectTimeout = time.Minute

// Config configures a pool. The zero value (plus URL) means defaults.
type Config struct {
	// URL is the PostgreSQL connection URL or keyword/value string. Required.
	URL string

	// ConnectTimeout bounds one connection attempt to one host, TLS and
	// authentication included (each host of a multi-host URL gets its own).
	// Default: DefaultConnectTimeout (2 s).
	ConnectTimeout time.Duration

	// MaxConns is the pool's size. Default: pgxpool's (max(4, NumCPU)).
	MaxConns int32

	// IdleTimeout closes a connection that has been idle this long, so a
	// process that was busy does not keep its peak's connections. Default:
	// pgxpool's (30 min, checked every minute). A shorter one is checked
	// every 1.5 × IdleTimeout: pgxpool's check puts the idle connections
	// back in reverse order, so checking more often than IdleTimeout would
	// hand every idle connection some use and keep them all open.
	IdleTimeout time.Duration

	// ApplicationName is reported to the server (pg_stat_activity) unless
	// the URL sets application_name. Default: none.
	ApplicationName string

	// AfterConnect runs on every new connection (e.g. SET statements).
	// Default: none.
	AfterConnect func(context.Context, *pgconn.PgConn) error

	// Attempts, if set, is incremented on every connection attempt (for tests
	// and metrics). Default: nil.
	Attempts *atomic.Int64

	// Pooler says whether the URL leads to a transaction pooler (see
	// Pooler). Default ("") PoolerNone: nothing checked, nothing changed.
	Pooler Pooler

	// OnPooler, if set, is called with the error of a PoolerAuto pool's
	// new connection that goes through a pooler (the connection is refused
	// with it too): a long-running process stops on it rather than retry.
	OnPooler func(error)
}

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("invalid config")

// Validate reports an invalid field, wrapping ErrInvalidConfig. The URL is
// checked by PoolConfig, when it is parsed (redact.ErrInvalidDatabaseURL).
func (c Config) Validate() error {
	if c.ConnectTimeout < 0 || c.ConnectTimeout > MaxConnectTimeout {
		return fmt.Errorf("%w: dbconn.Config.ConnectTimeout must be in (0, %s] (0: default), got %s", ErrInvalidConfig, MaxConnectTimeout, c.ConnectTimeout)
	}
	if c.MaxConns < 0 {
		return fmt.Errorf("%w: dbconn.Config.MaxConns must be ≥ 0, got %d", ErrInvalidConfig, c.MaxConns)
	}
	if c.IdleTimeout < 0 {
		return fmt.Errorf("%w: dbconn.Config.IdleTimeout must be ≥ 0, got %s", ErrInvalidConfig, c.IdleTimeout)
	}
	if _, err := ParsePooler(string(c.Pooler)); err != nil {
		return err
	}
	return nil
}

// PoolConfig builds a pgxpool configuration that follows the fail-fast
// rule. A URL that cannot be read one way only is refused
// (redact.CheckDatabaseURL: the error wraps redact.ErrInvalidDatabaseURL
// and shows no password).
func PoolConfig(cfg Config) (*pgxpool.Config, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.URL == "" {
		return nil, fmt.Errorf("dbconn: %w: the URL is empty", redact.ErrInvalidDatabaseURL)
	}
	if err := redact.CheckDatabaseURL(cfg.URL); err != nil {
		return nil, fmt.Errorf("dbconn: %w", err)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil { // CheckDatabaseURL parsed it: not expected
		return nil, fmt.Errorf("dbconn: %w", redact.Error(err))
	}
	timeout := cfg.ConnectTimeout
	if timeout == 0 {
		timeout = DefaultConnectTimeout
	}
	if !strings.Contains(cfg.URL, "connect_timeout") || cfg.ConnectTimeout != 0 {
		pc.ConnConfig.ConnectTimeout = timeout
	}
	pc.MinConns = 0
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	if cfg.IdleTimeout > 0 {
		pc.MaxConnIdleTime = cfg.IdleTimeout
		pc.HealthCheckPeriod = min(pc.HealthCheckPeriod, cfg.IdleTimeout*3/2)
	}
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok && cfg.ApplicationName != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = cfg.ApplicationName
	}
	pc.ConnConfig.Fallbacks = oneAttemptPerHost(pc.ConnConfig.Config)
	baseLookup := pc.ConnConfig.LookupFunc
	pc.ConnConfig.LookupFunc = func(ctx context.Context, host string) ([]string, error) {
		addrs, err := baseLookup(ctx, host)
		if len(addrs) > 1 {
			addrs = addrs[:1]
		}
		return addrs, err
	}
	if cfg.Attempts != nil {
		dial := pc.ConnConfig.DialFunc
		pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			cfg.Attempts.Add(1)
			return dial(ctx, network, addr)
		}
	}
	if cfg.AfterConnect != nil {
		pc.ConnConfig.AfterConnect = cfg.AfterConnect
	}
	applyPooler(pc, cfg)
	return pc, nil
}

// oneAttemptPerHost drops pgx's second try at the same host (TLS then plain,
// or plain then TLS): the primary config is the first attempt, and of the
// fallbacks only those naming another host or port are kept.
func oneAttemptPerHost(c pgconn.Config) []*pgconn.FallbackConfig {
	seen := map[string]bool{net.JoinHostPort(c.Host, fmt.Sprint(c.Port)): true}
	var out []*pgconn.FallbackConfig
	for _, fb := range c.Fallbacks {
		key := net.JoinHostPort(fb.Host, fmt.Sprint(fb.Port))
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, fb)
	}
	return out
}

// NewPool opens a pool (no connection is made until first use).
func NewPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := PoolConfig(cfg)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("dbconn: %w", redact.Error(err))
	}
	return pool, nil
}

// IsUnavailable reports whether err means the database could not be reached
// or cannot serve connections now — as opposed to a statement that failed on
// a working connection. It decides by error types and SQLSTATEs only, never
// by message text:
//
//   - pgconn.ConnectError: a connection attempt failed (refused, timed out,
//     TLS or authentication failed, the server refused it).
//   - a PostgreSQL error of class 08 (connection exception), 53300
//     (too_many_connections), 57P01, 57P02, 57P03 (admin_shutdown,
//     crash_shutdown, cannot_connect_now); any other SQLSTATE is a failed
//     statement.
//   - a network error (net.Error: resets, broken pipes, timeouts), an
//     unexpected EOF on the connection, a connection pgx has closed
//     (pgconn.ErrConnClosed), an error pgconn marks as occurring before
//     anything was sent (pgconn.SafeToRetry), or a deadline that ran out.
//
// It is the one rule for "the database is unreachable" of every package.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return unavailableState(pgErr.Code)
	}
	var netErr net.Error
	return errors.As(err, &netErr) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed) ||
		pgconn.SafeToRetry(err) || errors.Is(err, context.DeadlineExceeded)
}

// unavailableState reports whether a SQLSTATE means the server cannot serve
// connections (rather than that a statement failed).
func unavailableState(code string) bool {
	switch code {
	case "53300", // too_many_connections
		"57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return true
	}
	return strings.HasPrefix(code, "08") // connection_exception and its subclasses
}

// IsDeadlock reports whether err is PostgreSQL's deadlock_detected
// (SQLSTATE 40P01): the server aborted the transaction to break a lock
// cycle, and running it again (at once) is the cure.
func IsDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}
