package bench

import (
	"testing"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }
