package fetch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestBlocked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr   string
		reason string // "" = allowed
	}{
		// IPv4 public, including the neighbours of every blocked range.
		{"8.8.8.8", ""},
		{"93.184.216.34", ""},
		{"1.1.1.1", ""},
		{"1.0.0.0", ""},
		{"9.255.255.255", ""},
		{"11.0.0.1", ""},
		{"100.63.255.255", ""},
		{"100.128.0.0", ""},
		{"126.255.255.255", ""},
		{"128.0.0.0", ""},
		{"169.253.255.255", ""},
		{"169.255.0.0", ""},
		{"172.15.255.255", ""},
		{"172.32.0.0", ""},
		{"191.255.255.255", ""},
		{"192.0.1.0", ""},
		{"192.0.3.0", ""},
		{"192.31.196.1", ""},  // AS112, globally reachable
		{"192.52.193.1", ""},  // AMT, globally reachable
		{"192.175.48.1", ""},  // AS112, globally reachable
		{"192.88.98.255", ""}, // below the 6to4 relay anycast /24
		{"192.167.255.255", ""},
		{"192.169.0.1", ""},
		{"198.17.255.255", ""},
		{"198.20.0.0", ""},
		{"198.51.99.255", ""},
		{"198.51.101.0", ""},
		{"203.0.112.255", ""},
		{"203.0.114.0", ""},
		{"223.255.255.255", ""},
		// IPv4 blocked
		{"0.0.0.0", "an unspecified address"},
		{"0.1.2.3", `a "this network" address`},
		{"0.255.255.255", `a "this network" address`},
		{"10.0.0.1", "a private address"},
		{"10.255.255.255", "a private address"},
		{"100.64.0.1", "a carrier-grade NAT address"},
		{"100.127.255.255", "a carrier-grade NAT address"},
		{"127.0.0.1", "a loopback address"},
		{"127.255.255.254", "a loopback address"},
		{"169.254.169.254", "a link-local address"},
		{"169.254.0.1", "a link-local address"},
		{"172.16.0.1", "a private address"},
		{"172.31.255.255", "a private address"},
		{"192.0.0.1", "an IETF protocol assignment address"},
		{"192.0.0.8", "an IETF protocol assignment address"},
		{"192.0.0.9", "an IETF protocol assignment address"}, // PCP anycast: global, refused with its /24
		{"192.0.0.170", "an IETF protocol assignment address"},
		{"192.0.2.1", "a documentation address"},
		{"192.88.99.1", "a 6to4 relay anycast address"},
		{"192.88.99.2", "a 6to4 relay anycast address"},
		{"192.168.1.1", "a private address"},
		{"198.18.0.1", "a benchmarking address"},
		{"198.19.255.255", "a benchmarking address"},
		{"198.51.100.7", "a documentation address"},
		{"203.0.113.200", "a documentation address"},
		{"224.0.0.1", "a multicast address"},
		{"239.255.255.250", "a multicast address"},
		{"240.0.0.1", "a reserved address"},
		{"255.255.255.254", "a reserved address"},
		{"255.255.255.255", "a broadcast address"},
		// IPv6 public
		{"2001:4860:4860::8888", ""},
		{"2606:4700:4700::1111", ""},
		{"2a00:1450:4001:80b::200e", ""},
		{"2001:200::1", ""},      // just above 2001::/23
		{"2001:db7:ffff::1", ""}, // just below documentation
		{"2001:db9::1", ""},
		{"2620:4f:8000::1", ""}, // AS112, globally reachable
		{"3ffe:ffff::1", ""},
		{"3fff:1000::1", ""}, // just above 3fff::/20
		{"fbff:ffff::1", ""},
		{"fe00::1", ""},
		{"64:ff9a::1", ""},
		{"100:0:0:2::1", ""},
		// IPv6 blocked
		{"::1", "a loopback address"},
		{"::", "an unspecified address"},
		{"::2", "an IPv4-compatible address"},
		{"::127.0.0.1", "an IPv4-compatible address"},
		{"::10.0.0.1", "an IPv4-compatible address"},
		{"::8.8.8.8", "an IPv4-compatible address"},
		{"::ffff:0:8.8.8.8", "an IPv4-translated address"},
		{"100::1", "a discard-only address"},
		{"100::ffff:ffff:ffff:ffff", "a discard-only address"},
		{"100:0:0:1::1", "a dummy address"},
		{"2001::1", "a Teredo tunnel address"},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", "a Teredo tunnel address"},
		{"2001:1::1", "an IETF protocol assignment address"},
		{"2001:2::1", "a benchmarking address"},
		{"2001:3::1", "an IETF protocol assignment address"}, // AMT
		{"2001:4:112::1", "an IETF protocol assignment address"},
		{"2001:10::1", "an ORCHID address"},
		{"2001:20::1", "an ORCHID address"},
		{"2001:2f:ffff::1", "an ORCHID address"},
		{"2001:30::1", "an IETF protocol assignment address"}, // DRIP
		{"2001:1ff:ffff::1", "an IETF protocol assignment address"},
		{"2001:db8::1", "a documentation address"},
		{"3fff::1", "a documentation address"},
		{"3fff:fff::1", "a documentation address"},
		{"5f00::1", "a segment-routing address"},
		{"fc00::1", "a private address"},
		{"fd12:3456:789a::1", "a private address"},
		{"fe80::1", "a link-local address"},
		{"fe80::1%eth0", "a link-local address"},
		{"febf:ffff::1", "a link-local address"},
		{"fec0::1", "a site-local address"},
		{"ff02::1", "a multicast address"},
		{"ff05::1:3", "a multicast address"},
		{"ff0e::1", "a multicast address"},
		// IPv4-mapped IPv6
		{"::ffff:127.0.0.1", "a loopback address"},
		{"::ffff:10.1.2.3", "a private address"},
		{"::ffff:192.168.0.1", "a private address"},
		{"::ffff:169.254.169.254", "a link-local address"},
		{"::ffff:0.0.0.0", "an unspecified address"},
		{"::ffff:100.64.0.1", "a carrier-grade NAT address"},
		{"::ffff:224.0.0.1", "a multicast address"},
		{"::ffff:198.18.0.1", "a benchmarking address"},
		{"::ffff:255.255.255.255", "a broadcast address"},
		{"::ffff:7f00:1", "a loopback address"}, // hex spelling of ::ffff:127.0.0.1
		{"::ffff:8.8.8.8", ""},
		// NAT64, well-known prefix: the embedded IPv4 decides.
		{"64:ff9b::8.8.8.8", ""},
		{"64:ff9b::127.0.0.1", "a NAT64 form of a loopback address"},
		{"64:ff9b::a9fe:a9fe", "a NAT64 form of a link-local address"},
		{"64:ff9b::10.0.0.1", "a NAT64 form of a private address"},
		{"64:ff9b::100.64.0.1", "a NAT64 form of a carrier-grade NAT address"},
		{"64:ff9b::192.0.0.170", "a NAT64 form of an IETF protocol assignment address"},
		{"64:ff9b::255.255.255.255", "a NAT64 form of a broadcast address"},
		{"64:ff9b::1:0:0:1", ""}, // outside the /96, inside 64:ff9b::/32 (not special)
		// NAT64, local-use prefix: refused whole.
		{"64:ff9b:1::10.0.0.1", "a local-use NAT64 address"},
		{"64:ff9b:1::8.8.8.8", "a local-use NAT64 address"},
		{"64:ff9b:1:ffff::1", "a local-use NAT64 address"},
		// 6to4: the IPv4 in bits 16-47 decides.
		{"2002:808:808::1", ""},
		{"2002:7f00:1::1", "a 6to4 form of a loopback address"},
		{"2002:a00:1::", "a 6to4 form of a private address"},
		{"2002:c0a8:101:1::1", "a 6to4 form of a private address"},
		{"2002:a9fe:a9fe::1", "a 6to4 form of a link-local address"},
		{"2002::1", "a 6to4 form of an unspecified address"},
		{"2002:6440:1::", "a 6to4 form of a carrier-grade NAT address"},
		{"2002:e000:1::", "a 6to4 form of a multicast address"},
		{"2002:ffff:ffff::", "a 6to4 form of a broadcast address"},
		// 6to4 embedding an IPv4-mapped-looking value still checks the IPv4 only.
		{"2002:808:808:ffff:ffff::7f00:1", ""},
	}
	for _, tt := range tests {
		ip := netip.MustParseAddr(tt.addr)
		reason, ok := blocked(ip)
		if ok != (tt.reason != "") || reason != tt.reason {
			t.Errorf("blocked(%s) = %q, %v; want %q", tt.addr, reason, ok, tt.reason)
		}
	}
	if _, ok := blocked(netip.Addr{}); !ok {
		t.Error("the zero Addr must be blocked")
	}
}

// Every row of the table, at its first and last address and in its
// IPv4-mapped form, is refused with the row's reason (or, for an embedding
// row, judged by the IPv4 address embedded; or by a more specific row
// listed before it); the address just outside each end is not decided by
// that row.
func TestBlockedEveryRow(t *testing.T) {
	t.Parallel()
	for i, row := range specialPrefixes {
		p := row.prefix
		if p != p.Masked() {
			t.Errorf("row %d: %s is not a masked prefix", i, p)
		}
		firstAddr, lastAddr := p.Addr(), lastIn(p)
		for _, ip := range []netip.Addr{firstAddr, lastAddr} {
			// A more specific row listed earlier decides its own addresses
			// (0.0.0.0 within 0.0.0.0/8): judge by the deciding row.
			decider := specialPrefixes[firstRow(ip)]
			if decider.embeds == never && row.embeds == never {
				if _, ok := blocked(ip); !ok {
					t.Errorf("row %d %s: %s is not blocked", i, p, ip)
				}
			}
			want := decider.reason
			if decider.embeds != never {
				a := ip.As16()
				v4 := netip.AddrFrom4([4]byte(a[12:16]))
				if decider.embeds == sixToFour {
					v4 = netip.AddrFrom4([4]byte(a[2:6]))
				}
				r, ok := blocked(v4)
				if !ok {
					want = ""
				} else {
					want += r
				}
			}
			got, ok := blocked(ip)
			if got != want || ok != (want != "") {
				t.Errorf("row %d %s: blocked(%s) = %q, %v; want %q", i, p, ip, got, ok, want)
			}
			if ip.Is4() {
				mapped := netip.AddrFrom16(ip.As16())
				if got2, ok2 := blocked(mapped); got2 != got || ok2 != ok {
					t.Errorf("row %d: blocked(%s) = %q, %v; blocked(%s) = %q, %v", i, ip, got, ok, mapped, got2, ok2)
				}
			}
		}
		// Just outside: a different row or none decides, never this one
		// (unless a neighbour row has the same reason).
		for _, out := range []netip.Addr{firstAddr.Prev(), lastAddr.Next()} {
			if !out.IsValid() {
				continue
			}
			if r := firstRow(out); r == i {
				t.Errorf("row %d %s also matches %s", i, p, out)
			}
		}
	}
}

// firstRow is the index of the row that decides ip, or -1.
func firstRow(ip netip.Addr) int {
	for i, row := range specialPrefixes {
		if row.prefix.Contains(ip.Unmap()) {
			return i
		}
	}
	return -1
}

// lastIn is the last address of p.
func lastIn(p netip.Prefix) netip.Addr {
	a := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range a {
		for b := 0; b < 8; b++ {
			if i*8+b >= bits {
				a[i] |= 0x80 >> b
			}
		}
	}
	ip, _ := netip.AddrFromSlice(a)
	return ip
}

// fakeResolver maps host names to addresses without DNS.
type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func addrPort(t *testing.T, rawURL string) netip.AddrPort {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return netip.MustParseAddrPort(u.Host)
}

func TestGuardRefusesLoopback(t *testing.T) {
	t.Parallel()
	srv, hits := server(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "secret") })
	port := addrPort(t, srv.URL).Port()

	h := setup(t, HTTPConfig{})
	for _, u := range []string{
		srv.URL,
		fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/", port),
		fmt.Sprintf("http://0.0.0.0:%d/", port), // Linux connects this to localhost
		fmt.Sprintf("http://localhost:%d/", port),
	} {
		res := h.Fetch(t.Context(), Request{URL: u})
		if res.Outcome != Failed || !strings.HasPrefix(res.Reason, "refused: ") || !errors.Is(res.Err, ErrRefusedAddress) {
			t.Errorf("%s: got %s %q (err %v), want refused", u, res.Outcome, res.Reason, res.Err)
		}
		if strings.Contains(res.Reason, "--") {
			t.Errorf("%s: Reason %q names a CLI flag; the library states the fact", u, res.Reason)
		}
	}
	res := h.Fetch(t.Context(), Request{URL: srv.URL})
	if want := "refused: 127.0.0.1 is a loopback address"; res.Reason != want {
		t.Errorf("Reason = %q, want %q", res.Reason, want)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the guarded server received %d requests", n)
	}

	allowed := setup(t, HTTPConfig{AllowPrivateNetworks: true})
	if res := allowed.Fetch(t.Context(), Request{URL: srv.URL}); res.Outcome != OK || res.ContentHash != sha([]byte("secret")) {
		t.Fatalf("with AllowPrivateNetworks: %+v, want ok", res)
	}
	if hits.Load() != 1 {
		t.Fatalf("hits = %d, want 1", hits.Load())
	}
}

func TestGuardChecksResolvedAddresses(t *testing.T) {
	t.Parallel()
	h := setup(t, HTTPConfig{Resolver: fakeResolver{
		"intranet.example": {netip.MustParseAddr("10.1.2.3")},
		"metadata.example": {netip.MustParseAddr("::ffff:169.254.169.254")},
		// One public and one private answer: a DNS-rebinding trick.
		"mixed.example": {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("192.168.0.10")},
	}})
	tests := []struct{ url, reason string }{
		{"http://intranet.example/", "refused: 10.1.2.3 is a private address"},
		{"https://metadata.example/latest/", "refused: 169.254.169.254 is a link-local address"},
		{"http://mixed.example:8080/", "refused: 192.168.0.10 is a private address"},
		{"http://nowhere.example/", "transport: lookup nowhere.example: no such host"},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		res := h.Fetch(ctx, Request{URL: tt.url})
		cancel()
		if res.Outcome != Failed || !strings.HasPrefix(res.Reason, tt.reason) ||
			errors.Is(res.Err, ErrRefusedAddress) != strings.HasPrefix(tt.reason, "refused") {
			t.Errorf("%s: got %s %q (err %v), want %q", tt.url, res.Outcome, res.Reason, res.Err, tt.reason)
		}
	}
}

// A redirect from an allowed host to a private address is refused at the
// redirect hop. "public.example" resolves to the loopback test server, which
// the guard treats as public through an exact address:port exception; every
// other loopback port remains private.
func TestGuardRefusesRedirectToPrivate(t *testing.T) {
	t.Parallel()
	private, privateHits := server(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "internal") })
	privatePort := addrPort(t, private.URL).Port()
	public, publicHits := server(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/to-ip":
			http.Redirect(w, r, private.URL+"/admin", http.StatusFound)
		case "/to-name":
			http.Redirect(w, r, fmt.Sprintf("http://private.example:%d/admin", privatePort), http.StatusMovedPermanently)
		case "/to-self":
			http.Redirect(w, r, "/page", http.StatusFound)
		default:
			fmt.Fprint(w, "public page")
		}
	})
	publicAP := addrPort(t, public.URL)
	loopback := netip.MustParseAddr("127.0.0.1")
	resolver := fakeResolver{"public.example": {loopback}, "private.example": {loopback}}
	publicURL := fmt.Sprintf("http://public.example:%d", publicAP.Port())

	// Control: without the exception even the "public" server is refused.
	plain := setup(t, HTTPConfig{Resolver: resolver})
	if res := plain.Fetch(t.Context(), Request{URL: publicURL + "/"}); res.Outcome != Failed || !strings.HasPrefix(res.Reason, "refused: ") {
		t.Fatalf("without the exception: %+v, want refused", res)
	}

	h := setup(t, HTTPConfig{Resolver: resolver})
	h.guard.allow = []netip.AddrPort{publicAP}

	// The exception lets the public host through, including a redirect to itself.
	for _, path := range []string{"/", "/to-self"} {
		if res := h.Fetch(t.Context(), Request{URL: publicURL + path}); res.Outcome != OK || res.ContentHash != sha([]byte("public page")) {
			t.Fatalf("%s: %+v, want ok", path, res)
		}
	}
	for _, path := range []string{"/to-ip", "/to-name"} {
		before := publicHits.Load()
		res := h.Fetch(t.Context(), Request{URL: publicURL + path})
		want := "refused: 127.0.0.1 is a loopback address"
		if res.Outcome != Failed || res.Reason != want || !errors.Is(res.Err, ErrRefusedAddress) {
			t.Errorf("%s: got %s %q, want %q", path, res.Outcome, res.Reason, want)
		}
		if publicHits.Load() != before+1 {
			t.Errorf("%s: the first hop did not reach the public server", path)
		}
	}
	if n := privateHits.Load(); n != 0 {
		t.Fatalf("the private server received %d requests", n)
	}

	// With AllowPrivateNetworks the same redirect is followed.
	open := setup(t, HTTPConfig{Resolver: resolver, AllowPrivateNetworks: true})
	if res := open.Fetch(t.Context(), Request{URL: publicURL + "/to-name"}); res.Outcome != OK || res.ContentHash != sha([]byte("internal")) {
		t.Fatalf("allowed: %+v, want ok", res)
	}
}

// The socket-level check (Control) refuses on its own, even if the
// resolve-and-check step were bypassed.
func TestGuardControlHook(t *testing.T) {
	t.Parallel()
	d := newDialer(&guard{}, fakeResolver{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = d.net.DialContext(t.Context(), "tcp", ln.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "refused: 127.0.0.1 is a loopback address") || !errors.Is(err, ErrRefusedAddress) {
		t.Fatalf("raw dial err = %v, want refused by Control", err)
	}
}
