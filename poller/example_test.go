package poller_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/poller"
)

// A scan loop: polls until ctx ends, backing off while there is nothing to
// do. A fake clock that advances itself is injected here only to make the
// example instant and its output exact; real callers leave Clock nil.
func ExampleRun() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	virtual := clocktest.NewAuto()
	cfg := poller.Config{
		Max:           8 * time.Second,
		StartupJitter: poller.NoStartupJitter, // what `--startup-jitter 0` maps to
		JitterRatio:   poller.NoJitter,        // for an exact output only
		Clock:         virtual,
	}
	// A new loop is settled (8 s while it finds nothing); after work it
	// backs off from the base again.
	found := []bool{false, true, false, false, false, false, true, false}
	i := 0
	err := poller.Run(ctx, cfg, func(ctx context.Context) (bool, error) {
		f := found[i]
		if i++; i == len(found) {
			cancel()
		}
		return f, nil
	})
	fmt.Println(err, virtual.Sleeps())
	// Output: <nil> [8s 1s 1s 2s 4s 8s 1s]
}
