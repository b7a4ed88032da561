package sources

import (
	"math"
	"time"

	"github.com/fleetpace/fleetpace/pacer"
)

// Bounds of the settings of platforms and sources. Each is checked in Go by
// Platform.Validate and NewSource.Validate before anything reaches SQL, and
// the schema's CHECK constraints (migrations-free-schema.sql, the
// "_bounds" constraints) hold the same numbers; TestSchemaAgreesWithBounds
// proves, on a real database, that every limit here is exactly where the
// schema draws it. Change both together.
const (
	// MinRate is the slowest fleet-wide rate, one request every 2 h 47 min.
	// Slower than that is a schedule, not a rate: give the sources a long
	// interval instead. At the bound a slot's spacing (10,000 s) is still
	// well inside the 24-h cap on every wait and hold (pacer.MaxHold); a rate
	// of 1e-300, once accepted, made spacings no duration can hold.
	MinRate = 1e-4
	// MaxRate is the fastest: one request per nanosecond, Go's time
	// resolution. Anything above a few million per second is unlimited in
	// practice (the shared cursor is float8 epoch seconds, whose resolution
	// today is about 0.24 µs); the benchmarks use MaxRate for "unlimited".
	MaxRate = 1e9

	// MaxBurst is the most requests a platform allows back to back: far
	// beyond any real destination's burst, and it fits the integer column.
	MaxBurst = 1_000_000

	// MaxMultiplierLimit is the largest MaxMultiplier a platform may have:
	// backoff can slow it a thousandfold, no more. A platform that needs
	// more needs a cooldown (or a pause).
	MaxMultiplierLimit = 1024

	// MinCooldown is the shortest platform cooldown; the longest is
	// MaxCooldown (24 h), which caps every cooldown anyway. The database
	// stores intervals in microseconds: a cooldown of 1 ns was stored as 0.
	MinCooldown = time.Second

	// MinInterval is the shortest interval between two checks of one
	// source, and MaxInterval the longest (365 days).
	MinInterval = time.Second
	MaxInterval = 365 * 24 * time.Hour

	// MaxURLBytes is the longest source URL, in bytes: the limit of
	// sitemaps and of many proxies and CDNs, and it keeps the unique index
	// on (platform, url) well under PostgreSQL's limit on an index row
	// (about 2,700 bytes), compressed or not.
	MaxURLBytes = 2048

	// MaxKeyBytes is the longest source key, in bytes: pacer.MaxKeyLen
	// (the schema's fleetpace_source_key_bounds).
	MaxKeyBytes = pacer.MaxKeyLen

	// MaxInFlight is the largest cap on requests open at once (a platform's
	// or a key's max_in_flight; 0: no cap). Each open request is a lease in
	// its pace row: far more than any destination allows concurrently, and
	// few enough that the row stays small.
	MaxInFlight = 10_000

	// MaxListLimit is the most sources one ListSources call returns.
	MaxListLimit = 1_000_000
	// MaxHistoryLimit is the most checks one History call returns.
	MaxHistoryLimit = 10_000
	// MaxFailures is the largest count of failures in a row a filter
	// (ListFilter.MinFailures, Selection.MinFailures) may ask for: the
	// largest the integer column holds.
	MaxFailures = math.MaxInt32
)
