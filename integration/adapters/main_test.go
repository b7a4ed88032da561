package adapters

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// TestMain runs the tests on one embedded cluster, then checks that no
// goroutine is left running (River clients, pacers, senders). A child
// process (testproc) ends in testproc.Exit, before this check.
func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }
