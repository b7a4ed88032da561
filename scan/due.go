package scan

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/sources"
)

// Due is a source selected by the due query.
type Due struct {
	ID       int64
	Platform string
	URL      string
}

// DueOptions sets the caps of a DueQuery.
type DueOptions struct {
	// Limit is the most sources returned overall. Default: DefaultLimit.
	Limit int
	// Caps is each platform's cap; a platform missing from Caps gets
	// DefaultCap, and a cap ≤ 0 leaves the platform out.
	Caps map[string]int
	// DefaultCap is the cap of platforms not in Caps. Default: Limit.
	DefaultCap int
}

// DueQuery is the tick's due query on its own, with caps given instead of
// worked out from the platforms' rates. It exists for `fleetpace bench
// scan`, which times and explains this one statement apart from the rest of
// a tick (a tick runs the same statement, built by the same code); nothing
// in the worker uses it.
type DueQuery struct{ args []any }

// PrepareDue works out the due query's arguments for opts in tx (and makes
// tx use the query's generic plan, as a tick does).
func PrepareDue(ctx context.Context, tx pgx.Tx, opts DueOptions) (*DueQuery, error) {
	args, err := dueArgs(ctx, tx, opts)
	if err != nil {
		return nil, err
	}
	return &DueQuery{args: args}, nil
}

// Run runs the due query in the transaction it was prepared in: one
// statement. It returns due sources in fair order: never checked first, then
// longest since checked, ties by id; disabled sources, sources already
// queued and platforms cooling down are left out, and every platform is
// capped in SQL before the overall limit, so one platform with a huge
// backlog cannot fill the result and starve the others.
func (q *DueQuery) Run(ctx context.Context, tx pgx.Tx) ([]Due, error) {
	return selectDue(ctx, tx, q.args)
}

// Explain returns the plan of the due query as EXPLAIN (ANALYZE, BUFFERS)
// prints it (the query runs).
func (q *DueQuery) Explain(ctx context.Context, tx pgx.Tx) (string, error) {
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+dueSQL(arms(q.args)), q.args...)
	if err != nil {
		return "", fmt.Errorf("due: explain: %w", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("due: explain: %w", err)
	}
	return strings.Join(lines, "\n"), nil
}

func dueArgs(ctx context.Context, db sources.DBTX, opts DueOptions) ([]any, error) {
	if opts.Limit <= 0 {
		opts.Limit = DefaultLimit
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

// arms is the number of platforms (arms of the due query) in args.
func arms(args []any) int { return (len(args) - 1) / 2 }

func selectDue(ctx context.Context, db sources.DBTX, args []any) ([]Due, error) {
	if arms(args) == 0 {
		return nil, nil
	}
	rows, err := db.Query(ctx, dueSQL(arms(args)), args...)
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
func platformNames(ctx context.Context, db sources.DBTX) ([]string, error) {
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
