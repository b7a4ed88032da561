package sourcefile_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// TestMain runs the tests on a database of their own and fails the package
// when a test leaves a goroutine behind.
func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }
