// Package pacer is fleetpace's shared per-platform pacer: one global rate
// ceiling per platform for the whole fleet (every process, every goroutine),
// a shared backoff multiplier with a fleet-wide clean streak, a fleet-wide
// Retry-After hold, and a degraded mode that keeps pacing when the database
// cannot be reached.
//
// A reservation is one SQL statement and one round trip (INSERT … ON CONFLICT
// DO UPDATE … RETURNING on the platform's fleetpace_pace row): the row lock
// taken by ON CONFLICT makes the read-modify-write atomic across processes,
// with no advisory lock, no explicit transaction and no SELECT … FOR UPDATE.
// Time is the database's clock_timestamp(). The caller then sleeps locally,
// holding no lock and no connection.
//
// The configured rate is a ceiling: the multiplier only ever slows it down,
// and in degraded mode each process paces at rate / (fleet size + 1), so the
// fleet stays under the ceiling even while nobody coordinates.
package pacer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrUnknownPlatform is returned when a platform has no fleetpace_platform row.
var ErrUnknownPlatform = errors.New("pacer: unknown platform")

// errNoCancel refuses the extra connection of a cancel request.
var errNoCancel = errors.New("pacer: no cancel requests")

// errLatched refuses a connection attempt while a failure is latched.
var errLatched = errors.New("pacer: database unreachable (latched)")

// Config configures a Pacer. The zero value of every field but DatabaseURL
// (or PoolConfig) means its default.
type Config struct {
	// DatabaseURL is the PostgreSQL connection string. Required unless
	// PoolConfig is set.
	DatabaseURL string

	// PoolConfig, if set, is used (copied) instead of parsing DatabaseURL.
	// Its BeforeConnect and ConnConfig.DialFunc hooks are kept; MaxConns,
	// MinConns and the connect timeout are overridden as described below.
	PoolConfig *pgxpool.Config

	// MaxConns is the size of the pacer's own pool. Default 4.
	MaxConns int32

	// ConnectTimeout bounds one connection attempt. Default 2 s.
	ConnectTimeout time.Duration

	// StatementTimeout bounds one reservation or report round trip
	// (including acquiring a connection); when it expires the database counts
	// as unreachable. Default 2 s.
	StatementTimeout time.Duration

	// Latch is how long a failure to reach the database is remembered: while
	// latched, no connection is attempted and reservations are paced locally.
	// Default 5 s.
	Latch time.Duration

	// MinFleetSize is the smallest fleet size degraded pacing assumes
	// (rate / (max(fleet size, MinFleetSize) + 1)). Default 1.
	MinFleetSize int

	// Logger receives state changes (outage, resume). Default: discard.
	Logger *slog.Logger

	// Now is the local clock, used only where local time matters: degraded
	// pacing and the failure latch. Default time.Now.
	Now func() time.Time
}

func (c *Config) validate() error {
	switch {
	case c.DatabaseURL == "" && c.PoolConfig == nil:
		return errors.New("pacer: Config.DatabaseURL is required")
	case c.MaxConns < 0:
		return fmt.Errorf("pacer: Config.MaxConns must not be negative (got %d)", c.MaxConns)
	case c.ConnectTimeout < 0:
		return fmt.Errorf("pacer: Config.ConnectTimeout must not be negative (got %s)", c.ConnectTimeout)
	case c.StatementTimeout < 0:
		return fmt.Errorf("pacer: Config.StatementTimeout must not be negative (got %s)", c.StatementTimeout)
	case c.Latch < 0:
		return fmt.Errorf("pacer: Config.Latch must not be negative (got %s)", c.Latch)
	case c.MinFleetSize < 0:
		return fmt.Errorf("pacer: Config.MinFleetSize must not be negative (got %d)", c.MinFleetSize)
	}
	return nil
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.MaxConns == 0 {
		out.MaxConns = 4
	}
	if out.ConnectTimeout == 0 {
		out.ConnectTimeout = 2 * time.Second
	}
	if out.StatementTimeout == 0 {
		out.StatementTimeout = 2 * time.Second
	}
	if out.Latch == 0 {
		out.Latch = 5 * time.Second
	}
	if out.MinFleetSize == 0 {
		out.MinFleetSize = 1
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	return out
}

// Kind classifies a response for the pacer.
type Kind int

const (
	// Neutral responses (errors that say nothing about rate, e.g. a 404 or a
	// network failure) neither extend nor break the clean streak. Reporting
	// one costs no round trip.
	Neutral Kind = iota
	// Clean responses (2xx, 304) count toward the fleet-wide clean streak.
	Clean
	// Pressure responses (429, 503) double the shared multiplier, reset the
	// streak, and with a Retry-After hold every process.
	Pressure
)

func (k Kind) String() string {
	switch k {
	case Clean:
		return "clean"
	case Pressure:
		return "pressure"
	default:
		return "neutral"
	}
}

// Outcome is what a fetch told the pacer. Parsing Retry-After headers is the
// fetcher's job; the pacer takes either form already parsed.
type Outcome struct {
	Kind Kind
	// RetryAfter (Pressure only) holds the fleet for this long from now.
	RetryAfter time.Duration
	// RetryAt (Pressure only) holds the fleet until this instant (the
	// HTTP-date form), converted to a duration with the local clock. The later
	// of RetryAfter and RetryAt wins.
	RetryAt time.Time
}

// Reservation is the answer to Reserve.
type Reservation struct {
	Platform string
	// Granted: the caller owns a slot and must sleep Wait before using it.
	// Not granted: nothing was reserved; come back after Wait.
	Granted bool
	Wait    time.Duration
	// Degraded: paced locally because the database could not be reached.
	Degraded bool
	// ReservedAt is the database time of the reservation (zero when
	// degraded); Report uses it to apply a doubling once per window.
	ReservedAt time.Time
	// Slot is the database time of the reserved slot (or of the earliest slot
	// when denied); zero when degraded.
	Slot time.Time
	// Multiplier is the shared backoff multiplier in force.
	Multiplier float64
}

// ReportResult is the pacer state after a Report.
type ReportResult struct {
	Multiplier    float64
	MaxMultiplier float64
	// Doubled: this report doubled the multiplier.
	Doubled bool
	// AtMax: rate pressure while the multiplier already stood at its maximum
	// (the worker promotes this to rate_limited).
	AtMax bool
	// Stale: rate pressure for a request reserved before the latest doubling,
	// which therefore did not double it again.
	Stale bool
	// Halved: this report completed a clean streak and halved the multiplier.
	Halved      bool
	CleanStreak int
	// Hold is how long the fleet-wide Retry-After hold still lasts.
	Hold time.Duration
	// Dropped: the database was unreachable and the report was not stored
	// (pressure is still applied to this process's degraded pacing).
	Dropped bool
}

// Stats are per-process counters, for metrics.
type Stats struct {
	Reservations    uint64 // Reserve calls
	Granted         uint64 // granted reservations (shared and degraded)
	Denied          uint64 // reservations not granted (wait > max wait, or no rate known)
	Degraded        uint64 // reservations decided locally because the database was unreachable
	Reports         uint64 // Report calls
	ReportsDropped  uint64 // reports not stored because the database was unreachable
	ConnectAttempts uint64 // connection attempts made by the pacer's pool
	Failures        uint64 // round trips that found the database unreachable
	Down            bool   // shared pacing currently unavailable
	FleetSize       int    // fleet size last set
}

// Pacer paces requests to platforms for the whole fleet. It is safe for
// concurrent use.
type Pacer struct {
	cfg  Config
	pool *pgxpool.Pool
	log  *slog.Logger

	fleet atomic.Int64

	mu           sync.Mutex
	down         bool      // the last probe or round trip failed
	latchedUntil time.Time // no connection attempt before this
	probing      bool      // one caller is probing the database
	recoverUntil time.Time // after a resume, also honour local pacing until then
	local        map[string]*localState

	reservations, granted, denied, degraded atomic.Uint64
	reports, dropped, attempts, failures    atomic.Uint64
}

// localState is the cached platform configuration and the local cursor used
// for degraded pacing.
type localState struct {
	rate    float64
	maxMult float64
	mult    float64
	hold    time.Time // local-clock estimate of the shared hold
	tat     time.Time // local GCRA cursor (burst 1) for degraded pacing
}

// New creates a Pacer with its own small pool. It does not connect: the
// first reservation does, so New succeeds while the database is down.
func New(ctx context.Context, cfg Config) (*Pacer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var pc *pgxpool.Config
	if cfg.PoolConfig != nil {
		pc = cfg.PoolConfig.Copy()
	} else {
		var err error
		if pc, err = pgxpool.ParseConfig(cfg.DatabaseURL); err != nil {
			return nil, fmt.Errorf("pacer: Config.DatabaseURL: %w", err)
		}
	}
	p := &Pacer{cfg: cfg, log: cfg.Logger, local: map[string]*localState{}}
	p.fleet.Store(1)

	pc.MaxConns = cfg.MaxConns
	pc.MinConns = 0
	pc.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	// Pacer state is soft state: a lost commit costs at most a few slots.
	// Set in the startup packet, so it costs no round trip.
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = "fleetpace-pacer"
	}
	userBefore := pc.BeforeConnect
	pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if p.latched() {
			return errLatched
		}
		p.attempts.Add(1)
		if userBefore != nil {
			if err := userBefore(ctx, cc); err != nil {
				return err
			}
		}
		// One connection attempt dials; nothing else does. pgconn sends a
		// CancelRequest over a new connection when it abandons a broken one,
		// which during an outage is one more dial per broken connection. The
		// pacer's statements take a millisecond, so there is nothing worth
		// cancelling: once this connection is established it never dials again.
		var established atomic.Bool
		dial, after := cc.DialFunc, cc.AfterConnect
		cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if established.Load() {
				return nil, errNoCancel
			}
			return dial(ctx, network, addr)
		}
		cc.AfterConnect = func(ctx context.Context, pgc *pgconn.PgConn) error {
			established.Store(true)
			if after != nil {
				return after(ctx, pgc)
			}
			return nil
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pacer: pool: %w", err)
	}
	p.pool = pool
	return p, nil
}

// Close closes the pacer's pool.
func (p *Pacer) Close() { p.pool.Close() }

// SetFleetSize records the live worker count (the heartbeat calls it); in
// degraded mode each process paces at rate / (fleet size + 1).
func (p *Pacer) SetFleetSize(n int) { p.fleet.Store(int64(n)) }

func (p *Pacer) divisor() float64 {
	n := int(p.fleet.Load())
	if n < p.cfg.MinFleetSize {
		n = p.cfg.MinFleetSize
	}
	return float64(n + 1)
}

// Stats returns the per-process counters.
func (p *Pacer) Stats() Stats {
	p.mu.Lock()
	down := p.down
	p.mu.Unlock()
	return Stats{
		Reservations:    p.reservations.Load(),
		Granted:         p.granted.Load(),
		Denied:          p.denied.Load(),
		Degraded:        p.degraded.Load(),
		Reports:         p.reports.Load(),
		ReportsDropped:  p.dropped.Load(),
		ConnectAttempts: p.attempts.Load(),
		Failures:        p.failures.Load(),
		Down:            down,
		FleetSize:       int(p.fleet.Load()),
	}
}

// Reserve asks for a slot on platform, waiting at most maxWait for it. A
// granted reservation tells the caller how long to sleep before its request;
// a denied one reserved nothing and tells it when to come back. When the
// database is unreachable Reserve still answers (degraded, paced locally) and
// returns no error; errors are ErrUnknownPlatform, the caller's context, or a
// database error that is not an outage (e.g. a missing schema).
func (p *Pacer) Reserve(ctx context.Context, platform string, maxWait time.Duration) (Reservation, error) {
	p.reservations.Add(1)
	if maxWait < 0 {
		maxWait = 0
	}
	shared, probe := p.admit()
	if !shared {
		return p.reserveLocal(platform, maxWait), nil
	}

	var minWait time.Duration
	if probe || p.recovering() {
		// After an outage other processes may still pace locally for up to
		// one latch period; honour this process's local share too, so the
		// sum stays under the ceiling. The shared row books the later slot.
		if w, ok := p.localWait(platform); ok {
			if w > maxWait {
				p.endProbe(probe)
				p.denied.Add(1)
				return Reservation{Platform: platform, Wait: w}, nil
			}
			minWait = w
		}
	}

	res, err := p.reserveShared(ctx, platform, maxWait, minWait)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			p.endProbe(probe)
			return Reservation{}, fmt.Errorf("pacer: reserve %s: %w", platform, ctx.Err())
		case unreachable(err):
			p.fail(probe, err)
			return p.reserveLocal(platform, maxWait), nil
		default:
			p.succeed(probe)
			if errors.Is(err, ErrUnknownPlatform) {
				return Reservation{}, fmt.Errorf("%w: %q", ErrUnknownPlatform, platform)
			}
			return Reservation{}, fmt.Errorf("pacer: reserve %s: %w", platform, err)
		}
	}
	p.succeed(probe)
	if res.Granted {
		p.granted.Add(1)
	} else {
		p.denied.Add(1)
	}
	return res, nil
}

// Wait reserves a slot on platform and sleeps until it. Reservations denied
// in degraded mode (no rate known yet) are retried after their wait.
func (p *Pacer) Wait(ctx context.Context, platform string) (Reservation, error) {
	for {
		r, err := p.Reserve(ctx, platform, 24*time.Hour)
		if err != nil {
			return r, err
		}
		if err := sleep(ctx, r.Wait); err != nil {
			return r, fmt.Errorf("pacer: wait %s: %w", platform, err)
		}
		if r.Granted {
			return r, nil
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// reserveShared runs reserveSQL and updates the degraded-mode cache.
func (p *Pacer) reserveShared(ctx context.Context, platform string, maxWait, minWait time.Duration) (Reservation, error) {
	qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
	defer cancel()
	var (
		at, slot, mult, hold, rate, maxMult float64
		effect                              int16
	)
	for attempt := 0; ; attempt++ {
		err := p.pool.QueryRow(qctx, reserveSQL, platform, maxWait.Seconds(), minWait.Seconds()).
			Scan(&at, &effect, &slot, &mult, &hold, &rate, &maxMult)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation
			return Reservation{}, ErrUnknownPlatform
		}
		if err != nil {
			return Reservation{}, err
		}
		if rate > 0 {
			break
		}
		// The pace row was missing and has just been created without the
		// platform's configuration: copy it and reserve again.
		if attempt > 0 {
			return Reservation{}, fmt.Errorf("pacer: pace row of %q has no rate", platform)
		}
		if _, err := p.pool.Exec(qctx, syncRowSQL, platform); err != nil {
			return Reservation{}, err
		}
	}
	localNow := p.cfg.Now()
	wait := max(secondsToDuration(slot-at), 0)
	res := Reservation{
		Platform:   platform,
		Granted:    effect == effectGranted,
		Wait:       wait,
		ReservedAt: epochToTime(at),
		Slot:       epochToTime(slot),
		Multiplier: mult,
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil {
		st = &localState{}
		p.local[platform] = st
	}
	st.rate, st.maxMult, st.mult = rate, maxMult, mult
	st.hold = localNow.Add(secondsToDuration(hold - at))
	if res.Granted {
		// A degraded period starting now continues from this slot.
		st.tat = maxTime(st.tat, localNow.Add(res.Wait).Add(st.degradedInterval(p.divisor())))
	}
	return res, nil
}

// degradedInterval is the local spacing while the database is unreachable.
func (st *localState) degradedInterval(div float64) time.Duration {
	return secondsToDuration(math.Max(st.mult, 1) * div / st.rate)
}

// reserveLocal paces one reservation locally at rate / (fleet size + 1). A
// platform whose rate was never seen is denied with a wait of one latch
// period: without a known rate the only safe answer is "not now".
func (p *Pacer) reserveLocal(platform string, maxWait time.Duration) Reservation {
	p.degraded.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	res := Reservation{Platform: platform, Degraded: true}
	st := p.local[platform]
	if st == nil {
		p.denied.Add(1)
		res.Wait = p.cfg.Latch
		return res
	}
	now := p.cfg.Now()
	res.Multiplier = st.mult
	slot := maxTime(now, st.tat, st.hold)
	res.Wait = slot.Sub(now)
	if res.Wait > maxWait {
		p.denied.Add(1)
		return res
	}
	st.tat = slot.Add(st.degradedInterval(p.divisor()))
	res.Granted = true
	p.granted.Add(1)
	return res
}

// localWait is how long this process's local share would make a
// reservation wait now (false if the platform is not cached).
func (p *Pacer) localWait(platform string) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil {
		return 0, false
	}
	now := p.cfg.Now()
	return maxTime(now, st.tat, st.hold).Sub(now), true
}

// Report tells the pacer how a request reserved by res ended. Rate pressure
// doubles the shared multiplier once per window and resets the fleet-wide
// clean streak; clean responses extend it and halve the multiplier every
// decay_after of them. When the database is unreachable the report is
// dropped (counted) without blocking; pressure still slows this process's
// degraded pacing.
func (p *Pacer) Report(ctx context.Context, platform string, res Reservation, out Outcome) (ReportResult, error) {
	p.reports.Add(1)
	if out.Kind != Clean && out.Kind != Pressure {
		return p.cachedResult(platform), nil
	}
	var retry *float64
	if out.Kind == Pressure {
		d := out.RetryAfter
		if !out.RetryAt.IsZero() {
			d = max(d, out.RetryAt.Sub(p.cfg.Now()))
		}
		if d > 0 {
			s := d.Seconds()
			retry = &s
		}
	}

	shared, probe := p.admit()
	if !shared {
		return p.dropReport(platform, out, retry), nil
	}
	var reservedAt *float64
	if !res.ReservedAt.IsZero() {
		s := timeToEpoch(res.ReservedAt)
		reservedAt = &s
	}
	r, err := p.reportShared(ctx, platform, out.Kind == Pressure, reservedAt, retry)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			p.endProbe(probe)
			return ReportResult{}, fmt.Errorf("pacer: report %s: %w", platform, ctx.Err())
		case unreachable(err):
			p.fail(probe, err)
			return p.dropReport(platform, out, retry), nil
		default:
			p.succeed(probe)
			if errors.Is(err, ErrUnknownPlatform) {
				return ReportResult{}, fmt.Errorf("%w: %q", ErrUnknownPlatform, platform)
			}
			return ReportResult{}, fmt.Errorf("pacer: report %s: %w", platform, err)
		}
	}
	p.succeed(probe)
	return r, nil
}

func (p *Pacer) reportShared(ctx context.Context, platform string, pressure bool, reservedAt, retry *float64) (ReportResult, error) {
	qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
	defer cancel()
	var (
		r      ReportResult
		effect int16
		streak int32
		hold   float64
	)
	for attempt := 0; ; attempt++ {
		err := p.pool.QueryRow(qctx, reportSQL, platform, pressure, reservedAt, retry).
			Scan(&r.Multiplier, &r.MaxMultiplier, &streak, &effect, &hold)
		if errors.Is(err, pgx.ErrNoRows) && attempt == 0 {
			// No pace row yet: create it, then apply the report to it.
			if _, err := p.pool.Exec(qctx, ensureRowSQL, platform); err != nil {
				return r, err
			}
			continue
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return r, ErrUnknownPlatform
		}
		if err != nil {
			return r, err
		}
		break
	}
	r.CleanStreak = int(streak)
	r.Hold = secondsToDuration(hold)
	r.Doubled = effect == effectDoubled
	r.AtMax = effect == effectAtMax
	r.Stale = effect == effectStale
	r.Halved = effect == effectHalved

	localNow := p.cfg.Now()
	p.mu.Lock()
	if st := p.local[platform]; st != nil {
		st.mult, st.maxMult = r.Multiplier, r.MaxMultiplier
		st.hold = maxTime(st.hold, localNow.Add(r.Hold))
	}
	p.mu.Unlock()
	return r, nil
}

// dropReport counts a report the database did not get and applies pressure
// to the local (degraded) pacing only.
func (p *Pacer) dropReport(platform string, out Outcome, retry *float64) ReportResult {
	p.dropped.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	r := ReportResult{Dropped: true}
	st := p.local[platform]
	if st == nil {
		return r
	}
	if out.Kind == Pressure {
		r.AtMax = st.mult >= st.maxMult
		st.mult = math.Min(st.mult*2, st.maxMult)
		if retry != nil {
			st.hold = maxTime(st.hold, p.cfg.Now().Add(secondsToDuration(*retry)))
		}
	}
	r.Multiplier, r.MaxMultiplier = st.mult, st.maxMult
	return r
}

func (p *Pacer) cachedResult(platform string) ReportResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.local[platform]; st != nil {
		return ReportResult{Multiplier: st.mult, MaxMultiplier: st.maxMult}
	}
	return ReportResult{}
}

// admit decides whether a call may use the database. While a failure is
// latched, or while another caller probes after the latch expired, it may
// not; otherwise, if the database was down, this caller becomes the one probe.
func (p *Pacer) admit() (shared, probe bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.down {
		return true, false
	}
	if p.probing || p.cfg.Now().Before(p.latchedUntil) {
		return false, false
	}
	p.probing = true
	return true, true
}

func (p *Pacer) latched() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.Now().Before(p.latchedUntil)
}

func (p *Pacer) recovering() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.Now().Before(p.recoverUntil)
}

// fail latches an outage and drops the pool's (probably dead) connections.
func (p *Pacer) fail(probe bool, err error) {
	p.failures.Add(1)
	p.mu.Lock()
	wasDown := p.down
	p.down = true
	p.latchedUntil = p.cfg.Now().Add(p.cfg.Latch)
	if probe {
		p.probing = false
	}
	p.mu.Unlock()
	if !wasDown {
		p.log.Warn("pacer: database unreachable, pacing locally", "error", err,
			"latch", p.cfg.Latch, "divisor", p.divisor())
	}
	p.pool.Reset()
}

// succeed ends a probe that reached the database: shared pacing resumes, and
// for one latch period local pacing is honoured as well (other processes may
// still be pacing locally until their latch expires).
func (p *Pacer) succeed(probe bool) {
	if !probe {
		return
	}
	p.mu.Lock()
	p.probing = false
	resumed := p.down
	p.down = false
	p.recoverUntil = p.cfg.Now().Add(p.cfg.Latch)
	p.mu.Unlock()
	if resumed {
		p.log.Info("pacer: database reachable again, shared pacing resumed")
	}
}

// endProbe ends a probe that was interrupted by the caller's context.
func (p *Pacer) endProbe(probe bool) {
	if !probe {
		return
	}
	p.mu.Lock()
	p.probing = false
	p.mu.Unlock()
}

// unreachable reports whether err means the database could not be reached
// (as opposed to a server-side error from a reachable database).
func unreachable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case len(pgErr.Code) >= 2 && pgErr.Code[:2] == "08": // connection exception
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03": // shutdown, cannot connect now
			return true
		case len(pgErr.Code) >= 2 && pgErr.Code[:2] == "53": // insufficient resources (too many connections)
			return true
		}
		return false
	}
	return !errors.Is(err, ErrUnknownPlatform)
}

func secondsToDuration(s float64) time.Duration {
	return time.Duration(math.Round(s * float64(time.Second)))
}

func epochToTime(s float64) time.Time {
	sec, frac := math.Modf(s)
	return time.Unix(int64(sec), int64(math.Round(frac*1e9)))
}

func timeToEpoch(t time.Time) float64 {
	return float64(t.Unix()) + float64(t.Nanosecond())/1e9
}

func maxTime(t time.Time, ts ...time.Time) time.Time {
	for _, u := range ts {
		if u.After(t) {
			t = u
		}
	}
	return t
}
