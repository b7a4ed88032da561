package fetch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// slowResolver resolves every name to 127.0.0.1 and advances clock by
// delay first: a process paused between its slot and the write.
type slowResolver struct {
	clock *clockwork.FakeClock
	delay time.Duration
}

func (r slowResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.clock.Advance(r.delay)
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

func TestSendByLateSendsNothing(t *testing.T) {
	t.Parallel()
	srv, hits := server(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	clk := clockwork.NewFakeClock()
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true, Clock: clk})

	// In time: sent.
	r := h.Fetch(context.Background(), Request{URL: srv.URL, SendBy: clk.Now().Add(time.Millisecond)})
	if r.Outcome != OK || hits.Load() != 1 {
		t.Fatalf("in time: %s %q, %d requests at the server; want ok, 1", r.Outcome, r.Reason, hits.Load())
	}
	// Late, on the kept-alive connection of the first: nothing sent.
	r = h.Fetch(context.Background(), Request{URL: srv.URL, SendBy: clk.Now().Add(-time.Millisecond)})
	if !errors.Is(r.Err, ErrLate) || r.Outcome != Failed || !strings.HasPrefix(r.Reason, "late: ") {
		t.Fatalf("late: %s %q (err %v); want failed with ErrLate", r.Outcome, r.Reason, r.Err)
	}
	// Late on a new connection: nothing sent.
	h.CloseIdleConnections()
	r = h.Fetch(context.Background(), Request{URL: srv.URL, SendBy: clk.Now().Add(-time.Millisecond)})
	if !errors.Is(r.Err, ErrLate) {
		t.Fatalf("late on a new connection: %s %q (err %v); want ErrLate", r.Outcome, r.Reason, r.Err)
	}
	// No SendBy: no bound.
	r = h.Fetch(context.Background(), Request{URL: srv.URL})
	if r.Outcome != OK {
		t.Fatalf("no SendBy: %s %q", r.Outcome, r.Reason)
	}
	if n := hits.Load(); n != 2 {
		t.Fatalf("the server saw %d requests; want 2 (the late ones sent nothing)", n)
	}
}

// The check is made as the request is written, not when Fetch is called:
// a process paused after its slot (here, while the name resolves) sends
// nothing. The control checks SendBy when it calls Fetch, as a caller
// without the write-time check would, and sends a request the ceiling did
// not plan for.
func TestSendByIsCheckedAtTheWrite(t *testing.T) {
	t.Parallel()
	srv, hits := server(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	port := netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://")).Port()
	u := fmt.Sprintf("http://paused.example:%d/", port)
	clk := clockwork.NewFakeClock()
	h := setup(t, HTTPConfig{AllowPrivateNetworks: true, Clock: clk, Resolver: slowResolver{clk, 50 * time.Millisecond}})

	sendBy := clk.Now().Add(20 * time.Millisecond)
	r := h.Fetch(context.Background(), Request{URL: u, SendBy: sendBy})
	if !errors.Is(r.Err, ErrLate) || hits.Load() != 0 {
		t.Fatalf("paused 50 ms with 20 ms to spare: %s %q, %d requests at the server; want ErrLate, none", r.Outcome, r.Reason, hits.Load())
	}

	// The control: in time when called, so it sends, 30 ms after SendBy.
	h.CloseIdleConnections()
	sendBy = clk.Now().Add(20 * time.Millisecond)
	if clk.Now().After(sendBy) {
		t.Fatal("the control is late before it starts")
	}
	r = h.Fetch(context.Background(), Request{URL: u})
	if r.Outcome != OK || hits.Load() != 1 {
		t.Fatalf("control: %s %q, %d requests", r.Outcome, r.Reason, hits.Load())
	}
	if late := clk.Now().Sub(sendBy); late <= 0 {
		t.Fatalf("control: sent %s before SendBy; the pause did not happen", -late)
	}
}
