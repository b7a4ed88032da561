//go:build !(linux && (amd64 || arm64))

package fakedest

import (
	"net"
	"time"
)

// stampListener returns ln: arrivals are stamped by the handler where the
// kernel's receive times are not read (see stamp_linux.go).
func stampListener(ln net.Listener) net.Listener { return ln }

type stampConn struct{ net.Conn }

func (*stampConn) received() (time.Time, bool) { return time.Time{}, false }
