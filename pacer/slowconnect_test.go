package pacer

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A connection that takes longer than the connect timeout to start while
// the pool's other connection answers is no outage: the reservation that
// needed it goes again and is paced by the shared row, and nothing is
// latched. The control (the naive rule: every failed connect is an
// outage) paces that reservation locally: a process alone in degraded
// mode, beside others paced by the row, may take the fleet past its
// ceiling.
func TestSlowConnectIsNoOutage(t *testing.T) {
	t.Parallel()
	for _, naive := range []bool{false, true} {
		// Slots 0.5 s apart: no blocks, each reservation a round trip.
		url, _ := setup(t, platformSpec{name: "slow", rate: 2})
		var slow atomic.Bool
		dialing := make(chan struct{}, 8)
		// The slow connect fails once its timeout passed and the reservation
		// on the established connection is done: on a loaded machine that
		// one may come later than the timeout, and the naive rule would then
		// pace it locally too.
		meanwhile := make(chan struct{})
		pc, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		var d net.Dialer
		pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if slow.Load() {
				dialing <- struct{}{}
				<-ctx.Done() // a backend that does not start within the connect timeout
				<-meanwhile
				return nil, ctx.Err()
			}
			return d.DialContext(ctx, network, addr)
		}
		p := newPacer(t, "", func(c *Config) {
			// PollOnly: no listener, whose connection would dial through the
			// slow dialer too.
			c.PoolConfig, c.MaxConns, c.ConnectTimeout, c.PollOnly = pc, 2, 500*time.Millisecond, true
		})
		p.noSlowConnect = naive
		ctx := context.Background()
		if _, err := p.Reserve(ctx, "slow", 5*time.Second); err != nil { // the pool's one connection
			t.Fatal(err)
		}
		held, err := p.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slow.Store(true)
		done := make(chan Reservation, 1)
		go func() {
			res, err := p.Reserve(ctx, "slow", 5*time.Second)
			if err != nil {
				t.Error(err)
			}
			done <- res
		}()
		<-dialing // it needs a new connection, which does not come
		held.Release()
		// Meanwhile a round trip on the pool's established connection.
		res, err := p.Reserve(ctx, "slow", 5*time.Second)
		close(meanwhile)
		if err != nil || res.Degraded {
			t.Fatalf("reservation on the established connection: %+v, %v", res, err)
		}
		res = <-done
		st := p.Stats()
		t.Logf("naive %v: degraded %v, failures %d, slow connects %d", naive, res.Degraded, st.Failures, st.SlowConnects)
		switch {
		case !naive && (res.Degraded || st.Failures != 0 || st.Down || st.SlowConnects == 0):
			t.Errorf("a slow connect beside a working connection: reservation degraded %v, failures %d, down %v, slow connects %d; want it paced by the row, no outage",
				res.Degraded, st.Failures, st.Down, st.SlowConnects)
		case naive && !res.Degraded:
			t.Error("the control did not pace the reservation locally: the test cannot tell")
		}
	}
}
