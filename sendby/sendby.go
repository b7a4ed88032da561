// Package sendby makes an HTTP request check its slot's send-by time as it
// is written: the last moment before the request leaves that a process
// controls. A pacer grants a slot and a request that leaves later than the
// slot plus its late tolerance would put more than rate + burst into one of
// the destination's seconds; a process paused between waking for its slot
// and writing the request (a loaded machine, a GC pause, a slow name
// lookup) would otherwise send it all the same. With the check, such a
// request writes nothing and fails with ErrLate; the caller gives the slot
// back and takes a new one.
//
// Two parts: Dial wraps a dialer so that its connections can be armed, and
// Arm arms the connection one request is given (through an
// httptrace.ClientTrace on the request's context).
//
//	transport.DialContext = sendby.Dial(dialer.DialContext)
//	ctx, gate, cancel := sendby.Arm(req.Context(), res.SendBy, clock)
//	defer cancel()
//	resp, err := transport.RoundTrip(req.WithContext(ctx))
//	if err != nil && gate.Refused() { /* nothing was sent: take a new slot */ }
package sendby

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

// ErrLate is the error of a request that sent nothing because it would
// have left after its send-by time.
var ErrLate = errors.New("the request would have left after its send-by time; nothing was sent")

// Gate is the send-by check of one request (and of the redirects that
// follow it, until one request was written in time).
type Gate struct {
	by    time.Time
	clock clock.Clock
	// refused: a write was refused; passed: a request was written in time
	// (a redirect's request that follows is not checked).
	refused, passed atomic.Bool
	// sent is when the first write the gate let through returned (on
	// clock; nil: none). checked is when that write passed the check;
	// written is closed once sent is stored. The transport writes on its
	// own goroutine and may hand over the response before that write has
	// returned, so Sent waits for written when a write is under way.
	sent, checked atomic.Pointer[time.Time]
	written       chan struct{}
}

// sentWait bounds how long Sent waits for a write under way to return: a
// write blocked on a peer that stopped reading is not waited for.
const sentWait = time.Second

// Sent is when the request's first write returned, on the Gate's clock:
// later than the check by however long the process was paused between the
// two. Zero when nothing was written through an armed connection (a nil
// Gate, a refused write, a connection Dial did not make). The transport
// writes on a goroutine of its own and can return the response before that
// write has returned; Sent then waits for it (up to a second, then gives
// the check's time).
func (g *Gate) Sent() time.Time {
	if g == nil {
		return time.Time{}
	}
	if t := g.sent.Load(); t != nil {
		return *t
	}
	checked := g.checked.Load()
	if checked == nil {
		return time.Time{}
	}
	timer := time.NewTimer(sentWait)
	defer timer.Stop()
	select {
	case <-g.written:
		return *g.sent.Load()
	case <-timer.C:
		// Still writing: the check's time is the best known.
		return *checked
	}
}

// Refused reports whether the gate refused a write: the request (or the
// redirect it was on) sent nothing. A nil Gate refuses nothing.
func (g *Gate) Refused() bool { return g != nil && g.refused.Load() }

// open reports whether a write may go now, and records the answer.
func (g *Gate) open() bool {
	if g.clock.Now().After(g.by) {
		g.refused.Store(true)
		return false
	}
	g.passed.Store(true)
	return true
}

// Arm returns ctx for a request that must leave by by (on clk): a trace
// that arms, with the returned Gate, the connection each request is given.
// A connection not made by a Dial-wrapped dialer (HTTP/2, where streams
// share one connection, or another dialer) is checked when it is given
// instead, and a late request is cancelled there, which stops it unless
// the transport has already begun to send it. A zero by arms nothing (the
// Gate is nil). Call cancel when the request is done.
func Arm(ctx context.Context, by time.Time, clk clock.Clock) (_ context.Context, _ *Gate, cancel context.CancelFunc) {
	if by.IsZero() {
		return ctx, nil, func() {}
	}
	g := &Gate{by: by, clock: clk, written: make(chan struct{})}
	cctx, cancelCause := context.WithCancelCause(ctx)
	return httptrace.WithClientTrace(cctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if g.passed.Load() {
				return
			}
			if c := gatedConnOf(info.Conn); c != nil {
				c.gate.Store(g)
				return
			}
			if !g.open() {
				cancelCause(ErrLate)
			}
		},
	}), g, func() { cancelCause(nil) }
}

// DialFunc is the type of net.Dialer.DialContext and of
// http.Transport.DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Dial wraps dial so that every connection it makes can be armed by Arm:
// its next write after being given to an armed request first asks the
// request's Gate. Connections not given to an armed request write as
// before.
func Dial(dial DialFunc) DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &gatedConn{Conn: c}, nil
	}
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
// asks the request's gate.
type gatedConn struct {
	net.Conn
	gate atomic.Pointer[Gate]
}

func (c *gatedConn) Write(p []byte) (int, error) {
	g := c.gate.Swap(nil)
	if g == nil {
		return c.Conn.Write(p)
	}
	if !g.open() {
		return 0, ErrLate
	}
	checked := g.clock.Now()
	first := g.checked.CompareAndSwap(nil, &checked)
	n, err := c.Conn.Write(p)
	if first {
		now := g.clock.Now()
		g.sent.Store(&now)
		close(g.written)
	}
	return n, err
}
