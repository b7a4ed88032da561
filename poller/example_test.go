package poller_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetpace/fleetpace/poller"
)

// A scan loop: polls until ctx ends, backing off while there is nothing to
// do. Sleep is injected here only to make the example instant and its
// output exact; real callers leave it nil.
func ExampleRun() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var slept []time.Duration
	cfg := poller.Config{
		Max:           8 * time.Second,
		StartupJitter: poller.NoStartupJitter, // what `--startup-jitter 0` maps to
		JitterRatio:   poller.NoJitter,        // for an exact output only
		Sleep: func(ctx context.Context, d time.Duration) error {
			slept = append(slept, d)
			return ctx.Err()
		},
	}
	found := []bool{false, false, false, false, false, true, false}
	i := 0
	err := poller.Run(ctx, cfg, func(ctx context.Context) (bool, error) {
		f := found[i]
		if i++; i == len(found) {
			cancel()
		}
		return f, nil
	})
	fmt.Println(err, slept)
	// Output: <nil> [1s 2s 4s 8s 8s 1s]
}
