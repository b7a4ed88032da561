package pacer

import (
	"context"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The listener: one connection per process, LISTENing on NotifyChannel, so
// a slow-down reported by any process reaches every other within a
// notification's latency (milliseconds), without a round trip per request.
// It is started by the first reservation that reaches the database (a pacer
// that is never used holds no connection), and after a failure it is
// started again by a later successful round trip, at most once per
// Config.Latch — so an outage costs it no connection attempt of its own.
// Without it (Config.PollOnly, or while it is down) a process learns of a
// slow-down at its next reservation, which returns the platform's event
// sequence.

// maybeListen starts the listener if it is not running and may be tried.
func (p *Pacer) maybeListen() {
	if p.cfg.PollOnly || p.listening.Load() {
		return
	}
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.listenRunning || p.closing || now.Before(p.listenRetry) {
		return
	}
	p.listenRunning = true
	p.listenDone.Add(1)
	go p.listen()
}

// listen runs one listener connection until it fails or the pacer closes.
func (p *Pacer) listen() {
	defer p.listenDone.Done()
	err := p.listenOnce(p.listenCtx)
	p.mu.Lock()
	p.listenRunning = false
	p.listenRetry = p.clock.Now().Add(p.cfg.Latch)
	p.mu.Unlock()
	if err != nil && p.listenCtx.Err() == nil {
		p.log.Warn("pacer: slow-down listener stopped; reservations will catch up", "error", err)
	}
}

func (p *Pacer) listenOnce(ctx context.Context) error {
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
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		p.notifications.Add(1)
		if platform, ev, ok := parseEvent(n.Payload); ok {
			p.applyEvent(platform, ev)
		}
	}
}

// parseEvent reads a notification's payload:
// "platform|seq|at|interval|shift|hold" (a platform name cannot contain '|';
// floats as PostgreSQL prints them, "Infinity" included).
func parseEvent(payload string) (string, event, bool) {
	f := strings.Split(payload, "|")
	if len(f) != 6 || f[0] == "" {
		return "", event{}, false
	}
	seq, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", event{}, false
	}
	var v [4]float64
	for i, s := range f[2:] {
		x, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(x) || x < 0 {
			return "", event{}, false
		}
		v[i] = x
	}
	return f[0], event{seq: seq, at: v[0], interval: v[1], shift: v[2], hold: v[3]}, true
}
