package cli

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fleetpace/fleetpace/fetch"
)

// The hint follows the fetcher's own words: a real refusal by the SSRF
// guard gets it, other reasons do not.
func TestShowReasonHintsAtRefusals(t *testing.T) {
	t.Parallel()
	h, err := fetch.NewHTTP(fetch.HTTPConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.CloseIdleConnections()
	r := h.Fetch(context.Background(), fetch.Request{URL: "http://127.0.0.1:1/feed"})
	if !errors.Is(r.Err, fetch.ErrRefusedAddress) {
		t.Fatalf("the fetcher did not refuse 127.0.0.1: %+v", r)
	}
	if got := showReason(r.Reason); !strings.HasSuffix(got, " (use --allow-private-networks)") || !strings.HasPrefix(got, r.Reason) {
		t.Fatalf("showReason(%q) = %q, want the hint", r.Reason, got)
	}
	for _, other := range []string{"HTTP 404 Not Found", "transport: connection refused", "refused by the server"} {
		if got := showReason(other); got != other {
			t.Errorf("showReason(%q) = %q, want it unchanged", other, got)
		}
	}
}
