package fetch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// The SSRF guard. It lives in the dialer, so it sees the addresses a
// connection is really made to: after DNS resolution, on every redirect hop,
// for plain HTTP and for the TCP connection under TLS alike. A URL cannot
// talk its way past it with a hostname that resolves to 127.0.0.1, a
// redirect to http://169.254.169.254/, or an IPv4-mapped IPv6 literal.

// Resolver looks up a host's addresses. *net.Resolver implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// refusedError is a connection the guard refused.
type refusedError struct {
	addr   netip.Addr
	reason string // e.g. "a loopback address"
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("refused: %s is %s (private networks are not allowed)", e.addr, e.reason)
}

var blockedPrefixes = []struct {
	prefix netip.Prefix
	reason string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "a \"this network\" address"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a carrier-grade NAT address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved or broadcast address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address"},
}

// nat64Prefixes embed an IPv4 address in their last 32 bits; a NAT64 gateway
// forwards to it, so the embedded address is what counts.
var nat64Prefixes = []netip.Prefix{
	netip.MustParsePrefix("64:ff9b::/96"),
	netip.MustParsePrefix("64:ff9b:1::/48"),
}

// blocked classifies ip under the guard's policy: ok is true when fleetpace
// must not connect to it unless private networks are allowed, and reason names
// the kind of address ("a loopback address").
//
// Blocked: unspecified, loopback, private (RFC 1918, RFC 4193 fc00::/7),
// link-local (169.254/16, fe80::/10), multicast, 0/8, CGNAT 100.64/10,
// 240/4 and broadcast, deprecated site-local and IPv4-compatible IPv6, and
// any of these inside IPv4-mapped (::ffff:0:0/96) or NAT64 (64:ff9b::/96)
// IPv6 addresses.
func blocked(ip netip.Addr) (reason string, ok bool) {
	ip = ip.WithZone("")
	switch {
	case !ip.IsValid():
		return "an invalid address", true
	case ip.Is4In6():
		return blocked(ip.Unmap())
	case ip.IsUnspecified():
		return "an unspecified address", true
	case ip.IsLoopback():
		return "a loopback address", true
	case ip.IsPrivate():
		return "a private address", true
	case ip.IsLinkLocalUnicast():
		return "a link-local address", true
	case ip.IsMulticast():
		return "a multicast address", true
	}
	for _, b := range blockedPrefixes {
		if b.prefix.Contains(ip) {
			return b.reason, true
		}
	}
	for _, p := range nat64Prefixes {
		if p.Contains(ip) {
			a := ip.As16()
			if r, ok := blocked(netip.AddrFrom4([4]byte(a[12:16]))); ok {
				return "a NAT64 form of " + r, true
			}
		}
	}
	return "", false
}

// guard decides whether a connection to ap may be made.
type guard struct {
	allowPrivate bool
	// allow lists exact address:port pairs exempt from the policy. Tests
	// only: it lets a loopback test server stand in for a public host while
	// every other loopback port stays refused.
	allow []netip.AddrPort
}

func (g *guard) check(ap netip.AddrPort) error {
	if g.allowPrivate {
		return nil
	}
	ap = netip.AddrPortFrom(ap.Addr().WithZone(""), ap.Port())
	for _, a := range g.allow {
		if a == ap {
			return nil
		}
	}
	if reason, ok := blocked(ap.Addr()); ok {
		return &refusedError{addr: ap.Addr(), reason: reason}
	}
	return nil
}

// dialer resolves, checks every resolved address, then dials the checked
// addresses (in order, until one connects). A second check in the socket's
// Control hook guarantees nothing else reaches connect(2).
type dialer struct {
	guard    *guard
	resolver Resolver
	net      net.Dialer
}

func newDialer(g *guard, r Resolver) *dialer {
	d := &dialer{guard: g, resolver: r}
	d.net = net.Dialer{
		Timeout:   10 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("guard: unparsable dial address %q: %w", address, err)
			}
			return g.check(ap)
		},
	}
	return d
}

func (d *dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var ipNetwork string
	switch network {
	case "tcp":
		ipNetwork = "ip"
	case "tcp4":
		ipNetwork = "ip4"
	case "tcp6":
		ipNetwork = "ip6"
	default:
		return nil, fmt.Errorf("guard: unsupported network %q", network)
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("guard: bad port %q", portStr)
	}
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		addrs, err = d.resolver.LookupNetIP(ctx, ipNetwork, host)
		if err != nil {
			return nil, err
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("lookup %s: no addresses", host)
		}
	}
	// Every address must pass: a name that resolves to one public and one
	// private address is a rebinding trick, not a choice.
	aps := make([]netip.AddrPort, len(addrs))
	for i, ip := range addrs {
		aps[i] = netip.AddrPortFrom(ip.Unmap(), uint16(port))
		if err := d.guard.check(aps[i]); err != nil {
			return nil, err
		}
	}
	var first error
	for _, ap := range aps {
		conn, err := d.net.DialContext(ctx, network, ap.String())
		if err == nil {
			return conn, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil || errors.As(err, new(*refusedError)) {
			break
		}
	}
	return nil, first
}
