// Package fleet keeps the roster of worker processes, the table
// fleetpace_worker, and is the only package that reads or writes it. Every
// worker upserts its row every few seconds (Beat); the rows seen within
// LiveWindow are the fleet. Its size is what the pacer divides a platform's
// rate by while the database is unreachable, and `fleetpace status` lists
// its members.
package fleet

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleetpace/fleetpace/internal/buildinfo"
)

// LiveWindow is how recently a worker must have sent a heartbeat to count as
// live.
const LiveWindow = 15 * time.Second

// PruneAfter is how long a worker's row outlives its last heartbeat (a
// worker killed without leaving) before Prune deletes it.
const PruneAfter = time.Hour

// DBTX is a pool, a connection or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Worker is one worker process of the fleet.
type Worker struct {
	ID        string    `json:"id"`
	Hostname  string    `json:"hostname"`
	PID       int       `json:"pid"`
	Version   string    `json:"version"` // fleetpace's module version, "dev" if unknown
	StartedAt time.Time `json:"started_at"`
	SeenAt    time.Time `json:"seen_at"` // last heartbeat
	// InFlight is, per platform, how many fetches the worker had sent and
	// not yet got an answer for at its last heartbeat (platforms with none
	// left out).
	InFlight map[string]int `json:"in_flight,omitempty"`
}

// Self is this process as the worker id: its host name, process id and
// fleetpace version (the times are the database's, set by Beat).
func Self(id string) Worker {
	host, _ := os.Hostname()
	return Worker{ID: id, Hostname: host, PID: os.Getpid(), Version: buildinfo.Version()}
}

// Beat records that w is alive now, with its fetches in flight
// (Worker.InFlight), inserting its row on the first beat, and returns the
// number of live workers, w included.
func Beat(ctx context.Context, db DBTX, w Worker) (live int, err error) {
	inFlight := w.InFlight
	if inFlight == nil {
		inFlight = map[string]int{}
	}
	if err := db.QueryRow(ctx, beatSQL, w.ID, w.Hostname, w.PID, w.Version, LiveWindow.Seconds(), inFlight).Scan(&live); err != nil {
		return 0, fmt.Errorf("fleet: heartbeat: %w", err)
	}
	return live, nil
}

// Live lists the live workers, longest running first.
func Live(ctx context.Context, db DBTX) ([]Worker, error) {
	rows, err := db.Query(ctx, liveSQL, LiveWindow.Seconds())
	if err != nil {
		return nil, fmt.Errorf("fleet: live workers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Worker, error) {
		var w Worker
		err := row.Scan(&w.ID, &w.Hostname, &w.PID, &w.Version, &w.StartedAt, &w.SeenAt, &w.InFlight)
		if len(w.InFlight) == 0 {
			w.InFlight = nil
		}
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: live workers: %w", err)
	}
	return out, nil
}

// Leave deletes the worker's row, so a worker that stops leaves the fleet at
// once instead of after LiveWindow.
func Leave(ctx context.Context, db DBTX, id string) error {
	if _, err := db.Exec(ctx, leaveSQL, id); err != nil {
		return fmt.Errorf("fleet: leave: %w", err)
	}
	return nil
}

// Prune deletes the rows of workers not seen for PruneAfter.
func Prune(ctx context.Context, db DBTX) error {
	if _, err := db.Exec(ctx, pruneSQL, PruneAfter.Seconds()); err != nil {
		return fmt.Errorf("fleet: prune: %w", err)
	}
	return nil
}

// beatSQL upserts the worker's row and counts the live workers in one round
// trip. The statement does not see its own upsert, so it counts the others
// and adds one.
const beatSQL = `
WITH up AS (
    INSERT INTO fleetpace_worker (id, hostname, pid, version, in_flight) VALUES ($1, $2, $3, $4, $6)
    ON CONFLICT (id) DO UPDATE SET seen_at = now(), in_flight = EXCLUDED.in_flight
)
SELECT count(*) + 1 FROM fleetpace_worker
WHERE seen_at > now() - make_interval(secs => $5) AND id <> $1`

const liveSQL = `
SELECT id, hostname, pid, version, started_at, seen_at, in_flight FROM fleetpace_worker
WHERE seen_at > now() - make_interval(secs => $1)
ORDER BY started_at, id`

const leaveSQL = `DELETE FROM fleetpace_worker WHERE id = $1`

const pruneSQL = `DELETE FROM fleetpace_worker WHERE seen_at < now() - make_interval(secs => $1)`
