package scan

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sources"
)

// Enqueue queues a fetch job for each given source that is enabled and not
// already queued, in one transaction; it returns the sources it queued. An
// id that names no source is bad input, as in sources.RemoveSources: nothing
// is queued, and the error (a *sources.FieldError wrapping
// sources.ErrNotFound and sources.ErrInvalid) names every such id.
func Enqueue(ctx context.Context, db sources.Beginner, client *queue.Client, ids []int64) ([]queue.FetchArgs, error) {
	return inTx(ctx, db, func(tx pgx.Tx) ([]queue.FetchArgs, error) {
		if err := sources.RequireSources(ctx, tx, ids, "nothing queued"); err != nil {
			return nil, err
		}
		return enqueueTx(ctx, tx, client, ids, false)
	})
}

// EnqueuePlatform queues every enabled, unqueued source of a platform. An
// unknown platform is an error wrapping sources.ErrNotFound.
func EnqueuePlatform(ctx context.Context, db sources.Beginner, client *queue.Client, platform string) ([]queue.FetchArgs, error) {
	return inTx(ctx, db, func(tx pgx.Tx) ([]queue.FetchArgs, error) {
		return EnqueuePlatformTx(ctx, tx, client, platform)
	})
}

// EnqueueTx is Enqueue's work in the caller's transaction, the ids known
// to exist: it queues those enabled and not queued yet.
func EnqueueTx(ctx context.Context, tx pgx.Tx, client *queue.Client, ids []int64) ([]queue.FetchArgs, error) {
	queued, err := enqueueTx(ctx, tx, client, ids, false)
	if err != nil {
		return nil, fmt.Errorf("enqueue: %w", err)
	}
	return queued, nil
}

// EnqueuePlatformTx is EnqueuePlatform in the caller's transaction.
func EnqueuePlatformTx(ctx context.Context, tx pgx.Tx, client *queue.Client, platform string) ([]queue.FetchArgs, error) {
	if _, err := sources.GetPlatform(ctx, tx, platform); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, platformSourceIDsSQL, platform)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	return enqueueTx(ctx, tx, client, ids, false)
}

// inTx runs fn in a transaction of its own and commits it.
func inTx(ctx context.Context, db sources.Beginner, fn func(pgx.Tx) ([]queue.FetchArgs, error)) ([]queue.FetchArgs, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	queued, err := fn(tx)
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
// all in the caller's transaction. With leaveStopped (a tick), it also
// leaves out sources whose platform is stopped (cooling down or paused) as
// the claim's statement sees it: see claimSQL.
func enqueueTx(ctx context.Context, tx pgx.Tx, client *queue.Client, ids []int64, leaveStopped bool) ([]queue.FetchArgs, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := tx.Query(ctx, claimSQL, ids, leaveStopped)
	if err != nil {
		return nil, fmt.Errorf("claim: %w", err)
	}
	claimed, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (queue.FetchArgs, error) {
		var a queue.FetchArgs
		err := row.Scan(&a.SourceID, &a.Platform, &a.Key, &a.URL, &a.ETag, &a.LastModified)
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
	jobIDs, err := queue.InsertFetches(ctx, client, tx, jobArgs(claimed))
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

// jobArgs returns the args the jobs are inserted with: claimed, except that
// a source whose URL carries a secret (credentials, or a secret-looking
// query parameter: redact.URL changes it) is queued by id alone. Job args
// are not a secret store — River UI shows them to anyone who can reach it,
// and River keeps finished jobs for a day — so such a URL stays in the
// sources table and the job loads it when it runs (one read).
func jobArgs(claimed []queue.FetchArgs) []queue.FetchArgs {
	args := make([]queue.FetchArgs, len(claimed))
	for i, a := range claimed {
		if redact.URL(a.URL) != a.URL {
			a = queue.FetchArgs{SourceID: a.SourceID, Platform: a.Platform, Key: a.Key}
		}
		args[i] = a
	}
	return args
}
