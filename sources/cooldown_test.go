package sources_test

import (
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/sources"
)

// A cooldown says which rule set its length, in words.
func TestCooldownRule(t *testing.T) {
	t.Parallel()
	const platform = 15 * time.Minute
	for _, tt := range []struct {
		cd             sources.Cooldown
		headline, rule string
	}{
		{sources.Cooldown{Count: 1, Cause: sources.CauseSlowestPace, RetryAfter: 10 * time.Second}, "max multiplier reached",
			"a 10s Retry-After came while the platform was paced as slowly as it may be (ceiling ÷ max multiplier) → the platform's 15m cooldown"},
		{sources.Cooldown{Count: 1, Cause: sources.CauseSlowestPace}, "max multiplier reached",
			"rate pressure came while the platform was paced as slowly as it may be (ceiling ÷ max multiplier) → the platform's 15m cooldown"},
		{sources.Cooldown{Count: 2, Cause: sources.CauseRetryAfter, RetryAfter: 2 * time.Hour}, "Retry-After 2h",
			"the destination asked for a 2h Retry-After → the 2h Retry-After (longer than the platform's 15m cooldown), doubled for a repeat within 15m of the last cooldown (×2)"},
		{sources.Cooldown{Count: 3}, "rate limited",
			"the fetcher said stop → the platform's 15m cooldown, doubled 2 times for 2 repeats, each within 15m of the last cooldown (×4)"},
	} {
		if got := tt.cd.Headline(); got != tt.headline {
			t.Errorf("%+v: headline %q, want %q", tt.cd, got, tt.headline)
		}
		if got := tt.cd.Rule(platform); got != tt.rule {
			t.Errorf("%+v: rule\n %q\nwant\n %q", tt.cd, got, tt.rule)
		}
	}
}
