package pacer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Keyed reservations of one platform go out together. Each locks the
// platform's pace row (reserveKeySQL), so a process whose callers reserved
// keys at the same time, one statement each, had them wait in that row's
// lock queue for each other's statements and commits: at 150 callers in 3
// processes a statement waited 35 ms and the fleet booked about 200
// reservations a second. Gathered, up to Config.MaxKeyBatch of them are
// sent in one round trip and run in one transaction (a pipeline of
// statements up to one Sync, which PostgreSQL runs as one implicit
// transaction): the row is locked once. Each is still reserveKeySQL with
// its own arguments, run in the order asked, so the slots are those the
// reservations made one at a time in that order would have got, and the
// ceiling's guarantees are the statement's.
//
// A batch is sent by a goroutine of its own (drainKeys) while callers wait
// for their row; the next batch gathers what arrived meanwhile, as a group
// commit does. A caller whose context ends before its statement is sent is
// left out; once sent, it waits for the answer, as a single statement does
// (queryRow).

// errKeyBatch is a batch's failure that is not an outage (a deadlock
// detected, a statement's error): the transaction rolled back, so nothing
// of the batch was booked, and each caller reserves again alone.
var errKeyBatch = errors.New("pacer: keyed reservation batch failed")

// keyQueue is one platform's keyed reservations waiting to go out.
type keyQueue struct {
	pending []*keyRequest
	running bool // a drainKeys goroutine sends them
}

// keyRequest is one caller's reservation statement.
type keyRequest struct {
	args []any
	dest []any // the caller's variables; written only while it waits

	sent      bool // in a batch (keyMu)
	abandoned bool // the caller left before it was sent (keyMu)

	trip trip
	err  error
	done chan struct{} // closed when trip and err (and dest) are set
}

// reserveKeyRow runs reserveKeySQL with args, into dest, in a batch with
// the platform's other keyed reservations of this process. It returns the
// round trip of the batch.
func (p *Pacer) reserveKeyRow(ctx context.Context, platform string, args, dest []any) (trip, error) {
	if p.cfg.MaxKeyBatch <= 1 {
		return p.reserveKeyAlone(ctx, args, dest)
	}
	r := &keyRequest{args: args, dest: dest, done: make(chan struct{})}
	p.keyMu.Lock()
	q := p.keyQueues[platform]
	if q == nil {
		q = &keyQueue{}
		p.keyQueues[platform] = q
	}
	q.pending = append(q.pending, r)
	start := !q.running
	q.running = true
	if start {
		p.keyDrain.Add(1)
	}
	p.keyMu.Unlock()
	if start {
		go p.drainKeys(platform, q)
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		p.keyMu.Lock()
		if !r.sent {
			r.abandoned = true
			p.keyMu.Unlock()
			return trip{}, ctx.Err()
		}
		p.keyMu.Unlock()
		<-r.done // sent: its slot may be booked; the answer says
	}
	if errors.Is(r.err, errKeyBatch) {
		return p.reserveKeyAlone(ctx, args, dest)
	}
	return r.trip, r.err
}

// reserveKeyAlone runs reserveKeySQL as a statement and transaction of its
// own.
func (p *Pacer) reserveKeyAlone(ctx context.Context, args, dest []any) (trip, error) {
	p.keyStatements.Add(1)
	p.keyBatches.Add(1)
	return p.queryRow(ctx, reserveKeySQL, args, dest...)
}

// drainKeys sends platform's queued keyed reservations, a batch at a time,
// until none is left.
func (p *Pacer) drainKeys(platform string, q *keyQueue) {
	defer p.keyDrain.Done()
	for {
		p.keyMu.Lock()
		var batch []*keyRequest
		for len(q.pending) > 0 && len(batch) < p.cfg.MaxKeyBatch {
			r := q.pending[0]
			q.pending[0] = nil
			q.pending = q.pending[1:]
			if r.abandoned {
				continue
			}
			r.sent = true
			batch = append(batch, r)
		}
		if len(batch) == 0 {
			q.running = false
			q.pending = nil
			if p.keyQueues[platform] == q {
				delete(p.keyQueues, platform)
			}
			p.keyMu.Unlock()
			return
		}
		p.keyMu.Unlock()
		p.sendKeyBatch(batch)
		if p.batchAnswered != nil {
			p.batchAnswered()
		}
		for _, r := range batch {
			close(r.done)
		}
	}
}

// sendKeyBatch runs the batch's statements in one round trip and one
// transaction, setting each request's answer.
func (p *Pacer) sendKeyBatch(batch []*keyRequest) {
	p.keyStatements.Add(uint64(len(batch)))
	p.keyBatches.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StatementTimeout)
	defer cancel()
	if len(batch) == 1 {
		r := batch[0]
		r.trip, r.err = p.queryRow(ctx, reserveKeySQL, r.args, r.dest...)
		return
	}
	fail := func(err error) {
		for _, r := range batch {
			r.err = err
		}
	}
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		fail(err)
		return
	}
	defer c.Release()
	nc := c.Conn().PgConn().Conn()
	tr := p.startTrip()
	if err := nc.SetDeadline(time.Now().Add(p.cfg.StatementTimeout)); err != nil {
		fail(err)
		return
	}
	b := &pgx.Batch{}
	for _, r := range batch {
		b.Queue(reserveKeySQL, r.args...)
	}
	br := c.SendBatch(context.Background(), b)
	var failed error
	for _, r := range batch {
		r.err = br.QueryRow().Scan(r.dest...)
		if r.err != nil && !errors.Is(r.err, pgx.ErrNoRows) && failed == nil {
			failed = r.err
		}
	}
	if err := br.Close(); err != nil && failed == nil {
		failed = err // the commit
	}
	tr.end(p.clock)
	_ = nc.SetDeadline(time.Time{}) // a closed connection's error does not matter
	switch {
	case failed != nil && unreachable(failed):
		fail(failed)
	case failed != nil:
		// Rolled back: nothing of the batch was booked, the rows that
		// came back included.
		fail(fmt.Errorf("%w: %w", errKeyBatch, failed))
	default:
		for _, r := range batch {
			r.trip = tr
		}
	}
}
