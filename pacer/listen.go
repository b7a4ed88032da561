package pacer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The listener: one connection per process, LISTENing on NotifyChannel, so
// a slow-down reported by any process reaches every other within a
// notification's latency (milliseconds), without a round trip per request.
// It is started by the first reservation that reaches the database (a pacer
// that is never used holds no connection), closes after Config.ListenIdle
// without a reservation or a caller sleeping on a slot (an idle process
// holds no connection for it), and after a failure it is
// started again by a later successful round trip, at most once per
// Config.Latch — so an outage costs it no connection attempt of its own.
// Without it (Config.PollOnly, or while it is down) a process learns of a
// slow-down at its next reservation, which returns the platform's event
// sequence.

// Listen starts the listener now, if it does not run, and waits until it
// LISTENs (or ctx ends, or the connection fails). A process that is about
// to take work calls it first (the worker does, before River starts), so
// that a slow-down reported by another process in its first moments already
// reaches it; otherwise the first reservation starts the listener. With
// Config.PollOnly it does nothing.
func (p *Pacer) Listen(ctx context.Context) error {
	if p.cfg.PollOnly || p.listening.Load() {
		return nil
	}
	up, done := p.startListener(true)
	if up == nil {
		return errors.New("pacer: closing")
	}
	select {
	case <-up:
		return nil
	case <-done:
		return errors.New("pacer: the slow-down listener could not connect; reservations will catch up")
	case <-ctx.Done():
		return fmt.Errorf("pacer: listen: %w", ctx.Err())
	}
}

// maybeListen starts the listener if it is not running and may be tried.
func (p *Pacer) maybeListen() {
	if p.cfg.PollOnly || p.listening.Load() {
		return
	}
	p.startListener(false)
}

// startListener starts a listener run unless one runs (or the pacer
// closes, or — unless now — a failure was less than a latch period ago),
// and returns the current run's channels: up is closed once it LISTENs,
// done when it ends.
func (p *Pacer) startListener(now bool) (up, done chan struct{}) {
	at := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closing {
		return nil, nil
	}
	if p.listenRunning || (!now && at.Before(p.listenRetry)) {
		return p.listenUp, p.listenEnd
	}
	p.listenRunning = true
	p.listenUp, p.listenEnd = make(chan struct{}), make(chan struct{})
	p.listenDone.Add(1)
	go p.listen(p.listenUp, p.listenEnd)
	return p.listenUp, p.listenEnd
}

// listen runs one listener connection until it fails or the pacer closes.
func (p *Pacer) listen(up, end chan struct{}) {
	defer p.listenDone.Done()
	defer close(end)
	err := p.listenOnce(p.listenCtx, up)
	p.mu.Lock()
	p.listenRunning = false
	if err != nil { // a failure; closed while idle (nil), it may start again at once
		p.listenRetry = p.clock.Now().Add(p.cfg.Latch)
	}
	p.mu.Unlock()
	if err != nil && p.listenCtx.Err() == nil {
		p.log.Warn("pacer: slow-down listener stopped; reservations will catch up", "error", err)
	}
}

func (p *Pacer) listenOnce(ctx context.Context, up chan struct{}) error {
	cctx, cancel := context.WithTimeout(ctx, p.cfg.ConnectTimeout)
	conn, err := pgx.ConnectConfig(cctx, p.listenConfig)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
		return err
	}
	p.listening.Store(true)
	defer p.listening.Store(false)
	close(up)
	for {
		n, err := p.waitForNotification(ctx, conn)
		if errors.Is(err, errListenIdle) {
			p.log.Debug("pacer: slow-down listener closed while idle; the next reservation starts it again")
			return nil
		}
		if err != nil {
			return err
		}
		p.notifications.Add(1)
		if platform, ev, ok := parseEvent(n.Payload); ok {
			p.applyEvent(platform, ev)
		}
	}
}

// errListenIdle ends a listener that Config.ListenIdle found idle.
var errListenIdle = errors.New("pacer: listener idle")

// waitForNotification waits for the next notification on conn. With
// Config.ListenIdle it wakes every ListenIdle to see whether the process
// has been idle that long (no reservation, no caller sleeping on a slot):
// then it returns errListenIdle. A wait that times out leaves the
// connection usable (pgconn closes it only on other errors).
func (p *Pacer) waitForNotification(ctx context.Context, conn *pgx.Conn) (*pgconn.Notification, error) {
	if p.cfg.ListenIdle < 0 {
		return conn.WaitForNotification(ctx)
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, p.cfg.ListenIdle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err == nil || ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return n, err
		}
		if p.idleFor(p.cfg.ListenIdle) {
			return nil, errListenIdle
		}
	}
}

// idleFor reports whether this process has reserved nothing for d and no
// caller sleeps on a slot.
func (p *Pacer) idleFor(d time.Duration) bool {
	if p.clock.Now().Sub(time.Unix(0, p.lastUse.Load())) < d {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, st := range p.local {
		if len(st.waiters) > 0 {
			return false
		}
	}
	return true
}

// parseEvent reads a notification's payload:
// "platform|seq|at|interval|shift|horizon|hold" (a platform name cannot
// contain '|'; floats as PostgreSQL prints them, "Infinity" included).
func parseEvent(payload string) (string, event, bool) {
	f := strings.Split(payload, "|")
	if len(f) != 7 || f[0] == "" {
		return "", event{}, false
	}
	seq, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", event{}, false
	}
	var v [5]float64
	for i, s := range f[2:] {
		x, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(x) || x < 0 {
			return "", event{}, false
		}
		v[i] = x
	}
	return f[0], event{seq: seq, at: v[0], interval: v[1], shift: v[2], horizon: v[3], hold: v[4]}, true
}
