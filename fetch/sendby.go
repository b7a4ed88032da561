package fetch

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// ErrLate is the error of a fetch that sent nothing because its request
// would have left after Request.SendBy (Result.Err wraps it; the Outcome is
// Failed, and the caller decides: the worker reserves a new slot).
var ErrLate = errors.New("fetch: the request would have left after its SendBy; nothing was sent")

// sendGate is the SendBy check of one fetch: the connection the request
// is written to refuses the write when it comes after by (a process
// paused between its slot and the write sends nothing rather than a
// request the ceiling did not plan for).
type sendGate struct {
	by    time.Time
	clock clock.Clock
	// refused: a write was refused; passed: the request was written in
	// time (a redirect's request that follows is not checked).
	refused, passed atomic.Bool
}

// open reports whether a write may go now, and records the answer.
func (g *sendGate) open() bool {
	if g.clock.Now().After(g.by) {
		g.refused.Store(true)
		return false
	}
	g.passed.Store(true)
	return true
}

// withSendBy returns ctx with a trace that arms, with g, the connection
// each request of the fetch is given (until one request was written in
// time). A connection that is not the dialer's (HTTP/2, where streams
// share one connection) is checked when it is given instead, and a late
// request is cancelled there (cancel), which stops it unless the
// transport has already begun to send it.
func withSendBy(ctx context.Context, g *sendGate, cancel context.CancelCauseFunc) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if g.passed.Load() {
				return
			}
			if c := gatedConnOf(info.Conn); c != nil {
				c.gate.Store(g)
				return
			}
			if !g.open() {
				cancel(ErrLate)
			}
		},
	})
}

// gatedConnOf is the dialer's connection under c (through TLS when it
// speaks HTTP/1), or nil.
func gatedConnOf(c net.Conn) *gatedConn {
	if tc, ok := c.(*tls.Conn); ok {
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			return nil
		}
		c = tc.NetConn()
	}
	gc, _ := c.(*gatedConn)
	return gc
}

// gatedConn is a dialed connection whose next write, when armed, first
// asks the fetch's gate: the last moment before the request leaves that a
// process controls.
type gatedConn struct {
	net.Conn
	gate atomic.Pointer[sendGate]
}

func (c *gatedConn) Write(p []byte) (int, error) {
	if g := c.gate.Swap(nil); g != nil && !g.open() {
		return 0, ErrLate
	}
	return c.Conn.Write(p)
}
