package integration

import (
	"strings"
	"testing"
)

// The SSRF guard end to end: a source on 127.0.0.1 is refused without
// --allow-private-networks — recorded as a failed check whose last_error
// says why, and the destination never sees a connection — and fetched with
// it.
//
// The other half of the guard, a redirect from an allowed host to a private
// address, cannot be built end to end here: without network access every
// host the test can serve is itself private, so there is no "allowed" host to
// redirect from. It is tested where the host→address mapping can be faked:
// fetch.TestGuardRefusesRedirectToPrivate (fetch/guard_test.go) resolves
// "public.example" to the test server through the guard's exception for one
// loopback port, and checks that the redirect hop to a private address is
// refused (and followed with AllowPrivateNetworks).
func TestSSRFGuard(t *testing.T) {
	t.Parallel()
	url := newURL(t)
	d := newDest(t, nil)
	setPlatform(t, url, "s", "--rate", "50")
	cli(t, url, "sources", "add", "--platform", "s", "--url", d.URL()+"/s/private")

	// Without the flag: refused, recorded, nothing reaches the destination.
	cli(t, url, "enqueue", "--platform", "s")
	cli(t, url, "drain", "--max-duration", "30s")
	srcs := listSources(t, url)
	if len(srcs) != 1 {
		t.Fatalf("sources: %+v", srcs)
	}
	s := srcs[0]
	if s.LastOutcome == nil || *s.LastOutcome != "failed" || s.LastError == nil || s.LastCheckedAt == nil {
		t.Fatalf("refused fetch not recorded as a failed check: %+v", s)
	}
	t.Logf("ssrf: refused with last_error %q", *s.LastError)
	if e := *s.LastError; !strings.Contains(e, "refused") || !strings.Contains(e, "127.0.0.1 is a loopback address") {
		t.Errorf("last_error %q does not say the loopback address was refused and why", e)
	}
	if n := d.Count(""); n != 0 {
		t.Errorf("the destination received %d request(s) from a refused fetch", n)
	}

	// With the flag: fetched.
	cli(t, url, "enqueue", "1")
	cli(t, url, "drain", "--max-duration", "30s", "--allow-private-networks")
	s = listSources(t, url)[0]
	if s.LastOutcome == nil || *s.LastOutcome != "ok" || s.LastError != nil {
		t.Errorf("with --allow-private-networks: outcome %v, error %v; want ok", deref(s.LastOutcome), deref(s.LastError))
	}
	if n := d.Count("/s/private"); n != 1 {
		t.Errorf("with --allow-private-networks the destination received %d request(s), want 1", n)
	}
}

func deref[S ~string](p *S) string {
	if p == nil {
		return "<nil>"
	}
	return string(*p)
}
