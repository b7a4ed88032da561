package sources

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/queue"
)

// Due is a source selected by the due query.
type Due struct {
	ID       int64
	Platform string
	URL      string
}

// DueOptions configures the due query.
type DueOptions struct {
	// Limit is the most sources returned overall. Default: 1000.
	Limit int
	// Caps is each platform's cap; a platform missing from Caps gets
	// DefaultCap, and a cap ≤ 0 leaves the platform out.
	Caps map[string]int
	// DefaultCap is the cap of platforms not in Caps. Default: Limit.
	DefaultCap int
}

// SelectDue returns due sources in fair order: never checked first, then
// longest since checked, ties by id. It leaves out disabled sources, sources
// already queued and platforms cooling down, and caps every platform in SQL
// before the overall limit, so one platform with a huge backlog cannot fill
// the result and starve the others.
func SelectDue(ctx context.Context, db Beginner, opts DueOptions) ([]Due, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("due: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	args, err := dueArgs(ctx, tx, opts)
	if err != nil {
		return nil, err
	}
	return selectDue(ctx, tx, args)
}

// DueQuery is the due query with its per-platform caps worked out, ready to
// run (again) in the transaction it was prepared in.
type DueQuery struct{ args []any }

// PrepareDue works out the due query's arguments for opts in tx (and makes
// tx use the query's generic plan).
func PrepareDue(ctx context.Context, tx pgx.Tx, opts DueOptions) (*DueQuery, error) {
	args, err := dueArgs(ctx, tx, opts)
	if err != nil {
		return nil, err
	}
	return &DueQuery{args: args}, nil
}

// Run runs the due query: one statement.
func (q *DueQuery) Run(ctx context.Context, tx pgx.Tx) ([]Due, error) {
	return selectDue(ctx, tx, q.args)
}

// Beginner is a pool, a connection or a transaction (a savepoint then).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ExplainDue returns the plan of the due query with opts, as EXPLAIN
// (ANALYZE, BUFFERS) prints it (the query runs).
func ExplainDue(ctx context.Context, db DBTX, opts DueOptions) (string, error) {
	args, err := dueArgs(ctx, db, opts)
	if err != nil {
		return "", err
	}
	rows, err := db.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+dueSQL((len(args)-1)/2), args...)
	if err != nil {
		return "", fmt.Errorf("due: explain: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("due: explain: %w", err)
	}
	return strings.Join(lines, "\n"), nil
}

func dueArgs(ctx context.Context, db DBTX, opts DueOptions) ([]any, error) {
	if opts.Limit <= 0 {
		opts.Limit = 1000
	}
	if opts.DefaultCap == 0 {
		opts.DefaultCap = opts.Limit
	}
	names, err := platformNames(ctx, db)
	if err != nil {
		return nil, err
	}
	args := []any{opts.Limit}
	for _, name := range names {
		limit, ok := opts.Caps[name]
		if !ok {
			limit = opts.DefaultCap
		}
		if limit <= 0 {
			continue
		}
		args = append(args, name, min(limit, opts.Limit))
	}
	return args, nil
}

func selectDue(ctx context.Context, db DBTX, args []any) ([]Due, error) {
	arms := (len(args) - 1) / 2
	if arms == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, dueSQL(arms), args...)
	if err != nil {
		return nil, fmt.Errorf("due: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Due, error) {
		var d Due
		err := row.Scan(&d.ID, &d.Platform, &d.URL)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("due: %w", err)
	}
	return out, nil
}

// platformNames lists the platforms and, for the rest of the caller's
// transaction, makes PostgreSQL use a generic plan for the due query (see
// useGenericPlan).
func platformNames(ctx context.Context, db DBTX) ([]string, error) {
	rows, err := db.Query(ctx, platformNamesGenericSQL)
	if err != nil {
		return nil, fmt.Errorf("due: platforms: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("due: platforms: %w", err)
	}
	return names, nil
}

// TickConfig configures a scan tick. The zero value means defaults.
type TickConfig struct {
	// Limit is the most sources queued by one tick. Default: 1000.
	Limit int
	// PerPlatformCap is the most sources of one platform queued by one tick.
	// Default: Limit / 2 (so two platforms at least share every tick).
	PerPlatformCap int
	// LookAhead sizes each platform's share: rate × LookAhead minus what it
	// already has queued. There is no point queueing an hour of work for a
	// 7/s destination. Default: DefaultLookAhead.
	LookAhead time.Duration
}

// DefaultLookAhead is how much work a tick queues per platform, in time at
// its rate.
const DefaultLookAhead = 30 * time.Second

func (c *TickConfig) setDefaults() {
	if c.Limit <= 0 {
		c.Limit = 1000
	}
	if c.PerPlatformCap <= 0 {
		c.PerPlatformCap = max(1, c.Limit/2)
	}
	if c.LookAhead <= 0 {
		c.LookAhead = DefaultLookAhead
	}
}

// TickResult reports one scan tick.
type TickResult struct {
	// Skipped is true when another tick held the lock; nothing was done.
	Skipped     bool           `json:"skipped"`
	Enqueued    int            `json:"enqueued"`
	ByPlatform  map[string]int `json:"by_platform"`
	CoolingDown []string       `json:"cooling_down"` // platforms left out for an active cooldown
	Released    int            `json:"released"`     // sources released after their job ended without a check
}

// Tick runs one scan: select due sources and enqueue one fetch job each, all
// in one transaction. It takes a transaction-scoped advisory lock first; if
// another tick holds it, Tick returns at once with Skipped set.
func Tick(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, client *queue.Client, cfg TickConfig) (*TickResult, error) {
	cfg.setDefaults()
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("tick: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit

	var locked bool
	if err := tx.QueryRow(ctx, tryTickLockSQL, tickLockKey).Scan(&locked, new(string)); err != nil {
		return nil, fmt.Errorf("tick: lock: %w", err)
	}
	if !locked {
		return &TickResult{Skipped: true}, nil
	}
	res := &TickResult{ByPlatform: map[string]int{}}

	tag, err := tx.Exec(ctx, reconcileSQL)
	if err != nil {
		return nil, fmt.Errorf("tick: release finished: %w", err)
	}
	res.Released = int(tag.RowsAffected())

	args, cooling, err := plan(ctx, tx, cfg)
	if err != nil {
		return nil, err
	}
	res.CoolingDown = cooling
	due, err := selectDue(ctx, tx, args)
	if err != nil {
		return nil, fmt.Errorf("tick: %w", err)
	}
	queued, err := enqueueTx(ctx, tx, client, interleave(due))
	if err != nil {
		return nil, fmt.Errorf("tick: %w", err)
	}
	for _, q := range queued {
		res.ByPlatform[q.Platform]++
	}
	res.Enqueued = len(queued)
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("tick: commit: %w", err)
	}
	return res, nil
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
// down get nothing.
func plan(ctx context.Context, db DBTX, cfg TickConfig) (args []any, cooling []string, err error) {
	rows, err := db.Query(ctx, planSQL)
	if err != nil {
		return nil, nil, fmt.Errorf("tick: plan: %w", err)
	}
	defer rows.Close()
	args = []any{cfg.Limit}
	for rows.Next() {
		var (
			name   string
			rate   float64
			queued int64
			until  *time.Time
		)
		if err := rows.Scan(&name, &rate, &queued, &until); err != nil {
			return nil, nil, fmt.Errorf("tick: plan: %w", err)
		}
		if until != nil {
			cooling = append(cooling, name)
			continue
		}
		share := int64(math.Ceil(rate*cfg.LookAhead.Seconds())) - queued
		share = min(share, int64(cfg.PerPlatformCap), int64(cfg.Limit))
		if share > 0 {
			args = append(args, name, share)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("tick: plan: %w", err)
	}
	return args, cooling, nil
}

// Enqueue queues a fetch job for each given source that is enabled and not
// already queued, in one transaction; it returns the sources it queued.
func Enqueue(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, client *queue.Client, ids []int64) ([]queue.FetchArgs, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	queued, err := enqueueTx(ctx, tx, client, ids)
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueue: commit: %w", err)
	}
	return queued, nil
}

// EnqueuePlatform queues every enabled, unqueued source of a platform.
func EnqueuePlatform(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, client *queue.Client, platform string) ([]queue.FetchArgs, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := GetPlatform(ctx, tx, platform); err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	rows, err := tx.Query(ctx, platformSourceIDsSQL, platform)
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	queued, err := enqueueTx(ctx, tx, client, ids)
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueue: commit: %w", err)
	}
	return queued, nil
}

// enqueueTx claims the sources not queued yet (row locks make concurrent
// claims safe), inserts their jobs and marks them queued with their job ids,
// all in the caller's transaction.
func enqueueTx(ctx context.Context, tx pgx.Tx, client *queue.Client, ids []int64) ([]queue.FetchArgs, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, claimSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (queue.FetchArgs, error) {
		var a queue.FetchArgs
		err := row.Scan(&a.SourceID, &a.Platform, &a.URL, &a.ETag, &a.LastModified)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	// Insert jobs in the order given (fair order for a tick), so River, which
	// works jobs of equal priority by scheduled_at then id, runs them in it.
	pos := make(map[int64]int, len(ids))
	for i, id := range ids {
		if _, ok := pos[id]; !ok {
			pos[id] = i
		}
	}
	slices.SortFunc(claimed, func(a, b queue.FetchArgs) int { return cmp.Compare(pos[a.SourceID], pos[b.SourceID]) })
	jobIDs, err := queue.InsertFetches(ctx, client, tx, claimed)
	if err != nil {
		return nil, err
	}
	srcIDs := make([]int64, len(claimed))
	for i, c := range claimed {
		srcIDs[i] = c.SourceID
	}
	if _, err := tx.Exec(ctx, markQueuedSQL, srcIDs, jobIDs); err != nil {
		return nil, fmt.Errorf("mark queued: %w", err)
	}
	return claimed, nil
}
