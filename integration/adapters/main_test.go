package adapters

import (
	"flag"
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/internal/testproc"
)

// TestMain runs the tests on one embedded cluster, then checks that no
// goroutine is left running (River clients, pacers, senders). A child
// process (testproc) ends in testproc.Exit, before this check. Under -short
// (the fast tier) it runs no test: each runs three processes for seconds.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() && !testproc.IsChild() {
		_ = flag.Set("test.run", "^$")
	}
	goleak.VerifyTestMain(testdb.M(m))
}
