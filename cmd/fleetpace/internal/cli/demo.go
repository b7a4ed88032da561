package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/demo"
)

func (a *app) demoCmd() *cobra.Command {
	var (
		cfg   demo.Config
		plain bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "The whole system on a throwaway embedded database, a local fake destination and real worker processes",
		Long: `Start a throwaway PostgreSQL cluster, a fake destination on loopback and
--workers real ` + "`fleetpace worker`" + ` processes, and let them poll 300 sources on
three platforms for --duration:

  steady     ceiling 20/s; the destination accepts everything
  throttled  ceiling 12/s; the destination allows only 5/s, so 429s raise the
             fleet's shared backoff multiplier until it fits
  cooldown   ceiling 8/s; after a quarter of the run the destination answers
             a burst of 429s with a long Retry-After, and the whole fleet
             cools the platform down

Progress (requests/s against the ceiling, multiplier, 429s, cooldown left,
sources checked) is redrawn in place on a terminal and printed as plain lines
otherwise. At the end: a summary table (limit in 1 s = ceiling + burst;
checked = sources fetched at least once, of the platform's), a line per
platform saying what it shows and what happened, and a chart (--chart; SVG,
or PNG if the name ends in .png): per platform, requests/s at the
destination against its ceiling and the destination's own limit, and the
shared multiplier over time, under the verdict.

Exit 0 only if no platform's ceiling (plus its burst) was exceeded in any 1-s
window at the destination; otherwise exit 1 naming the window. Ctrl-C or
SIGTERM stops the workers, the destination and the cluster and removes the
temporary directory. The demo ignores --database-url and DATABASE_URL.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			cfg.Terminal = !plain && isTerminal(a.stdout)
			cfg.Logger = a.logger
			_, err := demo.Run(cmd.Context(), cfg, a.stdout)
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Workers, "workers", demo.DefaultWorkers, "worker processes to start")
	f.DurationVar(&cfg.Duration, "duration", demo.DefaultDuration, "how long the workers run")
	f.IntVar(&cfg.Sources, "sources", demo.DefaultSources, "sources, split over the three platforms")
	f.StringVar(&cfg.ChartPath, "chart", demo.DefaultChartPath, "chart file written at the end (.svg, or .png)")
	f.StringVar(&cfg.TmpDir, "tmp-dir", "", "where the demo's temporary directory is created and removed (default: $TMPDIR or /tmp)")
	f.BoolVar(&plain, "plain", false, "print progress as plain lines even on a terminal")
	zeroIsDefault(f, "workers", "duration", "sources", "chart")
	return cmd
}

// isTerminal reports whether w is a character device (a terminal), where
// progress can be redrawn in place.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
