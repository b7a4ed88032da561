package netdelay

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

// echo serves one line-echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

func start(t *testing.T, upstream string, delay time.Duration) *Proxy {
	t.Helper()
	p, err := Start(Config{Upstream: upstream, Delay: delay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// A round trip through the proxy takes 2 × Delay more, and a stream is
// delayed, not slowed: many chunks written back to back arrive in order,
// all within about one round trip, not one round trip each.
func TestDelayPerDirectionNotPerChunk(t *testing.T) {
	t.Parallel()
	const delay = 40 * time.Millisecond
	p := start(t, echo(t), delay)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string) time.Duration {
		t0 := time.Now()
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil || line != msg+"\n" {
			t.Fatalf("echo = %q, %v", line, err)
		}
		return time.Since(t0)
	}
	roundTrip("warm") // the connection's own delayed dial
	if rt := roundTrip("ping"); rt < 2*delay {
		t.Fatalf("round trip %s, want ≥ 2 × %s", rt, delay)
	}
	const n = 50
	var want bytes.Buffer
	t0 := time.Now()
	for i := range n {
		line := bytes.Repeat([]byte{byte('a' + i%26)}, 1000)
		want.Write(line)
		want.WriteByte('\n')
		if _, err := c.Write(append(line, '\n')); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // separate reads on the proxy's side
	}
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(t0)
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatal("the stream came back out of order or altered")
	}
	if elapsed >= n/2*delay {
		t.Fatalf("%d chunks took %s: delayed one after the other (%s), not together", n, elapsed, n*delay)
	}
	t.Logf("round trip +%s; %d chunks in %s", 2*delay, n, elapsed.Round(time.Millisecond))
}

// PostgreSQL through the proxy: a statement's round trip is 2 × Delay
// longer, and the connection works as ever.
func TestPostgresThroughProxy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const delay = 10 * time.Millisecond
	url := testdb.URL(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p := start(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), delay)
	purl, err := p.URL(url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, purl)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	t0 := time.Now()
	var one int
	if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	if rt := time.Since(t0); rt < 2*delay {
		t.Fatalf("a statement took %s through the proxy, want ≥ %s", rt, 2*delay)
	}
}
