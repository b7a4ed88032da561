package fetch

import (
	"errors"
	"net/http"
	"net/netip"
	"testing"
)

// GuardExempt lets exactly the pairs it lists through a guard that stays
// on: another loopback port is refused, and so is a redirect from the
// exempt server to a private address.
func TestGuardExempt(t *testing.T) {
	t.Parallel()
	other, otherHits := server(t, func(w http.ResponseWriter, r *http.Request) {})
	exempt, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/away" {
			http.Redirect(w, r, other.URL+"/", http.StatusFound)
		}
	})
	ap := netip.MustParseAddrPort(exempt.Listener.Addr().String())
	h := setup(t, HTTPConfig{GuardExempt: []netip.AddrPort{ap}})
	if res := h.Fetch(t.Context(), Request{URL: exempt.URL + "/"}); res.Outcome != OK {
		t.Fatalf("exempt pair: %+v, want ok", res)
	}
	for _, u := range []string{other.URL + "/", exempt.URL + "/away"} {
		if res := h.Fetch(t.Context(), Request{URL: u}); res.Outcome != Failed || !errors.Is(res.Err, ErrRefusedAddress) {
			t.Errorf("%s: %+v, want refused", u, res)
		}
	}
	if n := otherHits.Load(); n != 0 {
		t.Fatalf("the other port was reached %d times", n)
	}
}
