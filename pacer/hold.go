package pacer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs a statement: a pool, a connection or a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Hold holds platform fleet-wide until at least until: every reservation
// before then, in any process, is denied with a wait that ends at until (a
// fetch job snoozes until then). A later hold already in place stays. It is
// one statement on the platform's pace row, so it runs in the caller's
// transaction when db is one: package sources holds the pacer in the
// transaction that writes a platform's cooldown. A platform without a pace
// row is left alone.
func Hold(ctx context.Context, db Execer, platform string, until time.Time) error {
	if _, err := db.Exec(ctx, holdSQL, platform, until); err != nil {
		return fmt.Errorf("pacer: hold %s: %w", platform, err)
	}
	return nil
}

// holdSQL raises a platform's hold_until to $2, converted to the pacer's
// epoch seconds by the database.
const holdSQL = `
UPDATE fleetpace_pace SET hold_until = GREATEST(hold_until, date_part('epoch', $2::timestamptz))
WHERE platform = $1`
