// Command fleetpace polls many sources from a fleet of worker processes
// without exceeding any destination's rate. See `fleetpace --help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
