package scan_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleetpace/fleetpace/scan"
)

// A tick or a prune the server aborted to break a deadlock runs again at
// once, up to scan.DeadlockAttempts times; any other error is returned at
// the first attempt.
func TestDeadlockRunsAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	deadlock := &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	calls := 0
	n, err := scan.RetryDeadlock(ctx, func() (int, error) {
		if calls++; calls < 3 {
			return 0, deadlock
		}
		return 7, nil
	})
	if err != nil || n != 7 || calls != 3 {
		t.Fatalf("two deadlocks then success: %d %v after %d calls, want 7 after 3", n, err, calls)
	}
	calls = 0
	_, err = scan.RetryDeadlock(ctx, func() (int, error) { calls++; return 0, deadlock })
	if !errors.Is(err, deadlock) || calls != scan.DeadlockAttempts {
		t.Fatalf("deadlocks every time: %v after %d calls, want the deadlock after %d", err, calls, scan.DeadlockAttempts)
	}
	calls = 0
	other := &pgconn.PgError{Code: "42P01"}
	if _, err = scan.RetryDeadlock(ctx, func() (int, error) { calls++; return 0, other }); !errors.Is(err, other) || calls != 1 {
		t.Fatalf("another error: %v after %d calls, want it after 1", err, calls)
	}
}
