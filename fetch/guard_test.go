package fetch

import (
	"context"
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
		// IPv4 public
		{"8.8.8.8", ""},
		{"93.184.216.34", ""},
		{"1.1.1.1", ""},
		{"172.15.255.255", ""},
		{"172.32.0.0", ""},
		{"192.169.0.1", ""},
		{"100.63.255.255", ""},
		{"100.128.0.0", ""},
		{"169.253.255.255", ""},
		{"11.0.0.1", ""},
		{"223.255.255.255", ""},
		// IPv4 blocked
		{"127.0.0.1", "a loopback address"},
		{"127.255.255.254", "a loopback address"},
		{"10.0.0.1", "a private address"},
		{"10.255.255.255", "a private address"},
		{"172.16.0.1", "a private address"},
		{"172.31.255.255", "a private address"},
		{"192.168.1.1", "a private address"},
		{"169.254.169.254", "a link-local address"},
		{"169.254.0.1", "a link-local address"},
		{"0.0.0.0", "an unspecified address"},
		{"0.1.2.3", `a "this network" address`},
		{"224.0.0.1", "a multicast address"},
		{"239.255.255.250", "a multicast address"},
		{"100.64.0.1", "a carrier-grade NAT address"},
		{"100.127.255.255", "a carrier-grade NAT address"},
		{"255.255.255.255", "a reserved or broadcast address"},
		{"240.0.0.1", "a reserved or broadcast address"},
		// IPv6 public
		{"2001:4860:4860::8888", ""},
		{"2606:4700:4700::1111", ""},
		{"2a00:1450:4001:80b::200e", ""},
		{"fbff:ffff::1", ""},
		{"fe00::1", ""},
		// IPv6 blocked
		{"::1", "a loopback address"},
		{"::", "an unspecified address"},
		{"fc00::1", "a private address"},
		{"fd12:3456:789a::1", "a private address"},
		{"fe80::1", "a link-local address"},
		{"fe80::1%eth0", "a link-local address"},
		{"febf:ffff::1", "a link-local address"},
		{"fec0::1", "a site-local address"},
		{"ff02::1", "a multicast address"},
		{"ff05::1:3", "a multicast address"},
		{"::127.0.0.1", "an IPv4-compatible address"},
		{"::10.0.0.1", "an IPv4-compatible address"},
		// IPv4-mapped IPv6
		{"::ffff:127.0.0.1", "a loopback address"},
		{"::ffff:10.1.2.3", "a private address"},
		{"::ffff:192.168.0.1", "a private address"},
		{"::ffff:169.254.169.254", "a link-local address"},
		{"::ffff:0.0.0.0", "an unspecified address"},
		{"::ffff:100.64.0.1", "a carrier-grade NAT address"},
		{"::ffff:224.0.0.1", "a multicast address"},
		{"::ffff:7f00:1", "a loopback address"}, // hex spelling of ::ffff:127.0.0.1
		{"::ffff:8.8.8.8", ""},
		// NAT64
		{"64:ff9b::8.8.8.8", ""},
		{"64:ff9b::127.0.0.1", "a NAT64 form of a loopback address"},
		{"64:ff9b::a9fe:a9fe", "a NAT64 form of a link-local address"},
		{"64:ff9b:1::10.0.0.1", "a NAT64 form of a private address"},
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
		if res.Outcome != Failed || !strings.HasPrefix(res.Reason, "refused: ") ||
			!strings.Contains(res.Reason, "(private networks are not allowed)") {
			t.Errorf("%s: got %s %q, want refused", u, res.Outcome, res.Reason)
		}
	}
	res := h.Fetch(t.Context(), Request{URL: srv.URL})
	if want := "refused: 127.0.0.1 is a loopback address (private networks are not allowed)"; res.Reason != want {
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
		if res.Outcome != Failed || !strings.HasPrefix(res.Reason, tt.reason) {
			t.Errorf("%s: got %s %q, want %q", tt.url, res.Outcome, res.Reason, tt.reason)
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
		want := "refused: 127.0.0.1 is a loopback address (private networks are not allowed)"
		if res.Outcome != Failed || res.Reason != want {
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
	if err == nil || !strings.Contains(err.Error(), "refused: 127.0.0.1 is a loopback address") {
		t.Fatalf("raw dial err = %v, want refused by Control", err)
	}
}
