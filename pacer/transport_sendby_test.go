package pacer

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/sendby"
)

// A request through Transport checks its slot's send-by time as it is
// written: a process paused between its slot and the write (here, once
// its connection is given, the fake clock advances by 50 ms; the slot's
// tolerance at 20/s is 20 ms) sends nothing on that slot, gives it back and takes a new one;
// after MaxLateSends such slots the next is sent unbounded. A body that can
// be read again (GetBody) goes whole on the slot it is sent on. The
// control, a base whose dialer is not wrapped by sendby.Dial (checked when
// the connection is given, not at the write), sends the request 50 ms late
// on its first slot, as the ceiling never planned.
func TestTransportChecksTheSlotAtTheWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                  string
		pauses                int32
		gated                 bool
		body                  string
		wantSlots, wantGaveUp uint64
	}{
		{name: "in time", pauses: 0, gated: true, wantSlots: 1},
		{name: "late once", pauses: 1, gated: true, wantSlots: 2, wantGaveUp: 1},
		{name: "late always", pauses: 10, gated: true, wantSlots: 3, wantGaveUp: 2},
		{name: "late once with a body", pauses: 1, gated: true, body: "payload", wantSlots: 2, wantGaveUp: 1},
		{name: "naive", pauses: 1, gated: false, wantSlots: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url, _ := setup(t, platformSpec{name: "api", rate: 20})
			clk := clocktest.New()
			p := fakePacer(t, url, clk, nil)
			var (
				mu     sync.Mutex
				bodies []string
			)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				bodies = append(bodies, string(b))
				mu.Unlock()
			}))
			t.Cleanup(srv.Close)
			pauses := atomic.Int32{}
			pauses.Store(tc.pauses)
			dial := (&net.Dialer{}).DialContext
			if tc.gated {
				dial = sendby.Dial(dial)
			}
			base := &http.Transport{DisableKeepAlives: true, DialContext: dial}
			t.Cleanup(base.CloseIdleConnections)
			client := &http.Client{Transport: &Transport{Pacer: p, Base: base, Platform: func(*http.Request) string { return "api" }}}
			var body io.Reader
			method := http.MethodGet
			if tc.body != "" {
				body, method = strings.NewReader(tc.body), http.MethodPost
			}
			// Paused once the connection is given, before the request is
			// written: the caller's trace runs after the Transport's.
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				GotConn: func(httptrace.GotConnInfo) {
					if pauses.Add(-1) >= 0 {
						clk.Advance(50 * time.Millisecond)
					}
				},
			})
			req, err := http.NewRequestWithContext(ctx, method, srv.URL, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			st := p.Stats()
			mu.Lock()
			defer mu.Unlock()
			if len(bodies) != 1 || bodies[0] != tc.body {
				t.Fatalf("the server saw %q; want one request with body %q", bodies, tc.body)
			}
			if st.Granted != tc.wantSlots || st.Late != tc.wantGaveUp {
				t.Fatalf("%d slots taken, %d given up late; want %d and %d", st.Granted, st.Late, tc.wantSlots, tc.wantGaveUp)
			}
		})
	}
}

// A body that cannot be read again ends the request with an error wrapping
// sendby.ErrLate when its slot is missed at the write: nothing was sent,
// and the caller decides.
func TestTransportLateWithoutGetBody(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "api", rate: 20})
	clk := clocktest.New()
	p := fakePacer(t, url, clk, nil)
	hits := atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	base := &http.Transport{DisableKeepAlives: true, DialContext: sendby.Dial(func(ctx context.Context, network, addr string) (net.Conn, error) {
		clk.Advance(50 * time.Millisecond)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	})}
	client := &http.Client{Transport: &Transport{Pacer: p, Base: base, Platform: func(*http.Request) string { return "api" }}}
	req, err := http.NewRequest(http.MethodPost, srv.URL, io.NopCloser(strings.NewReader("once")))
	if err != nil {
		t.Fatal(err)
	}
	req.GetBody = nil
	_, err = client.Do(req)
	if !errors.Is(err, sendby.ErrLate) || hits.Load() != 0 {
		t.Fatalf("err %v, %d requests at the server; want sendby.ErrLate and none", err, hits.Load())
	}
}

// Transport's default base checks the send-by time at the write: a
// request armed with a send-by time already past sends nothing through it.
func TestTransportDefaultBaseIsGated(t *testing.T) {
	t.Parallel()
	hits := atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	clk := clocktest.New()
	ctx, gate, cancel := sendby.Arm(context.Background(), clk.Now().Add(-time.Millisecond), clk)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := defaultBase().RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	if !gate.Refused() || hits.Load() != 0 {
		t.Fatalf("refused %v, %d requests at the server; want refused and none", gate.Refused(), hits.Load())
	}
}
