package pacer

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/jackc/pgx/v5/pgxpool"
)

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
	// latched, no connection is attempted and reservations are paced locally
	// (a local slot booked at most half a Latch ahead). Once the database
	// answers again, the process honours its local share for 1.5 × Latch
	// (others may still have local slots until then): the fleet is back at
	// full speed about that long after. Shorter recovers sooner and costs one
	// connection attempt per Latch while the database is down. Default 5 s
	// (a fleetpace worker uses 1 s).
	Latch time.Duration

	// MinFleetSize is the smallest fleet size degraded pacing assumes
	// (rate / (max(fleet size, MinFleetSize) + 1)). Default 1. A fleetpace
	// worker learns the fleet's size from its heartbeat (SetFleetSize); a
	// library fleet (riverpace, Transport) must set it to its number of
	// processes, or the processes together pace faster than the ceiling
	// while the database is unreachable (three at the default: 1.5 ×).
	MinFleetSize int

	// Logger receives state changes (outage, resume). Default: discard.
	Logger *slog.Logger

	// MaxBlock is the most slots one reservation statement takes at once.
	// When a platform's interval is shorter than a round trip (a very high or
	// unlimited rate), a statement reserves ⌈round trip / interval⌉ slots (at
	// most MaxBlock) and hands the rest out to later callers of this process
	// without a round trip. The slots are exactly those single reservations
	// would have got, so the ceiling holds as before. The next block is
	// taken in the background once half a block is left, so such callers do
	// not wait for a round trip. Default 32; 1 turns blocks off.
	MaxBlock int

	// MaxKeyBatch is the most keyed reservations (ReserveKey) of one
	// platform that this process sends in one round trip and transaction.
	// Every keyed reservation locks its platform's pace row, so callers
	// reserving at the same time would each wait in that row's lock queue
	// for the others' statements, one commit at a time; gathered, they take
	// the row once. Each is still its own statement, run in the order asked,
	// so the slots are those reservations made one at a time would have got.
	// Default DefaultMaxKeyBatch; 1: one statement and transaction each.
	MaxKeyBatch int

	// LateBudget is how late after its slot a request may leave (a slow
	// reply, a loaded machine, a GC pause): the shared schedule is spaced so
	// that requests leaving up to LateBudget late — or half their spacing,
	// when the platform is paced slower than its ceiling — and reaching the
	// destination within SendSlack of that still make at most rate + burst
	// in any 1-s window at the destination. The burst pays for it first;
	// where the burst is too small, the ceiling's spacing is stretched a
	// little (at 500/s, burst 1: 482/s; below ~30/s nothing). Later than
	// that, a slot kept from a block is discarded and Sleep gives the slot
	// up (ErrLate). Lateness is judged against the slot's time in the
	// database, mapped to the local clock. Where the destination paces the
	// platform, a slot is also given up once it is later than the margin
	// the pace leaves under the destination's limit (4 % of the spacing):
	// a strict limiter would refuse the request after it. Default
	// DefaultLateBudget.
	LateBudget time.Duration

	// LeaseTTL is how long a slot of a platform (or key) that caps its open
	// requests (max_in_flight) counts as open when its request is never
	// reported (a crashed process): set it above the longest request plus
	// a margin. Default DefaultLeaseTTL.
	LeaseTTL time.Duration

	// TimeFromClock makes the shared statements take their time from Clock
	// instead of the database's clock_timestamp(): for tests on a fake
	// clock, where every process sharing the platforms must do the same.
	// Default false: the database's clock, one clock for the whole fleet.
	TimeFromClock bool

	// CleanBatch is how long clean reports of a platform are gathered before
	// one statement adds them all to the fleet-wide streak. Rate pressure is
	// always sent at once. Default 100 ms; negative sends every clean report
	// at once. Close and Flush send what is pending.
	CleanBatch time.Duration

	// PollOnly turns the slow-down listener off: without LISTEN (for
	// PgBouncer in transaction mode, which cannot hold one), a process
	// learns that the fleet slowed down at its next reservation instead of
	// within milliseconds. Default false: one extra connection per process
	// LISTENs on NotifyChannel.
	PollOnly bool

	// ListenIdle is how long the listener stays connected while this
	// process reserves nothing and no caller sleeps on a slot: then it
	// closes, so an idle worker holds no connection for it, and the next
	// reservation starts it again (catching up with the slow-downs it
	// missed from the statement's event sequence). Default
	// DefaultListenIdle; negative: never closes.
	ListenIdle time.Duration

	// Clock is the local clock, used where local time matters: sleeping
	// until a slot, degraded pacing, slots kept from blocks, the failure
	// latch and the clean-report timers (the shared schedule runs on the
	// database's clock). Default: the system clock.
	Clock clock.Clock
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
	case c.MaxKeyBatch < 0:
		return fmt.Errorf("pacer: Config.MaxKeyBatch must not be negative (got %d)", c.MaxKeyBatch)
	case c.LeaseTTL < 0:
		return fmt.Errorf("pacer: Config.LeaseTTL must not be negative (got %s)", c.LeaseTTL)
	case c.LateBudget < 0 || c.LateBudget > MaxLateBudget:
		return fmt.Errorf("pacer: Config.LateBudget must be in [0, %s] (got %s)", MaxLateBudget, c.LateBudget)
	}
	return nil
}

func (c *Config) withDefaults() Config {
	out := *c
	out.MaxConns = cmp.Or(out.MaxConns, 4)
	out.ConnectTimeout = cmp.Or(out.ConnectTimeout, 2*time.Second)
	out.StatementTimeout = cmp.Or(out.StatementTimeout, 2*time.Second)
	out.Latch = cmp.Or(out.Latch, 5*time.Second)
	out.MinFleetSize = cmp.Or(out.MinFleetSize, 1)
	out.MaxKeyBatch = cmp.Or(out.MaxKeyBatch, DefaultMaxKeyBatch)
	out.MaxBlock = cmp.Or(out.MaxBlock, DefaultMaxBlock)
	out.LateBudget = cmp.Or(out.LateBudget, DefaultLateBudget)
	out.LeaseTTL = cmp.Or(out.LeaseTTL, DefaultLeaseTTL)
	out.ListenIdle = cmp.Or(out.ListenIdle, DefaultListenIdle)
	out.CleanBatch = cmp.Or(out.CleanBatch, 100*time.Millisecond)
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	out.Clock = clock.Or(out.Clock)
	return out
}

// DefaultListenIdle is Config.ListenIdle's default.
const DefaultListenIdle = 30 * time.Second

// DefaultMaxBlock is Config.MaxBlock's default.
const DefaultMaxBlock = 32

// DefaultMaxKeyBatch is Config.MaxKeyBatch's default.
const DefaultMaxKeyBatch = 32

// DefaultLateBudget is Config.LateBudget's default: a loaded machine's
// timers wake a few milliseconds late often, tens of milliseconds rarely.
const DefaultLateBudget = 20 * time.Millisecond

// DefaultLeaseTTL is Config.LeaseTTL's default: a fetch's timeout (30 s)
// and a margin.
const DefaultLeaseTTL = time.Minute

// MaxLateBudget bounds Config.LateBudget: a larger budget would cost a fast
// platform more of its ceiling than a lost slot.
const MaxLateBudget = time.Second

// SendSlack is how long after its lateness check a request may take to
// reach the destination (the request written, carried, read) within the
// ceiling's guarantee (see Config.LateBudget): on two shared cores at a
// load of 7, a process paused for more than 10 ms between the check and
// the write put 43 requests in a 1-s window at 40/s + burst 2.
const SendSlack = 20 * time.Millisecond

// minLate is the least lateness always tolerated: about a timer's
// precision.
const minLate = time.Millisecond
