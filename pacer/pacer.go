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
// holding no lock and no connection. When a platform's interval is shorter
// than a round trip, the statement takes a block of consecutive slots and
// later calls of the process take the rest without a round trip; clean
// reports are sent in batches. Neither changes which slots are granted.
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
	"slices"
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

	// StatementTimeout bounds one reservation or report round trip once it
	// is sent (a new connection is bounded by ConnectTimeout); when it
	// expires the database counts as unreachable. Default 2 s.
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

	// MaxBlock is the most slots one reservation statement takes at once.
	// When a platform's interval is shorter than a round trip (a very high or
	// unlimited rate), a statement reserves ⌈round trip / interval⌉ slots (at
	// most MaxBlock) and hands the rest out to later callers of this process
	// without a round trip. The slots are exactly those single reservations
	// would have got, so the ceiling holds as before. Default 32; 1 turns
	// blocks off.
	MaxBlock int

	// MaxLate is how long after its time a slot kept from a block may still
	// be handed out; older ones are discarded unused (sending late would crowd
	// the slots that follow into one second). Default 25 ms.
	MaxLate time.Duration

	// CleanBatch is how long clean reports of a platform are gathered before
	// one statement adds them all to the fleet-wide streak. Rate pressure is
	// always sent at once. Default 100 ms; negative sends every clean report
	// at once. Close and Flush send what is pending.
	CleanBatch time.Duration

	// Now is the local clock, used only where local time matters: degraded
	// pacing, slots kept from blocks and the failure latch. Default time.Now.
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
	case c.MaxBlock < 0:
		return fmt.Errorf("pacer: Config.MaxBlock must not be negative (got %d)", c.MaxBlock)
	case c.MaxLate < 0:
		return fmt.Errorf("pacer: Config.MaxLate must not be negative (got %s)", c.MaxLate)
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
	if out.MaxBlock == 0 {
		out.MaxBlock = DefaultMaxBlock
	}
	if out.MaxLate == 0 {
		out.MaxLate = 25 * time.Millisecond
	}
	if out.CleanBatch == 0 {
		out.CleanBatch = 100 * time.Millisecond
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	return out
}

// DefaultMaxBlock is Config.MaxBlock's default.
const DefaultMaxBlock = 32

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
	// FromBlock: the slot was reserved earlier, in a block taken by another
	// call of this process, and cost no round trip.
	FromBlock bool
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
	// Deferred: a clean report gathered for the next batch
	// (Config.CleanBatch); the other fields are this process's last view.
	Deferred bool
}

// Stats are per-process counters, for metrics.
type Stats struct {
	Reservations    uint64 // Reserve calls
	Granted         uint64 // granted reservations (shared and degraded)
	Denied          uint64 // reservations not granted (wait > max wait, or no rate known)
	Degraded        uint64 // reservations decided locally because the database was unreachable
	FromBlock       uint64 // granted reservations served from a block, without a round trip
	BlockDiscarded  uint64 // slots of blocks that went unused (too late, or dropped on pressure)
	Reports         uint64 // Report calls
	ReportsDropped  uint64 // reports not stored because the database was unreachable
	ReportsDeferred uint64 // clean reports sent later, in a batch
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
	latchedUntil time.Time // no connection attempt before this
	probing      bool      // one caller is probing the database
	local        map[string]*localState
	pending      map[string]*pendingClean // clean reports not sent yet
	closed       bool

	rtt atomic.Int64 // moving average of a reservation's round trip, ns

	// Read without the lock on the common path (no outage, no blocks kept);
	// down and recoverNanos are written with mu held.
	down         atomic.Bool  // the last probe or round trip failed
	recoverNanos atomic.Int64 // after a resume, also honour local pacing until then (Unix ns; 0: never)
	blockSlots   atomic.Int64 // slots kept in all blocks

	reservations, granted, denied, degraded atomic.Uint64
	fromBlock, blockDiscarded               atomic.Uint64
	reports, dropped, deferred              atomic.Uint64
	attempts, failures                      atomic.Uint64
}

// pendingClean is a platform's batch of clean reports waiting to be sent.
type pendingClean struct {
	n     int
	timer *time.Timer
}

// blockSlot is a slot of a block kept for a later call.
type blockSlot struct {
	at         time.Time // local-clock time of the slot
	slot       time.Time // database time of the slot
	reservedAt time.Time // database time of the block's reservation
	mult       float64
}

// localState is the cached platform configuration and the local cursor used
// for degraded pacing.
type localState struct {
	rate    float64
	maxMult float64
	mult    float64
	hold    time.Time   // local-clock estimate of the shared hold
	tat     time.Time   // local GCRA cursor (burst 1) for degraded pacing
	block   []blockSlot // slots reserved in a block, not handed out yet, in time order
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
	p := &Pacer{cfg: cfg, log: cfg.Logger, local: map[string]*localState{}, pending: map[string]*pendingClean{}}
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
	// The pacer's statements have one plan whatever their parameters; planning
	// them again on every execution would be most of their server time.
	pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
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

// Close sends the clean reports still pending (bounded by
// Config.StatementTimeout) and closes the pacer's pool.
func (p *Pacer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StatementTimeout)
	defer cancel()
	p.Flush(ctx)
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.pool.Close()
}

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
	down := p.down.Load()
	return Stats{
		Reservations:    p.reservations.Load(),
		Granted:         p.granted.Load(),
		Denied:          p.denied.Load(),
		Degraded:        p.degraded.Load(),
		FromBlock:       p.fromBlock.Load(),
		BlockDiscarded:  p.blockDiscarded.Load(),
		Reports:         p.reports.Load(),
		ReportsDropped:  p.dropped.Load(),
		ReportsDeferred: p.deferred.Load(),
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
	if res, ok := p.takeFromBlock(platform, maxWait); ok {
		p.granted.Add(1)
		p.fromBlock.Add(1)
		return res, nil
	}
	shared, probe, recovering := p.admit()
	if !shared {
		return p.reserveLocal(platform, maxWait), nil
	}

	var minWait time.Duration
	n := 1
	if probe || recovering {
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
	} else {
		n = p.blockSize(platform)
	}

	res, err := p.reserveShared(ctx, platform, maxWait, minWait, n)
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

// reserveShared runs reserveSQL for up to n slots, keeps the slots after the
// first for later calls, and updates the degraded-mode cache.
func (p *Pacer) reserveShared(ctx context.Context, platform string, maxWait, minWait time.Duration, n int) (Reservation, error) {
	var (
		at, first, mult, cursor, rate, maxMult float64
		count, burst                           int32
	)
	for attempt := 0; ; attempt++ {
		t0 := time.Now()
		err := p.queryRow(ctx, reserveSQL, []any{platform, maxWait.Seconds(), minWait.Seconds(), n},
			&at, &count, &first, &mult, &cursor, &rate, &burst, &maxMult)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation
			return Reservation{}, ErrUnknownPlatform
		}
		if err != nil {
			return Reservation{}, err
		}
		p.observeRTT(time.Since(t0))
		if rate > 0 {
			break
		}
		// The pace row was missing and has just been created without the
		// platform's configuration: copy it and reserve again.
		if attempt > 0 {
			return Reservation{}, fmt.Errorf("pacer: pace row of %q has no rate", platform)
		}
		qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
		_, err = p.pool.Exec(qctx, syncRowSQL, platform)
		cancel()
		if err != nil {
			return Reservation{}, err
		}
	}
	localNow := p.cfg.Now()
	// Slot 0 is first (when nothing was granted, the earliest one there is);
	// slot k of a block is max(first, cursor - tau - (count - k)·interval).
	mult = math.Max(mult, 1)
	interval := mult / rate
	base := cursor - float64(burst-1)/rate - float64(count)*interval
	res := Reservation{
		Platform:   platform,
		Granted:    count > 0,
		Wait:       max(secondsToDuration(first-at), 0),
		ReservedAt: epochToTime(at),
		Slot:       epochToTime(first),
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
	if !res.Granted {
		// The earliest slot is as late as any hold (or later): a degraded
		// period starting now must not go earlier.
		st.hold = maxTime(st.hold, localNow.Add(res.Wait))
	}
	last := res.Wait
	for k := 1; k < int(count); k++ {
		slot := math.Max(first, base+float64(k)*interval)
		wait := secondsToDuration(slot - at)
		st.block = append(st.block, blockSlot{at: localNow.Add(wait), slot: epochToTime(slot),
			reservedAt: res.ReservedAt, mult: mult})
		p.blockSlots.Add(1)
		last = wait
	}
	if count > 1 {
		// Blocks taken concurrently by two calls may interleave.
		slices.SortFunc(st.block, func(a, b blockSlot) int { return a.at.Compare(b.at) })
	}
	if res.Granted {
		// A degraded period starting now continues from this block.
		st.tat = maxTime(st.tat, localNow.Add(last).Add(st.degradedInterval(p.divisor())))
	}
	return res, nil
}

// queryRow runs one statement of the hot path on a connection of the
// pacer's pool, bounded by Config.StatementTimeout through the connection's
// deadline: a timeout context costs a timer and a context watcher per call,
// several per cent of a reservation. ctx bounds the acquisition only (a new
// connection is bounded by Config.ConnectTimeout); once sent, the statement
// runs to its end or to the deadline, which closes the connection.
func (p *Pacer) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	nc := c.Conn().PgConn().Conn()
	if err := nc.SetDeadline(time.Now().Add(p.cfg.StatementTimeout)); err != nil {
		return err
	}
	err = c.QueryRow(context.Background(), sql, args...).Scan(dest...)
	_ = nc.SetDeadline(time.Time{}) // a closed connection's error does not matter
	return err
}

// takeFromBlock hands out the next slot kept from a block, if one is neither
// too late nor further away than maxWait. Slots too late are discarded.
func (p *Pacer) takeFromBlock(platform string, maxWait time.Duration) (Reservation, bool) {
	if p.blockSlots.Load() == 0 {
		return Reservation{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil || len(st.block) == 0 {
		return Reservation{}, false
	}
	now := p.cfg.Now()
	for len(st.block) > 0 && now.Sub(st.block[0].at) > p.cfg.MaxLate {
		st.block = st.block[1:]
		p.blockSlots.Add(-1)
		p.blockDiscarded.Add(1)
	}
	if len(st.block) == 0 {
		return Reservation{}, false
	}
	b := st.block[0]
	wait := max(b.at.Sub(now), 0)
	if wait > maxWait {
		return Reservation{}, false
	}
	st.block = st.block[1:]
	p.blockSlots.Add(-1)
	return Reservation{Platform: platform, Granted: true, Wait: wait, ReservedAt: b.reservedAt,
		Slot: b.slot, Multiplier: b.mult, FromBlock: true}, true
}

// dropBlock discards the slots kept for platform: they were spaced for a
// multiplier that rate pressure has just made too small. Call with p.mu held.
func (p *Pacer) dropBlock(st *localState) {
	if st == nil {
		return
	}
	p.blockDiscarded.Add(uint64(len(st.block)))
	p.blockSlots.Add(-int64(len(st.block)))
	st.block = nil
}

// observeRTT folds one reservation round trip into the moving average.
func (p *Pacer) observeRTT(d time.Duration) {
	old := p.rtt.Load()
	if old == 0 {
		p.rtt.Store(int64(d))
		return
	}
	p.rtt.Store(old + (int64(d)-old)/8)
}

// blockSize is how many slots the next reservation statement of platform
// takes: one while the platform's interval is longer than a round trip,
// otherwise enough to cover one round trip, at most Config.MaxBlock.
func (p *Pacer) blockSize(platform string) int {
	if p.cfg.MaxBlock <= 1 {
		return 1
	}
	rtt := float64(p.rtt.Load()) / float64(time.Second)
	p.mu.Lock()
	st := p.local[platform]
	var interval float64
	if st != nil && st.rate > 0 {
		interval = math.Max(st.mult, 1) / st.rate
	}
	p.mu.Unlock()
	if interval <= 0 || rtt <= interval {
		return 1
	}
	return int(math.Min(math.Ceil(rtt/interval), float64(p.cfg.MaxBlock)))
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
// decay_after of them. Pressure is sent at once; clean reports are gathered
// for Config.CleanBatch and sent together (the result is then Deferred).
// When the database is unreachable the report is dropped (counted) without
// blocking; pressure still slows this process's degraded pacing.
func (p *Pacer) Report(ctx context.Context, platform string, res Reservation, out Outcome) (ReportResult, error) {
	p.reports.Add(1)
	if out.Kind != Clean && out.Kind != Pressure {
		return p.cachedResult(platform), nil
	}
	if out.Kind == Clean && p.cfg.CleanBatch > 0 {
		p.deferClean(platform)
		r := p.cachedResult(platform)
		r.Deferred = true
		return r, nil
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
		p.mu.Lock()
		// Slots kept from a block were spaced for the old multiplier, and
		// clean reports gathered before this pressure no longer extend a
		// streak it resets.
		p.dropBlock(p.local[platform])
		if pc := p.pending[platform]; pc != nil {
			pc.n = 0
		}
		p.mu.Unlock()
	}
	var reservedAt *float64
	if !res.ReservedAt.IsZero() {
		s := timeToEpoch(res.ReservedAt)
		reservedAt = &s
	}
	r, err := p.send(ctx, platform, out, reservedAt, retry, 1)
	if err != nil {
		return ReportResult{}, fmt.Errorf("pacer: report %s: %w", platform, err)
	}
	return r, nil
}

// send stores n reports of one kind, or drops them when the database is
// unreachable.
func (p *Pacer) send(ctx context.Context, platform string, out Outcome, reservedAt, retry *float64, n int) (ReportResult, error) {
	shared, probe, _ := p.admit()
	if !shared {
		return p.dropReport(platform, out, retry, n), nil
	}
	r, err := p.reportShared(ctx, platform, out.Kind == Pressure, reservedAt, retry, n)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			p.endProbe(probe)
			return ReportResult{}, ctx.Err()
		case unreachable(err):
			p.fail(probe, err)
			return p.dropReport(platform, out, retry, n), nil
		default:
			p.succeed(probe)
			if errors.Is(err, ErrUnknownPlatform) {
				return ReportResult{}, fmt.Errorf("%w: %q", ErrUnknownPlatform, platform)
			}
			return ReportResult{}, err
		}
	}
	p.succeed(probe)
	return r, nil
}

// deferClean adds a clean report to platform's batch, and starts the batch's
// timer if it is the first.
func (p *Pacer) deferClean(platform string) {
	p.deferred.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.pending[platform]
	if pc == nil {
		pc = &pendingClean{}
		p.pending[platform] = pc
	}
	pc.n++
	if pc.timer == nil && !p.closed {
		pc.timer = time.AfterFunc(p.cfg.CleanBatch, func() {
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StatementTimeout)
			defer cancel()
			p.flushPlatform(ctx, platform)
		})
	}
}

// Flush sends every platform's pending clean reports now.
func (p *Pacer) Flush(ctx context.Context) {
	p.mu.Lock()
	platforms := make([]string, 0, len(p.pending))
	for name := range p.pending {
		platforms = append(platforms, name)
	}
	p.mu.Unlock()
	for _, name := range platforms {
		p.flushPlatform(ctx, name)
	}
}

// flushPlatform sends platform's pending clean reports in one statement.
func (p *Pacer) flushPlatform(ctx context.Context, platform string) {
	p.mu.Lock()
	pc := p.pending[platform]
	if pc == nil || p.closed {
		p.mu.Unlock()
		return
	}
	n := pc.n
	pc.n = 0
	if pc.timer != nil {
		pc.timer.Stop()
		pc.timer = nil
	}
	p.mu.Unlock()
	if n == 0 {
		return
	}
	r, err := p.send(ctx, platform, Outcome{Kind: Clean}, nil, nil, n)
	switch {
	case err != nil:
		p.log.Warn("pacer: clean reports not sent", "platform", platform, "reports", n, "error", err)
	case r.Halved:
		p.log.Info("pacer: clean streak halved the backoff multiplier", "platform", platform, "multiplier", r.Multiplier)
	}
}

func (p *Pacer) reportShared(ctx context.Context, platform string, pressure bool, reservedAt, retry *float64, n int) (ReportResult, error) {
	qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
	defer cancel()
	var (
		r      ReportResult
		effect int16
		streak int32
		hold   float64
	)
	for attempt := 0; ; attempt++ {
		err := p.pool.QueryRow(qctx, reportSQL, platform, pressure, reservedAt, retry, n).
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

// dropReport counts reports the database did not get and applies pressure
// to the local (degraded) pacing only.
func (p *Pacer) dropReport(platform string, out Outcome, retry *float64, n int) ReportResult {
	p.dropped.Add(uint64(n))
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
// not; otherwise, if the database was down, this caller becomes the one
// probe. recovering: shared pacing resumed less than a latch period ago.
func (p *Pacer) admit() (shared, probe, recovering bool) {
	if !p.down.Load() {
		return true, false, p.recovering()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.down.Load() { // resumed meanwhile
		return true, false, p.recovering()
	}
	if p.probing || p.cfg.Now().Before(p.latchedUntil) {
		return false, false, false
	}
	p.probing = true
	return true, true, false
}

// recovering: shared pacing resumed less than a latch period ago.
func (p *Pacer) recovering() bool {
	r := p.recoverNanos.Load()
	return r != 0 && p.cfg.Now().UnixNano() < r
}

func (p *Pacer) latched() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.Now().Before(p.latchedUntil)
}

// fail latches an outage and drops the pool's (probably dead) connections.
func (p *Pacer) fail(probe bool, err error) {
	p.failures.Add(1)
	p.mu.Lock()
	wasDown := p.down.Swap(true)
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
	resumed := p.down.Swap(false)
	p.recoverNanos.Store(p.cfg.Now().Add(p.cfg.Latch).UnixNano())
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
