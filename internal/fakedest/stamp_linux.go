//go:build linux && (amd64 || arm64)

package fakedest

import (
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// stampListener accepts connections whose reads carry the kernel's receive
// time of the bytes read (SO_TIMESTAMPNS), so that a request's arrival is
// when it reached this host, not when this process got round to it: on a
// loaded machine the server's goroutines run late, and requests that
// arrived apart would be stamped together. On loopback the kernel stamps a
// segment as the sender's write hands it over.
//
// The option is set on the listening socket too: an accepted socket
// inherits it, so the first bytes of a connection are stamped even when
// they arrive before Accept returns (on a loaded machine they often do).
func stampListener(ln net.Listener) net.Listener {
	if tl, ok := ln.(*net.TCPListener); ok {
		if rc, err := tl.SyscallConn(); err == nil {
			_ = setStamping(rc)
		}
	}
	return &stampingListener{ln}
}

type stampingListener struct{ net.Listener }

func (l *stampingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c, nil
	}
	if err := setStamping(rc); err != nil {
		return c, nil // stamped by the handler instead
	}
	return &stampConn{TCPConn: tc, rc: rc}, nil
}

// setStamping asks the kernel for the receive time of every segment read
// from the socket.
func setStamping(rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	return serr
}

// stampConn is a connection whose Read records the kernel's receive time of
// the latest bytes read.
type stampConn struct {
	*net.TCPConn
	rc   syscall.RawConn
	last atomic.Int64 // Unix nanoseconds; 0: none yet
	oob  [64]byte     // only Read uses it, and net/http reads a conn from one goroutine at a time
}

func (c *stampConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n, oobn int
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), b, c.oob[:], 0)
		return rerr != syscall.EAGAIN
	})
	if err != nil { // a deadline, or the connection closed
		return 0, err
	}
	if rerr != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: rerr}
	}
	if n == 0 {
		return 0, io.EOF
	}
	if msgs, err := syscall.ParseSocketControlMessage(c.oob[:oobn]); err == nil {
		for _, m := range msgs {
			if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
				// struct timespec: two 64-bit words on 64-bit Linux.
				sec, nsec := int64(binary.NativeEndian.Uint64(m.Data)), int64(binary.NativeEndian.Uint64(m.Data[8:]))
				c.last.Store(sec*1e9 + nsec)
			}
		}
	}
	return n, nil
}

// received is the kernel's receive time of the latest bytes read; false if
// none was given.
func (c *stampConn) received() (time.Time, bool) {
	ns := c.last.Load()
	if ns == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}
