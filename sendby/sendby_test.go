package sendby_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/sendby"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A request armed with a send-by time writes when it is in time and sends
// nothing when it is late: at the write on a connection of a Dial-wrapped
// dialer, when the connection is given on any other (the request is
// cancelled with ErrLate as its cause). A zero send-by time arms nothing.
// Gate.Sent is the time of a write the gate let through.
func TestArm(t *testing.T) {
	t.Parallel()
	hits := atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	clk := clocktest.New()
	for _, tc := range []struct {
		name    string
		by      time.Duration // from now; 0: none
		wrapped bool
		sent    bool
	}{
		{"in time, wrapped", time.Millisecond, true, true},
		{"late, wrapped", -time.Millisecond, true, false},
		{"in time, other dialer", time.Millisecond, false, true},
		{"late, other dialer", -time.Millisecond, false, false},
		{"no send-by time", 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dial := (&net.Dialer{}).DialContext
			if tc.wrapped {
				dial = sendby.Dial(dial)
			}
			tr := &http.Transport{DialContext: dial, DisableKeepAlives: true}
			defer tr.CloseIdleConnections()
			var by time.Time
			if tc.by != 0 {
				by = clk.Now().Add(tc.by)
			}
			ctx, gate, cancel := sendby.Arm(context.Background(), by, clk)
			defer cancel()
			if (gate == nil) != (tc.by == 0) {
				t.Fatalf("gate %v for send-by %v", gate, by)
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			if err != nil {
				t.Fatal(err)
			}
			before := hits.Load()
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			sent := hits.Load() > before
			if sent != tc.sent || gate.Refused() == tc.sent || (err == nil) != tc.sent {
				t.Fatalf("sent %v, refused %v, err %v; want sent %v", sent, gate.Refused(), err, tc.sent)
			}
			// The write's time is known where the gate checked the write.
			if written := tc.sent && tc.wrapped && tc.by != 0; gate.Sent().IsZero() == written {
				t.Fatalf("Sent %v; want a time: %v", gate.Sent(), written)
			}
			if !tc.sent && !tc.wrapped && !errors.Is(context.Cause(ctx), sendby.ErrLate) {
				t.Fatalf("cause %v, want ErrLate", context.Cause(ctx))
			}
		})
	}
}

// holdingConn returns from a write only once release is closed (after the
// bytes are on the wire): the transport can hand over the response first.
type holdingConn struct {
	net.Conn
	release <-chan struct{}
}

func (c holdingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	<-c.release
	return n, err
}

// Gate.Sent knows the write's time even when the transport returned the
// response before its write goroutine's Write returned: it waits for that
// write rather than reporting none (which read as a request never sent and
// hid a late send from the overrun count).
func TestSentWaitsForTheWrite(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(srv.Close)
	release := make(chan struct{})
	inner := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return holdingConn{Conn: c, release: release}, nil
	}
	tr := &http.Transport{DialContext: sendby.Dial(inner), DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	clk := clocktest.New()
	ctx, gate, cancel := sendby.Arm(context.Background(), clk.Now().Add(time.Second), clk)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req) // the write is still under way
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Let the write return a moment after Sent is asked.
	timer := time.AfterFunc(50*time.Millisecond, func() { close(release) })
	defer timer.Stop()
	if gate.Sent().IsZero() {
		t.Fatal("Sent is zero for a request that was written")
	}
}
