package bench

import (
	"testing"

	"github.com/fleetpace/fleetpace/internal/testdb"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }
