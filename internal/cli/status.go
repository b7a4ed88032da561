package cli

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/status"
)

func (a *app) statusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show platforms, shared pacer state, cooldowns, and queued / due counts per platform",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				rep, err := status.Read(cmd.Context(), pool)
				if err != nil {
					return dbError(err)
				}
				if asJSON {
					return writeJSON(a.stdout, rep)
				}
				fmt.Fprintf(a.stdout, "live workers: %d\n", rep.Workers)
				for _, w := range rep.Fleet {
					fmt.Fprintf(a.stdout, "  %s  %s pid %d  fleetpace %s  up %s  seen %s ago\n", w.ID, w.Hostname, w.PID, w.Version,
						roundDur(rep.At.Sub(w.StartedAt)), roundDur(rep.At.Sub(w.SeenAt)))
				}
				fmt.Fprintln(a.stdout)
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "PLATFORM\tRATE/S\tMULT\tEFFECTIVE/S\tHOLD\tCOOLDOWN\tSOURCES\tQUEUED\tDUE\tNEVER CHECKED\tSTALE MAX\tSTALE P95")
				for _, p := range rep.Platforms {
					hold := "-"
					if p.Pace.Hold > 0 {
						hold = roundDur(p.Pace.Hold)
					}
					cd := "-"
					if p.Cooldown != nil {
						cd = fmt.Sprintf("%s left (×%d: %s)", roundDur(p.Cooldown.Remaining), p.Cooldown.Count, p.Cooldown.Reason)
					}
					c := p.Counts
					fmt.Fprintf(tw, "%s\t%g\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.RatePerSec,
						fmt.Sprintf("%g", p.Pace.Multiplier), fmt.Sprintf("%.3g", p.Pace.EffectiveRate), hold, cd,
						c.Sources, c.Queued, c.Due, c.NeverChecked, roundDur(c.StaleMax), roundDur(c.StaleP95))
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func roundDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.SortedFunc(maps.Keys(m), cmp.Compare[string])
}
