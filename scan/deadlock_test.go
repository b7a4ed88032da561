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
	deadlock := &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	other := &pgconn.PgError{Code: "42P01"}
	for _, c := range []struct {
		name string
		errs []error // what the calls return in turn (the last, every call after): nil is 7
		// want: the result, its error, and after how many calls
		n     int
		err   error
		calls int
	}{
		{"two deadlocks then success", []error{deadlock, deadlock, nil}, 7, nil, 3},
		{"deadlocks every time", []error{deadlock}, 0, deadlock, scan.DeadlockAttempts},
		{"another error", []error{other}, 0, other, 1},
	} {
		calls := 0
		n, err := scan.RetryDeadlock(context.Background(), func() (int, error) {
			err := c.errs[min(calls, len(c.errs)-1)]
			calls++
			if err != nil {
				return 0, err
			}
			return 7, nil
		})
		if n != c.n || !errors.Is(err, c.err) || calls != c.calls {
			t.Errorf("%s: %d %v after %d calls, want %d %v after %d", c.name, n, err, calls, c.n, c.err, c.calls)
		}
	}
}
