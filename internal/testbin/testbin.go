// Package testbin builds the fleetpace binary for the tests that run it as a
// real process (the CLI's, the demo's, the deployment's, the integration
// tests), once per test binary:
//
//	var binary string
//
//	func TestMain(m *testing.M) { testbin.Main(m, &binary) }
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"go.uber.org/goleak"
)

// Options are extra settings for the build.
type Options struct {
	Env  []string // added to the environment of `go build`
	Args []string // added to its flags
}

// Main builds cmd/fleetpace into a temporary directory and sets *path to
// the binary, runs the tests (m.Run: a *testing.M, or testdb.M(m) to stop
// a test cluster after them), fails a successful run that left goroutines
// behind (goleak), removes the directory and exits with the tests' code.
func Main(m interface{ Run() int }, path *string) { MainWith(m, path, Options{}) }

// MainWith is Main with extra build settings.
func MainWith(m interface{ Run() int }, path *string, o Options) {
	dir, err := os.MkdirTemp("", "fleetpace-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testbin:", err)
		os.Exit(1)
	}
	*path = filepath.Join(dir, "fleetpace")
	args := append(append([]string{"build"}, o.Args...), "-o", *path, "github.com/fleetpace/fleetpace/cmd/fleetpace")
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), o.Env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbin: build fleetpace: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}
