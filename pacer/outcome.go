package pacer

import (
	"math"
	"time"

	"github.com/fleetpace/fleetpace/ratelimit"
)

// Kind classifies a response for the pacer.
type Kind int

const (
	// Neutral responses say nothing about rate (a 404, a 500): the
	// destination answered without pushing back. They count as answered
	// (what the destination accepted) but not as clean.
	Neutral Kind = iota
	// Clean responses (2xx, 304): answered, and clean (the 'multiplier'
	// adaptation's streak).
	Clean
	// Pressure responses (429, 503): the destination pushed back. The fleet
	// slows down at once (see docs/design.md, "Adaptive pacing"), and a
	// Retry-After holds every process — this one at once, before its report
	// reaches the database.
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

// Feedback is what a response told the pacer. Parsing headers is the
// caller's job (package ratelimit does it); the pacer takes them parsed.
type Feedback struct {
	Kind Kind
	// NoAnswer: the destination did not answer at all (a network error, a
	// timeout, an error of the caller's own): the request says nothing and
	// counts for nothing. Only with Neutral.
	NoAnswer bool
	// RetryAfter (Pressure only) holds the fleet for this long from now,
	// at most MaxHold.
	RetryAfter time.Duration
	// Quota is what the response's rate-limit headers announced (any Kind;
	// ratelimit.Parse reads them). A platform with use_headers paces the
	// whole fleet by it: see spacing for the rule.
	Quota ratelimit.Info
	// Sent is when the request was written (local clock; zero: unknown). A
	// request written more than half of SendSlack after its reservation's
	// SendBy (a process paused between the send-by check and the write)
	// moves the platform's schedule later by as much, fleet-wide, so that
	// the destination's windows stay within rate + burst (Stats.Overruns).
	// fetch.Result.Sent and Transport fill it in (sendby.Gate.Sent).
	Sent time.Time
	// Scope says whose limit the answer speaks of, for a request reserved
	// for a key: the key's (its row holds and slows down) or the
	// platform's. Default ScopeAuto.
	Scope Scope
}

// Scope is whose limit an answer speaks of (Feedback.Scope).
type Scope int

const (
	// ScopeAuto: for a keyed request, pressure with a Retry-After and any
	// announced quota are the key's; pressure without a Retry-After (a 503,
	// a bare 429) is the platform's.
	ScopeAuto Scope = iota
	// ScopeKey: the key's, whatever the answer.
	ScopeKey
	// ScopePlatform: the platform's, whatever the answer.
	ScopePlatform
)

// ScopeFor is whose limit f speaks of for the request of res: ScopeKey or
// ScopePlatform (never ScopeAuto).
func (f Feedback) ScopeFor(res Reservation) Scope { return f.scope(res) }

// scope decides whose limit f speaks of for res.
func (f Feedback) scope(res Reservation) Scope {
	switch {
	case res.Key == "" || f.Scope == ScopePlatform:
		return ScopePlatform
	case f.Scope == ScopeKey:
		return ScopeKey
	case f.Kind == Pressure && f.RetryAfter > 0, f.Quota.Announced():
		return ScopeKey
	}
	return ScopePlatform
}

// answered reports whether f counts as an answer without pressure.
func (f Feedback) answered() bool {
	return f.Kind == Clean || f.Kind == Neutral && !f.NoAnswer
}

// announcedShare is the part of an announced rate the fleet paces at
// where the limit is one request (or unknown).
const announcedShare = 0.97

// shareOf is the part of an announced rate the fleet paces at, for a
// destination that showed slack requests of room at once (its largest
// Remaining lately + 1, at most its limit; 0: unknown): announcedShare's
// margin divided by the slack (0.97 for 1, 0.997 for 10).
func shareOf(slack float64) float64 {
	if !(slack > 1) || math.IsInf(slack, 1) {
		return announcedShare
	}
	return 1 - (1-announcedShare)/slack
}

// MaxHold caps every hold a destination can ask for (Retry-After, an
// exhausted quota's reset) and every wait the pacer returns: 24 hours, the
// cap of a cooldown and of every wait package ratelimit derives.
const MaxHold = ratelimit.MaxWait

// spacing turns an announced quota into the pacer's terms: the spacing
// between requests it allows now (0: none implied), how long that
// announcement holds, and a hold when the quota is exhausted. window is the
// quota's window when q announces none: the longest Reset this process has
// seen from the platform lately (a token bucket's time to refill from
// empty, a fixed window's length); 0 if unknown.
//
// The pace is the long-run rate, Limit / window (a token bucket's refill
// rate, a fixed window's quota per window), when both are known: it is the
// same in every answer, so the fleet's pace stands still while the quota
// does. What is left spread until the reset (Remaining / Reset) swings
// within every window — fast early, crawling late — and paces the fleet
// only when the limit or the window is unknown. Should the fleet send the
// last of a window's quota early, the answer that says so (Remaining 0)
// holds it until the reset.
//
// slack is the room the destination showed at once (shareOf; 0: unknown).
func spacing(q ratelimit.Info, window time.Duration, slack float64) (interval, ttl, hold time.Duration) {
	if q.Window > 0 {
		window = q.Window
	}
	var rate float64
	share := announcedShare
	switch {
	case q.Limit > 0 && window > 0:
		rate = q.Limit / window.Seconds()
		share = shareOf(min(slack, q.Limit))
	case q.HasRemaining && q.HasReset && q.Reset > 0:
		rate = max(q.Remaining, 0) / q.Reset.Seconds()
	}
	if rate > 0 && !math.IsInf(rate, 1) { // NaN and nonsense fall through
		interval = clampDuration(secondsToDuration(1 / (rate * share)))
		ttl = clampDuration(max(q.Reset+window, time.Second))
	}
	if q.Exhausted() && q.HasReset && q.Reset > 0 {
		hold = clampDuration(q.Reset)
	}
	return interval, ttl, hold
}

// Reservation is the answer to Reserve.
type Reservation struct {
	Platform string
	// Key is the key the slot was reserved for (ReserveKey; "": none).
	Key string
	// Granted: the caller owns a slot and must sleep Wait before using it
	// (Sleep does, and re-spaces the slot if the fleet slows down meanwhile).
	// Not granted: nothing was reserved; come back after Wait.
	Granted bool
	Wait    time.Duration
	// Degraded: paced locally because the database could not be reached.
	Degraded bool
	// Paused: denied because an operator paused the platform (Wait is until
	// the pause ends; MaxHold when it has no end).
	Paused bool
	// Retry: denied for a moment — the key's next slot is later than the
	// platform's, or the open requests are at their cap — and nothing was
	// booked: reserve again after Wait (Acquire does, within its bound).
	Retry bool
	// Late is how late after its slot Sleep woke, at worst (set by Sleep):
	// the slot is mapped from the database's clock to the local one within
	// the tightest bracket the process's round trips give (clockOffset),
	// and the bracket's width counts as lateness.
	Late time.Duration
	// SendBy is the latest local time the request may leave within the
	// ceiling's guarantee: the slot plus the lateness the schedule was
	// spaced for (Config.LateBudget). Sleep sets it; zero when the slot is
	// used without that bound (a third late slot in a row). A sender that
	// checks it as close to the write as it can (fetch.Request.SendBy
	// checks it as the request is written to the connection) keeps the
	// ceiling however long its process was paused after Sleep returned.
	SendBy time.Time
	// ReservedAt is the database time of the reservation, or of the last
	// slow-down that re-spaced its slot (zero when degraded); Report uses it
	// to apply one increase per pressure episode.
	ReservedAt time.Time
	// Slot is the database time of the reserved slot (or of the earliest slot
	// when denied); zero when degraded.
	Slot time.Time
	// Multiplier is the ceiling over the pace adaptation asks for (1: the
	// ceiling): the shared backoff multiplier, or rate / the pace just under
	// the destination's estimated limit.
	Multiplier float64
	// Interval is the spacing in force for the slot: the largest of
	// adaptation's, the ceiling's (1 / rate, stretched where lateness needs
	// it) and the destination's announced spacing.
	Interval time.Duration
	// FromBlock: the slot was reserved earlier, in a block taken by another
	// call of this process, and cost no round trip.
	FromBlock bool

	due     time.Time     // local-clock time of the slot (clockOffset.local)
	maxWait time.Duration // what the caller accepted
	seq     int64         // the platform's event sequence when granted
	// rate and burst are the platform's when the slot was granted: with
	// the spacing they decide how late it may still be used
	// (tuning.lateTolerance).
	rate  float64
	burst int
	// spacing is Interval in seconds, unrounded (0: built by hand).
	spacing float64
	// lease is the lease the slot took on rows that cap open requests (its
	// expiry, epoch seconds; 0: none): Report gives it back.
	lease float64
	// behind: denied at once in the line of its key's callers (behind one
	// waiting out a hold, or beyond the bound): Acquire does not wait — a
	// River job snoozes and frees its worker.
	behind bool
}

// interval is the slot's spacing in seconds.
// sentSpacing is the spacing r's slot was granted at, in seconds (0: none
// known — a degraded slot, or one built by hand).
func (r Reservation) sentSpacing() float64 {
	if r.Degraded {
		return 0
	}
	return r.interval()
}

func (r Reservation) interval() float64 {
	if r.spacing > 0 {
		return r.spacing
	}
	return r.Interval.Seconds()
}

// ReportResult is the pacer state after a Report.
type ReportResult struct {
	Multiplier    float64
	MaxMultiplier float64
	// Increased: this report slowed the platform down (the multiplier
	// multiplied by the backoff factor, or a lower estimate).
	Increased bool
	// AtMax: rate pressure while the platform was already as slow as it
	// may be (the multiplier at its maximum, the pace at ceiling ÷ maximum
	// multiplier): the worker promotes this to rate_limited.
	AtMax bool
	// Stale: rate pressure for a request reserved before the latest
	// slow-down, which therefore did not slow the platform down again.
	Stale bool
	// Jitter: a lone refusal below the destination's estimated limit,
	// taken for jitter: the estimate stands ("estimate" adaptation).
	Jitter bool
	// Quota: rate pressure whose answer said the announced quota was
	// exhausted (headers on, "estimate" adaptation): the hold until its
	// reset answers it and the estimate stands.
	Quota bool
	// Estimate is the destination's limit as the fleet measured it,
	// requests/s ("estimate" adaptation; 0: none yet).
	Estimate float64
	// Relaxed: this report completed a clean streak and lowered the
	// multiplier.
	Relaxed     bool
	CleanStreak int
	// Hold is how long the fleet-wide hold still lasts.
	Hold time.Duration
	// Respaced: this report changed the fleet's spacing or extended its
	// hold; every process re-spaces the slots it holds.
	Respaced bool
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
	Denied          uint64 // reservations not granted (wait > max wait, paused, or no rate known)
	Degraded        uint64 // reservations decided locally because the database was unreachable
	FromBlock       uint64 // granted reservations served from a block, without a round trip
	Refills         uint64 // block statements sent ahead, before the block kept ran out (statements of no Reserve call)
	BlockDiscarded  uint64 // slots of blocks that went unused (too late, or dropped on a slow-down)
	KeyStatements   uint64 // keyed reservation statements sent (ReserveKey)
	KeyBatches      uint64 // round trips (transactions) that carried them
	Reports         uint64 // Report calls
	ReportsDropped  uint64 // reports not stored because the database was unreachable
	ReportsDeferred uint64 // clean reports sent later, in a batch
	ConnectAttempts uint64 // connection attempts made by the pacer's pool
	Failures        uint64 // round trips that found the database unreachable
	SlowConnects    uint64 // calls made again after a slow connect while the database answered on other connections
	Events          uint64 // slow-downs this process learnt of (its own reports, notifications, reservations)
	Notifications   uint64 // slow-down notifications received
	Respaced        uint64 // granted slots moved later by a slow-down before they were used
	GivenBack       uint64 // granted slots given back: re-spaced beyond the caller's max wait
	Late            uint64 // granted slots given up because the caller woke too late for them
	Overruns        uint64 // requests written past their slot's guarantee (Feedback.Sent): the schedule moved later by as much
	Down            bool   // shared pacing currently unavailable
	Listening       bool   // the slow-down listener is connected
	FleetSize       int    // fleet size last set
}
