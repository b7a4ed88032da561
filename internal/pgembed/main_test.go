package pgembed_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/pgembed"
)

// childEnv makes the test binary a process that starts a temporary
// cluster, prints its URL, data directory and watchdog's pid, and waits to
// be killed (TestWatchdogStopsAnOrphanedCluster).
const childEnv = "FLEETPACE_PGEMBED_TEST_CHILD"

// TestMain fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		c, err := pgembed.Start(context.Background(), pgembed.Config{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("%s %s %d\n", c.URL("postgres"), filepath.Dir(c.DataDir()), pgembed.WatchdogPID(c))
		select {}
	}
	goleak.VerifyTestMain(m)
}
