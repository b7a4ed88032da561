package pacer

import "time"

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
