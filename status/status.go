// Package status assembles what `fleetpace status`, the worker's /status
// endpoint and its fleet-wide metrics show: every platform with its limits,
// shared pacer state, active cooldown, and queued, due and staleness
// figures, plus the live workers.
package status

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
)

// RecentWindow is how far back Platform.Recent counts the fetch history.
const RecentWindow = time.Minute

// Platform is one platform's row of the report. Its JSON is the platform's
// settings (sources.Platform) with "pace", "cooldown", "counts" and
// "recent" beside them; every duration is in seconds under a key ending in
// _s.
type Platform struct {
	sources.Platform
	Pace     pacer.State            // every platform has a pace row
	Cooldown *sources.Cooldown      // nil: not cooling down
	Counts   sources.PlatformCounts // sources: due, queued, failing, staleness
	Recent   Recent                 // fetches over the last RecentWindow, from the history
	// State is what the platform is doing now, in words, most
	// constraining first (Conditions).
	State []Condition
	// Use is the rate used over the recent window against the pace and
	// the ceiling, the 429s per minute and the fetches in flight.
	Use Usage
	// Keys is the platform's keys in aggregate and its top keys under
	// pressure (sources.KeyStats); nil when it has no key in use and no
	// cap on open requests.
	Keys *sources.PlatformKeys
}

// Recent is a platform's fetches over a recent window, from the fetch
// history (sources.Activity).
type Recent struct {
	Window time.Duration
	// Checks counts the window's fetches by outcome (ok, not_modified,
	// rate_pressure, rate_limited, failed); absent outcomes are 0.
	Checks map[fetch.Outcome]int64
}

// Total is the number of fetches in the window.
func (r Recent) Total() int64 {
	var n int64
	for _, c := range r.Checks {
		n += c
	}
	return n
}

// PerSec is the fetch rate over the window, requests per second.
func (r Recent) PerSec() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Total()) / r.Window.Seconds()
}

type recentJSON struct {
	Window float64                 `json:"window_s"`
	Checks map[fetch.Outcome]int64 `json:"checks"`
	PerSec float64                 `json:"requests_per_sec"`
}

// MarshalJSON writes the window in seconds and the rate beside the counts.
func (r Recent) MarshalJSON() ([]byte, error) {
	checks := r.Checks
	if checks == nil {
		checks = map[fetch.Outcome]int64{}
	}
	return json.Marshal(recentJSON{r.Window.Seconds(), checks, r.PerSec()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (r *Recent) UnmarshalJSON(b []byte) error {
	var j recentJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*r = Recent{Window: time.Duration(j.Window * float64(time.Second)), Checks: j.Checks}
	return nil
}

// platformParts is what a Platform adds to the platform's settings in JSON.
type platformParts struct {
	Pace     pacer.State            `json:"pace"`
	Cooldown *sources.Cooldown      `json:"cooldown,omitempty"`
	Counts   sources.PlatformCounts `json:"counts"`
	Recent   Recent                 `json:"recent"`
	State    []Condition            `json:"state"`
	Use      Usage                  `json:"use"`
	Keys     *sources.PlatformKeys  `json:"keys,omitempty"`
}

// MarshalJSON writes the platform's settings and, beside them, its pace,
// cooldown, counts and recent fetches. (Embedding sources.Platform, whose
// own MarshalJSON would otherwise write the settings alone.)
func (p Platform) MarshalJSON() ([]byte, error) {
	settings, err := json.Marshal(p.Platform)
	if err != nil {
		return nil, err
	}
	parts, err := json.Marshal(platformParts{p.Pace, p.Cooldown, p.Counts, p.Recent, p.State, p.Use, p.Keys})
	if err != nil {
		return nil, err
	}
	// Two objects made one: {settings…} + {parts…}.
	out := append(settings[:len(settings)-1:len(settings)-1], ',')
	return append(out, parts[1:]...), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (p *Platform) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &p.Platform); err != nil {
		return err
	}
	var parts platformParts
	if err := json.Unmarshal(b, &parts); err != nil {
		return err
	}
	p.Pace, p.Cooldown, p.Counts, p.Recent, p.State, p.Use, p.Keys = parts.Pace, parts.Cooldown, parts.Counts, parts.Recent, parts.State, parts.Use, parts.Keys
	return nil
}

// InFlight sums the fetches in flight of the workers by platform (each
// worker's as of its last heartbeat).
func InFlight(workers []fleet.Worker) map[string]int {
	out := map[string]int{}
	for _, w := range workers {
		for p, n := range w.InFlight {
			out[p] += n
		}
	}
	return out
}

// Report is the whole status.
type Report struct {
	At        time.Time      `json:"at"` // the database's time of the read
	Platforms []Platform     `json:"platforms"`
	Workers   int            `json:"live_workers"`
	Fleet     []fleet.Worker `json:"workers"` // the live workers, longest running first
	// Jobs counts the unfinished River jobs by kind and state.
	Jobs []queue.JobCount `json:"jobs"`
}

// DB is what Read needs: a pool or a connection.
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Read builds the report, reading everything in one repeatable-read
// transaction so the numbers agree with each other. It runs the per-source
// counts and staleness (sources.Counts), a scan of every source, and counts
// the last RecentWindow of the fetch history (an index range per platform):
// Cache shares one read between frequent callers. Each platform's top keys
// are at most sources.DefaultTopKeys (ReadTop sets how many).
func Read(ctx context.Context, db DB) (*Report, error) {
	return ReadTop(ctx, db, 0)
}

// ReadTop is Read with at most topKeys top keys per platform (0:
// sources.DefaultTopKeys; negative: none).
func ReadTop(ctx context.Context, db DB, topKeys int) (*Report, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	rep := &Report{}
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&rep.At); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	platforms, err := sources.ListPlatforms(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	paces, err := pacer.States(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	cooldowns, err := sources.ActiveCooldowns(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	counts, err := sources.Counts(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	activity, err := sources.Activity(ctx, tx, sources.ActivityQuery{Window: RecentWindow})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	if rep.Fleet, err = fleet.Live(ctx, tx); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	keyStats, err := sources.KeyStats(ctx, tx, topKeys)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	keys := make(map[string]*sources.PlatformKeys, len(keyStats))
	for i := range keyStats {
		keys[keyStats[i].Platform] = &keyStats[i]
	}
	rep.Workers = len(rep.Fleet)
	if rep.Jobs, err = queue.CountJobs(ctx, tx); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	inFlight := InFlight(rep.Fleet)
	pace := make(map[string]pacer.State, len(paces))
	for _, s := range paces {
		pace[s.Platform] = s
	}
	count := make(map[string]sources.PlatformCounts, len(counts))
	for _, c := range counts {
		count[c.Platform] = c
	}
	cooldown := make(map[string]*sources.Cooldown, len(cooldowns))
	for i := range cooldowns {
		cooldown[cooldowns[i].Platform] = &cooldowns[i]
	}
	recent := make(map[string]Recent, len(platforms))
	for _, a := range activity {
		r, ok := recent[a.Platform]
		if !ok {
			r = Recent{Window: RecentWindow, Checks: map[fetch.Outcome]int64{}}
		}
		r.Checks[a.Outcome] += a.Checks
		recent[a.Platform] = r
	}
	for _, p := range platforms {
		r, ok := recent[p.Name]
		if !ok {
			r = Recent{Window: RecentWindow, Checks: map[fetch.Outcome]int64{}}
		}
		pp := Platform{Platform: p, Pace: pace[p.Name], Cooldown: cooldown[p.Name], Counts: count[p.Name], Recent: r, Keys: keys[p.Name]}
		pp.State = Conditions(p, pp.Pace, pp.Cooldown, r, inFlight[p.Name])
		pp.Use = UsageOf(pp.Pace, r, inFlight[p.Name])
		rep.Platforms = append(rep.Platforms, pp)
	}
	return rep, nil
}
