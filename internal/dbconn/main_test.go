package dbconn_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// TestMain fails the package when a test leaves a goroutine behind, and
// stops the test cluster (testdb) if a test started one.
func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }
