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

// ErrRefusedAddress is matched (errors.Is) by the error of a connection the
// SSRF guard refused; Result.Err carries it. Its text states the fact
// ("refused: 127.0.0.1 is a loopback address"); a caller that can lift the
// guard (the CLI's --allow-private-networks) adds that hint itself.
var ErrRefusedAddress = errors.New("fetch: address refused by the SSRF guard")

// refusedError is a connection the guard refused.
type refusedError struct {
	addr   netip.Addr
	reason string // e.g. "a loopback address"
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("refused: %s is %s", e.addr, e.reason)
}

func (e *refusedError) Is(target error) bool { return target == ErrRefusedAddress }

// embedding says where a special prefix carries an IPv4 address.
type embedding uint8

const (
	// never: every address in the prefix is refused.
	never embedding = iota
	// nat64: RFC 6052 /96 form, the IPv4 address in the last 32 bits.
	nat64
	// sixToFour: RFC 3056, the IPv4 address in bits 16–47.
	sixToFour
)

// specialPrefixes is the guard's policy, taken from IANA's IPv4 and IPv6
// Special-Purpose Address Registries (RFC 6890, updated by RFC 8190): every
// block the registries mark as not globally reachable, plus multicast and a
// few deprecated blocks, refused so a fetch can reach only the public
// internet. Rows are checked in order and the first match decides, so a
// more specific row comes before the block that contains it. An address
// with embedded IPv4 is judged by the IPv4 address it reaches.
//
// Globally reachable rows of the registries stay allowed: AS112
// (192.31.196.0/24, 192.175.48.0/24, 2001:4:112::/48 is inside 2001::/23
// below, 2620:4f:8000::/48) and AMT (192.52.193.0/24).
var specialPrefixes = []struct {
	prefix netip.Prefix
	reason string
	embeds embedding
}{
	// IPv4. (IPv4-mapped IPv6, ::ffff:0:0/96 — RFC 4291, not globally
	// reachable — is unmapped before the table: it reaches the IPv4 address.)

	// 0.0.0.0/32, "This host on this network", RFC 1122: Linux connects it to
	// the local host.
	{netip.MustParsePrefix("0.0.0.0/32"), "an unspecified address", never},
	// 0.0.0.0/8, "This network", RFC 791: source only, never a destination.
	{netip.MustParsePrefix("0.0.0.0/8"), `a "this network" address`, never},
	// 10.0.0.0/8, Private-Use, RFC 1918: internal networks.
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address", never},
	// 100.64.0.0/10, Shared Address Space, RFC 6598: the ISP's side of a
	// carrier-grade NAT; internal to an operator.
	{netip.MustParsePrefix("100.64.0.0/10"), "a carrier-grade NAT address", never},
	// 127.0.0.0/8, Loopback, RFC 1122: this machine.
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address", never},
	// 169.254.0.0/16, Link Local, RFC 3927: the local link, and cloud
	// metadata services (169.254.169.254).
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address", never},
	// 172.16.0.0/12, Private-Use, RFC 1918.
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address", never},
	// 192.0.0.0/24, IETF Protocol Assignments, RFC 6890: DS-Lite
	// 192.0.0.0/29 (RFC 7335), the dummy 192.0.0.8 (RFC 7600), NAT64
	// discovery 192.0.0.170-171 (RFC 8880), all not globally reachable. The
	// two global anycast addresses in it, PCP 192.0.0.9 (RFC 7723) and TURN
	// 192.0.0.10 (RFC 8155), serve no content and are refused with the rest.
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol assignment address", never},
	// 192.0.2.0/24, Documentation TEST-NET-1, RFC 5737: never routed.
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address", never},
	// 192.88.99.0/24, deprecated 6to4 Relay Anycast, RFC 7526 (with the
	// 6a44 relay 192.88.99.2, RFC 6751): a relay tunnels to addresses the
	// guard cannot see.
	{netip.MustParsePrefix("192.88.99.0/24"), "a 6to4 relay anycast address", never},
	// 192.168.0.0/16, Private-Use, RFC 1918.
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address", never},
	// 198.18.0.0/15, Benchmarking, RFC 2544: lab networks.
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address", never},
	// 198.51.100.0/24, Documentation TEST-NET-2, RFC 5737.
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address", never},
	// 203.0.113.0/24, Documentation TEST-NET-3, RFC 5737.
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address", never},
	// 224.0.0.0/4, Multicast, RFC 5771 (IANA's multicast registry): not a
	// unicast destination.
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address", never},
	// 255.255.255.255/32, Limited Broadcast, RFC 8190 and RFC 919: the
	// local network's broadcast.
	{netip.MustParsePrefix("255.255.255.255/32"), "a broadcast address", never},
	// 240.0.0.0/4, Reserved, RFC 1112: not routed.
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved address", never},

	// IPv6.

	// ::/128, Unspecified, RFC 4291: Linux connects it to the local host.
	{netip.MustParsePrefix("::/128"), "an unspecified address", never},
	// ::1/128, Loopback, RFC 4291: this machine.
	{netip.MustParsePrefix("::1/128"), "a loopback address", never},
	// ::/96, IPv4-compatible, deprecated by RFC 4291: not routed; some
	// stacks translate it to the IPv4 address.
	{netip.MustParsePrefix("::/96"), "an IPv4-compatible address", never},
	// ::ffff:0:0:0/96, IPv4-translated, RFC 2765 (obsolete SIIT): reaches
	// an IPv4 address through a translator.
	{netip.MustParsePrefix("::ffff:0:0:0/96"), "an IPv4-translated address", never},
	// 64:ff9b::/96, IPv4-IPv6 Translation (well-known NAT64), RFC 6052:
	// globally reachable, but the NAT64 gateway forwards to the embedded
	// IPv4 address, which decides.
	{netip.MustParsePrefix("64:ff9b::/96"), "a NAT64 form of ", nat64},
	// 64:ff9b:1::/48, IPv4-IPv6 Translation (local use), RFC 8215: not
	// globally reachable; the operator chooses the prefix length, so where
	// the IPv4 address sits cannot be known and the whole block is refused.
	// A network whose DNS64 uses it needs AllowPrivateNetworks.
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local-use NAT64 address", never},
	// 100::/64, Discard-Only, RFC 6666: black hole.
	{netip.MustParsePrefix("100::/64"), "a discard-only address", never},
	// 100:0:0:1::/64, Dummy IPv6 Prefix, RFC 9780: never a destination.
	{netip.MustParsePrefix("100:0:0:1::/64"), "a dummy address", never},
	// 2001::/32, TEREDO, RFC 4380 and RFC 8190: a Teredo address tunnels
	// over UDP through a relay to an IPv4 host (its obfuscated client
	// address) that the guard cannot check; Teredo is obsolete.
	{netip.MustParsePrefix("2001::/32"), "a Teredo tunnel address", never},
	// 2001:2::/48, Benchmarking, RFC 5180.
	{netip.MustParsePrefix("2001:2::/48"), "a benchmarking address", never},
	// 2001:10::/28, deprecated ORCHID, RFC 4843, and 2001:20::/28, ORCHIDv2,
	// RFC 7343: cryptographic host identifiers for HIP, not locators; no
	// plain TCP connection belongs there.
	{netip.MustParsePrefix("2001:10::/28"), "an ORCHID address", never},
	{netip.MustParsePrefix("2001:20::/28"), "an ORCHID address", never},
	// 2001:db8::/32, Documentation, RFC 3849.
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address", never},
	// 2001::/23, IETF Protocol Assignments, RFC 2928: not globally
	// reachable save a few anycast service addresses (PCP, TURN, DNS-SD
	// SRP at 2001:1::1-3), AMT (2001:3::/32), AS112 (2001:4:112::/48) and
	// DRIP (2001:30::/28), none of which serves content; the whole block
	// is refused.
	{netip.MustParsePrefix("2001::/23"), "an IETF protocol assignment address", never},
	// 2002::/16, 6to4, RFC 3056: reaches the IPv4 address in bits 16–47
	// through a relay; that address decides.
	{netip.MustParsePrefix("2002::/16"), "a 6to4 form of ", sixToFour},
	// 3fff::/20, Documentation, RFC 9637.
	{netip.MustParsePrefix("3fff::/20"), "a documentation address", never},
	// 5f00::/16, Segment Routing (SRv6) SIDs, RFC 9602: not globally
	// reachable.
	{netip.MustParsePrefix("5f00::/16"), "a segment-routing address", never},
	// fc00::/7, Unique-Local, RFC 4193: the IPv6 private networks.
	{netip.MustParsePrefix("fc00::/7"), "a private address", never},
	// fe80::/10, Link-Local Unicast, RFC 4291.
	{netip.MustParsePrefix("fe80::/10"), "a link-local address", never},
	// fec0::/10, Site-Local, deprecated by RFC 3879: still private where used.
	{netip.MustParsePrefix("fec0::/10"), "a site-local address", never},
	// ff00::/8, Multicast, RFC 4291.
	{netip.MustParsePrefix("ff00::/8"), "a multicast address", never},
}

// blocked classifies ip under the guard's policy, specialPrefixes: ok is true
// when fleetpace must not connect to it without AllowPrivateNetworks, and
// reason names the kind of address ("a loopback address"). The zero Addr is
// blocked. An IPv4-mapped address is judged as its IPv4 address; a NAT64
// (64:ff9b::/96) or 6to4 (2002::/16) address as the IPv4 address it embeds.
func blocked(ip netip.Addr) (reason string, ok bool) {
	if !ip.IsValid() {
		return "an invalid address", true
	}
	ip = ip.WithZone("").Unmap()
	for _, row := range specialPrefixes {
		if !row.prefix.Contains(ip) {
			continue
		}
		a := ip.As16()
		switch row.embeds {
		case nat64:
			return blockedEmbedded(row.reason, [4]byte(a[12:16]))
		case sixToFour:
			return blockedEmbedded(row.reason, [4]byte(a[2:6]))
		}
		return row.reason, true
	}
	return "", false
}

func blockedEmbedded(form string, v4 [4]byte) (string, bool) {
	if r, ok := blocked(netip.AddrFrom4(v4)); ok {
		return form + r, true
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
