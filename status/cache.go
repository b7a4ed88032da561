package status

import (
	"context"
	"sync"
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// DefaultMaxAge is how old a Cache's report may be before the next Get reads
// a new one.
const DefaultMaxAge = 10 * time.Second

// Cache shares one Read between frequent callers: a worker's /metrics, which
// Prometheus scrapes every few seconds in every worker of the fleet, and
// whose fleet-wide gauges come from the report. Read counts and ranks the
// lateness of every source (a scan of fleetpace_source); with a Cache each
// process runs it at most once per MaxAge however often it is scraped, and
// only when asked (a process nobody scrapes reads nothing). Concurrent Gets
// wait for one read. A failed read is kept for MaxAge too, so an unreachable
// database is asked once per MaxAge, not once per scrape.
type Cache struct {
	db     DB
	maxAge time.Duration
	clock  clock.Clock
	// TopKeys is how many top keys per platform a read lists (ReadTop; 0:
	// the default). Set it before the first Get.
	TopKeys int

	mu  sync.Mutex
	rep *Report
	err error
	at  time.Time // when rep and err were read; zero: never
}

// NewCache returns a Cache reading db. maxAge 0 means DefaultMaxAge; clock
// nil means the real clock.
func NewCache(db DB, maxAge time.Duration, c clock.Clock) *Cache {
	if maxAge <= 0 {
		maxAge = DefaultMaxAge
	}
	return &Cache{db: db, maxAge: maxAge, clock: clock.Or(c)}
}

// Get returns the last report (or the last read's error) if it was read
// less than MaxAge ago, and reads a new one otherwise. A read is bounded
// by ctx.
func (c *Cache) Get(ctx context.Context) (*Report, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && c.clock.Since(c.at) < c.maxAge {
		return c.rep, c.err
	}
	c.rep, c.err = ReadTop(ctx, c.db, c.TopKeys)
	c.at = c.clock.Now()
	return c.rep, c.err
}
