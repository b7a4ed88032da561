package riverpace_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// TestMain runs the tests on one embedded cluster, then checks that no
// goroutine is left running (River clients, pacers, servers).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testdb.M(m))
}
