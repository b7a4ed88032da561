// Package scan turns due sources into River jobs: the scan tick selects due
// sources in fair order (never checked first, then longest since checked,
// ties by id), caps every platform at its share, lets a platform's keys
// take turns within it (each capped at its own share where the platform
// limits keys), leaves out platforms cooling down or paused, and queues
// one fetch job per source in the transaction that marks the source
// queued, so a source is never queued twice. It also queues sources by
// hand (`fleetpace enqueue`).
//
// The scan sits on top of the store (package sources: platforms, sources,
// cooldowns, checks) and the queue (package queue: River).
package scan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
)

// Defaults of Config.
const (
	// DefaultLimit is how many sources one tick queues at most.
	DefaultLimit = 1000
	// DefaultPerPlatformCap is how many sources of one platform a tick of
	// DefaultLimit queues at most: half of it, so two platforms at least
	// share every tick.
	DefaultPerPlatformCap = DefaultLimit / 2
	// DefaultLookAhead is how much work a tick queues per platform, in time
	// at its rate.
	DefaultLookAhead = 30 * time.Second
	// DefaultHistoryRetention is how long the fetch history is kept.
	DefaultHistoryRetention = 7 * 24 * time.Hour
)

// NoHistory, as Config.HistoryRetention, keeps no fetch history: every tick
// deletes what there is (and a worker with it writes none).
const NoHistory time.Duration = -1

// Bounds of Config. One tick is one transaction: MaxLimit jobs (or history
// rows deleted) is already a large one. A look-ahead past MaxLookAhead
// queues work long before it can run (and rate × look-ahead must fit an
// int64). MaxHistoryRetention is the longest interval of a source
// (sources.MaxInterval): every source has a check in a history kept that
// long.
const (
	MaxLimit            = 100_000
	MaxLookAhead        = time.Hour
	MaxHistoryRetention = sources.MaxInterval
)

// ErrInvalidConfig is wrapped by every error Config.Validate returns.
var ErrInvalidConfig = errors.New("invalid config")

// Config configures a scan tick. The zero value means defaults.
type Config struct {
	// Limit is the most sources queued by one tick. Default: DefaultLimit.
	Limit int
	// PerPlatformCap is the most sources of one platform queued by one tick.
	// Default: Limit / 2 (so two platforms at least share every tick).
	PerPlatformCap int
	// LookAhead sizes each platform's share: rate × LookAhead minus what it
	// already has queued. There is no point queueing an hour of work for a
	// 7/s destination. Default: DefaultLookAhead.
	LookAhead time.Duration
	// HistoryRetention is how long the fetch history (sources.History) is
	// kept: every tick deletes older rows, at most PruneBatch of them.
	// Default: DefaultHistoryRetention; NoHistory keeps none.
	HistoryRetention time.Duration
	// PruneBatch is the most history rows one tick deletes. Default
	// sources.DefaultPruneBatch.
	PruneBatch int
}

// Validate reports the first invalid field, wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	switch {
	case c.Limit < 0 || c.Limit > MaxLimit:
		return fmt.Errorf("%w: scan.Config.Limit must be in [1, %d] (0: default), got %d", ErrInvalidConfig, MaxLimit, c.Limit)
	case c.PerPlatformCap < 0 || c.PerPlatformCap > MaxLimit:
		return fmt.Errorf("%w: scan.Config.PerPlatformCap must be in [1, %d] (0: default), got %d", ErrInvalidConfig, MaxLimit, c.PerPlatformCap)
	case c.LookAhead < 0 || c.LookAhead > MaxLookAhead:
		return fmt.Errorf("%w: scan.Config.LookAhead must be in (0, %s] (0: default), got %s", ErrInvalidConfig, MaxLookAhead, c.LookAhead)
	case (c.HistoryRetention < 0 && c.HistoryRetention != NoHistory) || c.HistoryRetention > MaxHistoryRetention:
		return fmt.Errorf("%w: scan.Config.HistoryRetention must be in (0, %s] (0: default; NoHistory: keep none), got %s", ErrInvalidConfig, MaxHistoryRetention, c.HistoryRetention)
	case c.PruneBatch < 0 || c.PruneBatch > MaxLimit:
		return fmt.Errorf("%w: scan.Config.PruneBatch must be in [1, %d] (0: default), got %d", ErrInvalidConfig, MaxLimit, c.PruneBatch)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Limit == 0 {
		c.Limit = DefaultLimit
	}
	if c.PerPlatformCap == 0 {
		c.PerPlatformCap = max(1, c.Limit/2)
	}
	if c.LookAhead == 0 {
		c.LookAhead = DefaultLookAhead
	}
	if c.HistoryRetention == 0 {
		c.HistoryRetention = DefaultHistoryRetention
	}
	if c.PruneBatch == 0 {
		c.PruneBatch = sources.DefaultPruneBatch
	}
	return c
}

// Retention is the history retention c keeps: 0 for NoHistory.
func (c Config) Retention() time.Duration {
	c = c.withDefaults()
	return max(c.HistoryRetention, 0)
}

// Result reports one scan tick.
type Result struct {
	// Skipped is true when another tick held the lock; nothing was done.
	Skipped     bool           `json:"skipped"`
	Enqueued    int            `json:"enqueued"`
	ByPlatform  map[string]int `json:"by_platform"`
	CoolingDown []string       `json:"cooling_down"` // platforms left out for an active cooldown
	Paused      []string       `json:"paused"`       // platforms left out because an operator paused them
	Released    int            `json:"released"`     // sources released after their job ended without a check
	// Saturated: the tick filled its Limit, or a platform got its whole
	// PerPlatformCap while its rate allowed more; another tick now would
	// queue more. A scan loop runs the next one at once.
	Saturated bool  `json:"saturated"`
	Pruned    int64 `json:"pruned"` // fetch history rows deleted beyond the retention
	// KeysPruned is how many idle keys' pace rows the tick removed.
	KeysPruned int64 `json:"keys_pruned"`
}

// Tick runs one scan: select due sources and enqueue one fetch job each, all
// in one transaction. It takes a transaction-scoped advisory lock first; if
// another tick holds it, Tick returns at once with Skipped set. Before it
// commits, it brings up to date the heads of the keys it queued from (the
// due query's refresh), so the next due query finds them fresh and
// refreshes only what others changed since (checks, mostly). After the
// commit, the tick that ran prunes the fetch history beyond the retention
// (a statement of its own, so the jobs are not held back by it; a failed
// prune is an error, but the tick's jobs are queued).
//
// A transaction or a prune the server aborted to break a deadlock
// (SQLSTATE 40P01) runs again at once, up to DeadlockAttempts times in all:
// a lock cycle with another process is not an outage worth the scan loop's
// back-off.
func Tick(ctx context.Context, db DB, client *queue.Client, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	res, err := retryDeadlock(ctx, func() (*Result, error) { return tick(ctx, db, client, cfg) })
	if err != nil || res.Skipped {
		return res, err
	}
	res.Pruned, err = retryDeadlock(ctx, func() (int64, error) {
		return sources.PruneHistory(ctx, db, cfg.Retention(), cfg.PruneBatch)
	})
	if err != nil {
		return res, fmt.Errorf("tick: %w", err)
	}
	res.KeysPruned, err = retryDeadlock(ctx, func() (int64, error) {
		return pacer.PruneKeys(ctx, db, pacer.DefaultKeyIdle, cfg.PruneBatch)
	})
	if err != nil {
		return res, fmt.Errorf("tick: %w", err)
	}
	return res, nil
}

// DeadlockAttempts is how many times Tick runs its transaction, or its
// prune, when the server keeps aborting it to break a deadlock.
const DeadlockAttempts = 5

// retryDeadlock runs fn until it returns something other than a deadlock,
// at most DeadlockAttempts times.
func retryDeadlock[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := fn()
		if err == nil || !dbconn.IsDeadlock(err) || attempt == DeadlockAttempts || ctx.Err() != nil {
			return v, err
		}
	}
}

// tick is one attempt at Tick's transaction.
func tick(ctx context.Context, db DB, client *queue.Client, cfg Config) (*Result, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("tick: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	var locked bool
	if err := tx.QueryRow(ctx, tryTickLockSQL, tickLockKey).Scan(&locked, nil, nil); err != nil {
		return nil, fmt.Errorf("tick: lock: %w", err)
	}
	if !locked {
		return &Result{Skipped: true}, nil
	}
	res := &Result{ByPlatform: map[string]int{}}

	tag, err := tx.Exec(ctx, reconcileSQL)
	if err != nil {
		return nil, fmt.Errorf("tick: release finished: %w", err)
	}
	res.Released = int(tag.RowsAffected())

	args, capped, err := plan(ctx, tx, cfg, res)
	if err != nil {
		return nil, err
	}
	if afterPlan != nil {
		afterPlan()
	}
	due, err := selectDue(ctx, tx, args, &DueStats{})
	if err != nil {
		return nil, fmt.Errorf("tick: %w", err)
	}
	queued, err := enqueueTx(ctx, tx, client, interleave(due), true)
	if err != nil {
		return nil, fmt.Errorf("tick: %w", err)
	}
	if len(queued) > 0 {
		// The heads of the keys just queued from have left: bring them up
		// to date now, in this transaction (the tick lock is held), rather
		// than leave them to the next due query.
		if err := refresh(ctx, tx); err != nil {
			return nil, fmt.Errorf("tick: %w", err)
		}
	}
	for _, q := range queued {
		res.ByPlatform[q.Platform]++
	}
	res.Enqueued = len(queued)
	res.Saturated = res.Enqueued >= cfg.Limit
	for name, limit := range capped {
		res.Saturated = res.Saturated || res.ByPlatform[name] >= limit
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("tick: commit: %w", err)
	}
	return res, nil
}

// afterPlan, when set (by the tests), runs between a tick's plan and its
// due query: where another transaction's commit falls between the two.
var afterPlan func()

// DB is what Tick needs: a pool (or a connection, or a transaction, which
// makes the tick a savepoint).
type DB interface {
	sources.Beginner
	sources.DBTX
}

// interleave returns the ids of due (in fair order) so that platforms take
// turns: the first source of every platform, then the second of every
// platform, and so on, each round in fair order. Jobs are inserted and run
// in this order, so a platform with a large backlog cannot take every worker
// slot (its jobs sleeping on the pacer) while other platforms wait.
func interleave(due []Due) []int64 {
	type ranked struct {
		id         int64
		round, pos int
	}
	seen := map[string]int{}
	rs := make([]ranked, len(due))
	for i, d := range due {
		rs[i] = ranked{d.ID, seen[d.Platform], i}
		seen[d.Platform]++
	}
	slices.SortStableFunc(rs, func(a, b ranked) int {
		return cmp.Or(cmp.Compare(a.round, b.round), cmp.Compare(a.pos, b.pos))
	})
	ids := make([]int64, len(rs))
	for i, r := range rs {
		ids[i] = r.id
	}
	return ids
}

// plan sizes every platform's share of this tick: ceil(rate × look-ahead)
// minus what it already has queued, at most PerPlatformCap; platforms cooling
// down or paused get nothing (they are noted in res). On a platform that
// limits keys (a per-key rate, or a key's own), every key's share is sized
// the same way from its rate and its queued sources: a key that can only
// run at its rate gets no more than its look-ahead's worth queued. It
// returns the due query's arguments, and the platforms whose share
// PerPlatformCap or Limit cut (with their cap).
func plan(ctx context.Context, db sources.DBTX, cfg Config, res *Result) (args dueArgs, capped map[string]int, err error) {
	share := func(rate float64, queued int64) int64 {
		return int64(math.Ceil(rate*cfg.LookAhead.Seconds())) - queued
	}
	rows, err := db.Query(ctx, planSQL)
	if err != nil {
		return args, nil, fmt.Errorf("tick: plan: %w", err)
	}
	defer rows.Close()
	args = newDueArgs(cfg.Limit)
	capped = map[string]int{}
	for rows.Next() {
		var (
			name            string
			rate, keyRate   float64
			queued          int64
			cooling, paused bool
		)
		if err := rows.Scan(&name, &rate, &queued, &cooling, &paused, &keyRate); err != nil {
			return args, nil, fmt.Errorf("tick: plan: %w", err)
		}
		switch {
		case cooling:
			res.CoolingDown = append(res.CoolingDown, name)
			args.add(name, 0)
			continue
		case paused:
			res.Paused = append(res.Paused, name)
			args.add(name, 0)
			continue
		}
		s := share(rate, queued)
		limit := int(min(s, int64(cfg.PerPlatformCap), int64(cfg.Limit)))
		if s > int64(limit) {
			capped[name] = limit
		}
		args.add(name, limit)
		if keyRate > 0 {
			args.keyCap[name] = int(min(share(keyRate, 0), int64(cfg.Limit)))
		}
	}
	if err := rows.Err(); err != nil {
		return args, nil, fmt.Errorf("tick: plan: %w", err)
	}
	rows.Close()
	if rows, err = db.Query(ctx, keyPlanSQL); err != nil {
		return args, nil, fmt.Errorf("tick: plan keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			key    KeyRef
			rate   float64
			queued int64
		)
		if err := rows.Scan(&key.Platform, &key.Key, &rate, &queued); err != nil {
			return args, nil, fmt.Errorf("tick: plan keys: %w", err)
		}
		if rate > 0 && args.caps[key.Platform] > 0 {
			args.keys[key] = int(max(min(share(rate, queued), int64(cfg.Limit)), -1))
		}
	}
	if err := rows.Err(); err != nil {
		return args, nil, fmt.Errorf("tick: plan keys: %w", err)
	}
	return args, capped, nil
}
