package fetch

import (
	"net/netip"
	"testing"
)

// FuzzBlocked: for any address, blocked does not panic, gives a reason
// exactly when it blocks, judges an IPv4-mapped, NAT64 (64:ff9b::/96) or
// 6to4 (2002::/16) address as the IPv4 address it carries, ignores zones,
// and blocks every address of every never-allowed row.
func FuzzBlocked(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1", "8.8.8.8", "::1", "::ffff:10.0.0.1", "64:ff9b::a9fe:a9fe",
		"2002:c0a8:101::1", "2001::1", "fe80::1", "255.255.255.255", "2606:4700::1111",
	} {
		f.Add(netip.MustParseAddr(s).AsSlice())
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var b [16]byte
		copy(b[:], raw)
		a16 := netip.AddrFrom16(b)
		v4 := netip.AddrFrom4([4]byte(b[:4]))

		check := func(ip netip.Addr) (string, bool) {
			r, ok := blocked(ip)
			if ok != (r != "") {
				t.Fatalf("blocked(%s) = %q, %v: a reason exactly when blocked", ip, r, ok)
			}
			return r, ok
		}
		r16, ok16 := check(a16)
		r4, ok4 := check(v4)

		mapped := netip.AddrFrom16(v4.As16())
		if r, ok := check(mapped); r != r4 || ok != ok4 {
			t.Fatalf("blocked(%s) = %q, %v but blocked(%s) = %q, %v", mapped, r, ok, v4, r4, ok4)
		}
		if r, ok := check(a16.WithZone("eth0")); r != r16 || ok != ok16 {
			t.Fatalf("a zone changed the verdict on %s", a16)
		}

		var nat, six [16]byte
		copy(nat[:], netip.MustParseAddr("64:ff9b::").AsSlice())
		copy(nat[12:], b[:4])
		if _, ok := check(netip.AddrFrom16(nat)); ok != ok4 {
			t.Fatalf("NAT64 form of %s: blocked %v, the IPv4 address %v", v4, ok, ok4)
		}
		six = b
		six[0], six[1] = 0x20, 0x02
		copy(six[2:6], b[:4])
		if _, ok := check(netip.AddrFrom16(six)); ok != ok4 {
			t.Fatalf("6to4 form %s of %s: blocked %v, the IPv4 address %v", netip.AddrFrom16(six), v4, ok, ok4)
		}

		for _, ip := range []netip.Addr{a16, v4} {
			row := firstRow(ip)
			if row >= 0 && specialPrefixes[row].embeds == never {
				if r, ok := check(ip); !ok || r != specialPrefixes[row].reason {
					t.Fatalf("%s is in %s (%q) but blocked = %q, %v", ip, specialPrefixes[row].prefix, specialPrefixes[row].reason, r, ok)
				}
			}
			if row < 0 {
				if _, ok := check(ip.Unmap()); ok {
					t.Fatalf("%s matches no row but is blocked", ip)
				}
			}
		}
	})
}
