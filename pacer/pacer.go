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
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/dbconn"
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

// Pacer paces requests to platforms for the whole fleet. It is safe for
// concurrent use.
type Pacer struct {
	cfg    Config
	pool   *pgxpool.Pool
	log    *slog.Logger
	tuning tuning
	tune   []float64 // tuning.array(), passed with every shared statement

	fleet atomic.Int64

	clock      clock.Clock
	latch      latch
	cause      atomic.Pointer[error] // the last error that latched an outage
	recoveryMu sync.Mutex            // a probe's or a recovering process's reservations, one at a time (Reserve)

	mu    sync.Mutex
	local map[string]*localState
	turns map[string]*keyTurn // per key row: its callers' turnstile (AcquireKey)

	keyMu     sync.Mutex
	keyQueues map[string]*keyQueue // per platform: keyed reservations waiting to go out (keybatch.go)
	keyDrain  sync.WaitGroup       // drainKeys goroutines running
	// batchAnswered, when set (tests), runs between a key batch's reply
	// and the wake-up of its callers: where a loaded machine delays them.
	batchAnswered func()
	pending       map[string]*pendingClean // clean reports not sent yet
	closing       bool                     // Close has begun: no new clean-report timers
	closed        bool                     // Close has flushed: nothing more is sent
	timers        sync.WaitGroup           // clean-report timer callbacks scheduled or running

	rtt    atomic.Int64 // moving average of a reservation's round trip, ns
	offset clockOffset  // database clock minus local clock (mu)

	// Read without the lock on the common path (no blocks kept).
	blockSlots atomic.Int64 // slots kept in all blocks

	// The slow-down listener (listen.go).
	listenConfig  *pgx.ConnConfig
	listenCtx     context.Context
	stopListen    context.CancelFunc
	listenDone    sync.WaitGroup
	listening     atomic.Bool   // connected and LISTENing
	lastUse       atomic.Int64  // Config.Clock time of the last reservation, Unix ns (ListenIdle)
	listenRunning bool          // a listener goroutine exists (mu)
	listenRetry   time.Time     // no new listener before this (mu)
	listenUp      chan struct{} // closed when the current run LISTENs (mu)
	listenEnd     chan struct{} // closed when the current run ends (mu)

	reservations, granted, denied, degraded atomic.Uint64
	keyStatements, keyBatches               atomic.Uint64
	fromBlock, blockDiscarded, refilled     atomic.Uint64
	refills                                 sync.WaitGroup // block refills on their way (refill)
	reports, dropped, deferred              atomic.Uint64
	attempts, failures                      atomic.Uint64
	events, notifications                   atomic.Uint64
	respaced, givenBack, late, overruns     atomic.Uint64
	// succeeded counts round trips that reached the database; slowConnects
	// the calls that went again after a slow connect (see slowConnect).
	succeeded, slowConnects atomic.Uint64
	// noSlowConnect, set by tests, takes every failed connect for an
	// outage (the naive rule).
	noSlowConnect bool
	// noGate, set by tests, lets slots go while a report that slows their
	// platform down is on its way (the naive rule; see closeGate).
	noGate bool
	// noRefill, set by tests, takes a block only when the one kept has
	// run out (the naive rule; see refill).
	noRefill bool
	// gated counts callers that reached their slot behind a gate.
	gated atomic.Uint64
}

// pendingClean is a platform's batch of reports without pressure waiting
// to be sent.
type pendingClean struct {
	answered int           // answers without pressure (clean and neutral)
	clean    int           // of which clean
	fresh    int           // of which to requests reserved since the latest slow-down known
	announce *announcement // the latest announcement gathered
	// sentFrom is the earliest slot of the answers gathered (database
	// time), unless one came without a slot (slotUnknown).
	sentFrom    float64
	slotUnknown bool
	timer       clock.Timer
}

// blockSlot is a slot of a block kept for a later call.
type blockSlot struct {
	at         time.Time // local-clock time of the slot
	slot       float64   // database time of the slot
	reservedAt float64   // database time of the block's reservation
	mult       float64
	interval   float64 // spacing of the block, seconds
	seq        int64   // event sequence when the block was taken
	maxWait    time.Duration
}

// localState is what this process knows of one platform: the cached
// configuration and spacing, the last slow-down applied, the local cursor
// used for degraded pacing, slots kept from blocks and the callers sleeping
// until their slots.
type localState struct {
	rate        float64
	burst       int
	maxMult     float64
	mult        float64
	interval    float64       // effective spacing last seen, seconds
	last        event         // the last slow-down applied (seq 0: none)
	hold        time.Time     // local-clock estimate of the shared hold and pause
	held        time.Time     // this process holds until then: a Retry-After it received (holdLocally)
	far         time.Time     // a reservation was denied for a slot beyond its bound: backlogged until that slot (HeldFor)
	noRespace   bool          // the platform's respace is off: slots stand as granted, no local hold either
	capped      bool          // the row (or a key of it) caps open requests: no local slot while the database is unreachable (reserveLocal)
	keysLimited bool          // a key of the platform was seen with a rate of its own: a key never seen gets no local slot (reserveLocal)
	tat         time.Time     // local GCRA cursor (burst 1) for degraded pacing
	sharedEnd   time.Time     // a degraded period starts no earlier: after the slots the row may have granted (reserveShared)
	block       []blockSlot   // slots reserved in a block, not handed out yet, in time order
	fetching    chan struct{} // a block statement is on its way (blockLeader); closed when it returns
	gate        chan struct{} // reports that slow the platform down are on their way (closeGate); closed when the last returns
	gates       int           // how many
	waiters     map[*waiter]struct{}

	maxReset   time.Duration // the longest quota Reset announced lately (announce)
	maxResetAt time.Time
	// maxRemaining is the largest Remaining the platform answered lately
	// (announce; none yet while maxRemainingAt is zero), the slack its
	// announced share is read by.
	maxRemaining   float64
	maxRemainingAt time.Time
	// annInterval is the spacing this process's last announcement asked
	// for (seconds), in force until annUntil (announce).
	annInterval float64
	annUntil    time.Time
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
		// fleetpace's connection rule: one attempt, fail fast.
		var err error
		if pc, err = dbconn.PoolConfig(dbconn.Config{URL: cfg.DatabaseURL, ConnectTimeout: cfg.ConnectTimeout}); err != nil {
			return nil, fmt.Errorf("pacer: Config.DatabaseURL: %w", err)
		}
	}
	p := &Pacer{cfg: cfg, log: cfg.Logger, clock: cfg.Clock, local: map[string]*localState{}, turns: map[string]*keyTurn{}, keyQueues: map[string]*keyQueue{}, pending: map[string]*pendingClean{},
		latch: latch{clock: cfg.Clock, period: cfg.Latch}, tuning: defaultTuning(cfg.LateBudget)}
	p.tune = p.tuning.array()
	p.fleet.Store(1)

	pc.MaxConns = cfg.MaxConns
	pc.MinConns = 0
	pc.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	// Pacer state is soft state, so its commits wait neither for the disk
	// nor for a synchronous standby, whatever the server says: a commit lost
	// in a crash or a failover is a reservation whose slot has passed by
	// the time the fleet paces shared again, or a slow-down the next 429
	// reports again. Set in the startup packet, so it costs no round trip.
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	// The pacer's statements have one plan whatever their parameters; planning
	// them again on every execution would be most of their server time.
	pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = "fleetpace-pacer"
	}
	userBefore := pc.BeforeConnect
	pc.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if p.latch.latched() {
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
	p.listenConfig = pc.ConnConfig.Copy()
	p.listenCtx, p.stopListen = context.WithCancel(context.Background())
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		p.stopListen()
		return nil, fmt.Errorf("pacer: pool: %w", err)
	}
	p.pool = pool
	return p, nil
}

// Close sends the clean reports still pending (bounded by
// Config.StatementTimeout), waits for batches already being sent, and closes
// the pacer's pool. Calling it again does nothing.
func (p *Pacer) Close() {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		return
	}
	p.closing = true
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StatementTimeout)
	defer cancel()
	p.Flush(ctx)
	p.timers.Wait() // a batch already being sent by its timer
	p.keyDrain.Wait()
	p.refills.Wait()
	p.stopListen()
	p.listenDone.Wait()
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.pool.Close()
}

// state returns platform's local state, creating it. Call with p.mu held.
func (p *Pacer) state(platform string) *localState {
	st := p.local[platform]
	if st == nil {
		st = &localState{}
		p.local[platform] = st
	}
	return st
}

// SetFleetSize records the live worker count (the heartbeat calls it); in
// degraded mode each process paces at rate / (fleet size + 1).
func (p *Pacer) SetFleetSize(n int) { p.fleet.Store(int64(n)) }

// fail latches an outage and drops the pool's (probably dead) connections.
func (p *Pacer) fail(probe bool, err error) {
	p.failures.Add(1)
	if !errors.Is(err, errLatched) {
		p.cause.Store(&err)
	}
	if !p.latch.fail(probe) {
		p.log.Warn("pacer: database unreachable, pacing locally", "error", err,
			"latch", p.cfg.Latch, "divisor", p.divisor())
	}
	p.pool.Reset()
}

// outageCause is the error that latched the current outage (nil when the
// database is reachable).
func (p *Pacer) outageCause() error {
	if !p.latch.isDown() {
		return nil
	}
	if err := p.cause.Load(); err != nil {
		return *err
	}
	return nil
}

// succeed ends a probe that reached the database.
func (p *Pacer) succeed(probe bool) {
	p.succeeded.Add(1)
	if p.latch.succeed(probe) {
		p.log.Info("pacer: database reachable again, shared pacing resumed")
	}
}

func (p *Pacer) divisor() float64 {
	n := int(p.fleet.Load())
	if n < p.cfg.MinFleetSize {
		n = p.cfg.MinFleetSize
	}
	return float64(n + 1)
}

// Stats returns the per-process counters.
func (p *Pacer) Stats() Stats {
	return Stats{
		Reservations:    p.reservations.Load(),
		Granted:         p.granted.Load(),
		Denied:          p.denied.Load(),
		Degraded:        p.degraded.Load(),
		FromBlock:       p.fromBlock.Load(),
		Refills:         p.refilled.Load(),
		BlockDiscarded:  p.blockDiscarded.Load(),
		KeyStatements:   p.keyStatements.Load(),
		KeyBatches:      p.keyBatches.Load(),
		Reports:         p.reports.Load(),
		ReportsDropped:  p.dropped.Load(),
		ReportsDeferred: p.deferred.Load(),
		ConnectAttempts: p.attempts.Load(),
		Failures:        p.failures.Load(),
		SlowConnects:    p.slowConnects.Load(),
		Events:          p.events.Load(),
		Notifications:   p.notifications.Load(),
		Respaced:        p.respaced.Load(),
		GivenBack:       p.givenBack.Load(),
		Late:            p.late.Load(),
		Overruns:        p.overruns.Load(),
		Down:            p.latch.isDown(),
		Listening:       p.listening.Load(),
		FleetSize:       int(p.fleet.Load()),
	}
}
