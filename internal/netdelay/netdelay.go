// Package netdelay puts a delaying TCP proxy between fleetpace processes and
// PostgreSQL, so tests and benchmarks on one machine see a database as far
// away as a real deployment's: every byte is forwarded Delay later, in each
// direction, so a round trip takes 2 × Delay longer (a query's, and a
// connection's handshake's). Order and throughput are kept: data read at t
// is written at t + Delay, whatever was read before it (a pipe with a
// latency, not a queue of sleeps).
//
// The kernel's netem in a network namespace would be the other way; it is
// not in every kernel (not in the development VM's: "Specified qdisc kind
// is unknown"), and a proxy in the process needs no privileges.
package netdelay

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Proxy.
type Config struct {
	// Upstream is the address forwarded to (host:port). Required.
	Upstream string
	// Delay is added in each direction: a round trip takes 2 × Delay more.
	// 0 forwards at once.
	Delay time.Duration
	// Listen is the proxy's address. Default: a free port on 127.0.0.1.
	Listen string
}

// Proxy is a running delaying proxy.
type Proxy struct {
	cfg  Config
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	open map[net.Conn]struct{}
	done chan struct{}
	// accepted counts the connections accepted.
	accepted atomic.Int64
}

// Start listens and forwards every accepted connection to cfg.Upstream.
func Start(cfg Config) (*Proxy, error) {
	switch {
	case cfg.Upstream == "":
		return nil, errors.New("netdelay: Config.Upstream is required")
	case cfg.Delay < 0:
		return nil, fmt.Errorf("netdelay: Config.Delay must be ≥ 0, got %s", cfg.Delay)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("netdelay: %w", err)
	}
	p := &Proxy{cfg: cfg, ln: ln, open: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// StartURL starts a proxy in front of the server databaseURL names (its
// host and port) that adds delay in each direction, and returns it with
// databaseURL made to go through it.
func StartURL(databaseURL string, delay time.Duration) (*Proxy, string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return nil, "", fmt.Errorf("netdelay: %w", err)
	}
	p, err := Start(Config{Upstream: u.Host, Delay: delay})
	if err != nil {
		return nil, "", err
	}
	u.Host = p.Addr()
	return p, u.String(), nil
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines.
func (p *Proxy) Close() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	close(p.done)
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.open {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// Accepted is how many connections the proxy has accepted: how many a
// process behind it opened to the database.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// URL returns databaseURL with its host and port replaced by the proxy's.
func (p *Proxy) URL(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("netdelay: not a URL with a host: %q", databaseURL)
	}
	u.Host = p.Addr()
	return u.String(), nil
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		c.Close()
		return false
	default:
	}
	p.open[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	// The connection's handshake goes through the delay too: the dial is
	// delayed by one way (the client's SYN), and the first reply by the
	// other, like any data.
	if !p.sleep(p.cfg.Delay) {
		return
	}
	var d net.Dialer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	server, err := d.DialContext(ctx, "tcp", p.cfg.Upstream)
	cancel()
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(server, client) }()
	go func() { defer wg.Done(); p.pipe(client, server) }()
	wg.Wait()
}

// sleep waits d or until the proxy closes; false if it closed.
func (p *Proxy) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.done:
		return false
	}
}

// chunk is data read at one instant, to be written Delay later.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst, each chunk Delay after it was read. When src
// ends, dst's write side is closed (after the data before it), so a closed
// connection reaches the other side in order too.
func (p *Proxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32*1024)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case q <- chunk{buf[:n], time.Now().Add(p.cfg.Delay)}:
				case <-p.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if d := time.Until(c.due); d > 0 && !p.sleep(d) {
			break
		}
		if _, err := dst.Write(c.data); err != nil {
			break
		}
	}
	// Drain what is left so the reader is never stuck on a full queue.
	go func() {
		for range q {
		}
	}()
	if tc, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	} else {
		_ = dst.Close()
	}
}
