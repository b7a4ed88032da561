package scan

import (
	"context"
	"fmt"

	"github.com/fleetpace/fleetpace/sources"
)

// SelectDue runs the due query with opts in a read transaction of its own:
// the due query alone, for the tests.
func SelectDue(ctx context.Context, db sources.Beginner, opts DueOptions) ([]Due, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("due: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	q, err := PrepareDue(ctx, tx, opts)
	if err != nil {
		return nil, err
	}
	return q.Run(ctx, tx)
}

// RetryDeadlock is retryDeadlock, for the tests.
func RetryDeadlock(ctx context.Context, fn func() (int, error)) (int, error) {
	return retryDeadlock(ctx, fn)
}

// SetAfterPlan sets the hook a tick runs between its plan and its due
// query, for the tests; the cleanup of t removes it.
func SetAfterPlan(t interface{ Cleanup(func()) }, fn func()) {
	afterPlan = fn
	t.Cleanup(func() { afterPlan = nil })
}
