package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
)

// DefaultWatchInterval is how often `status --watch` refreshes, and
// MinWatchInterval and MaxWatchInterval bound it: faster would load the
// database for nothing a reader can follow.
const (
	DefaultWatchInterval = 2 * time.Second
	MinWatchInterval     = 100 * time.Millisecond
	MaxWatchInterval     = time.Hour
)

func (a *app) statusCmd() *cobra.Command {
	var (
		asJSON   bool
		watch    bool
		interval time.Duration
		topKeys  int
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each platform's ceiling, effective rate, pause/cooldown/hold, due / queued / failing counts and staleness",
		Long: `Show the live workers and, per platform: its ceiling and the rate the fleet
paces it at now (and what decides it: the ceiling, the shared backoff
multiplier, the destination's announced limit, a hold or a pause), whether it
is paused, cooling down or held (with the reason and the time left), its
sources due now (as ` + "`sources list --due`" + ` counts them), queued and
failing, how many it fetched over the last minute, and how late its most
overdue sources are.

--watch refreshes every --interval: in place on a terminal, as successive
snapshots otherwise; Ctrl-C stops it.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < MinWatchInterval || interval > MaxWatchInterval {
				return usagef("--interval: must be in [%s, %s], got %s", MinWatchInterval, MaxWatchInterval, interval)
			}
			if topKeys < 0 || topKeys > sources.MaxTopKeys {
				return usagef("--top-keys: must be in [0, %d], got %d", sources.MaxTopKeys, topKeys)
			}
			if topKeys == 0 {
				topKeys = -1 // none (ReadTop's 0 is the default)
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				show := func() error {
					rep, err := status.ReadTop(cmd.Context(), pool, topKeys)
					if err != nil {
						return dbError(err)
					}
					if asJSON {
						return writeJSON(a.stdout, rep)
					}
					return writeStatus(a.stdout, rep)
				}
				if !watch {
					return show()
				}
				return a.watch(cmd.Context(), interval, show)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (durations in seconds, under keys ending in _s)")
	cmd.Flags().BoolVar(&watch, "watch", false, "refresh until Ctrl-C")
	cmd.Flags().DurationVar(&interval, "interval", DefaultWatchInterval, fmt.Sprintf("with --watch: time between refreshes (%s to %s)", MinWatchInterval, MaxWatchInterval))
	cmd.Flags().IntVar(&topKeys, "top-keys", sources.DefaultTopKeys, fmt.Sprintf("keys under the most pressure shown per platform (held, slowed, open requests; 0 to %d)", sources.MaxTopKeys))
	return cmd
}

// watch runs show every interval until ctx ends (Ctrl-C: a clean exit). On
// a terminal each refresh replaces the last one (the screen is cleared and
// redrawn); otherwise the snapshots follow each other, each headed by its
// time. A failed read is shown and tried again at the next refresh.
func (a *app) watch(ctx context.Context, interval time.Duration, show func() error) error {
	tty := isTerminal(a.stdout)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if tty {
			fmt.Fprint(a.stdout, "\x1b[H\x1b[2J") // cursor home, clear screen
		}
		fmt.Fprintf(a.stdout, "--- %s (every %s; Ctrl-C to stop)\n", time.Now().Format(time.TimeOnly), interval)
		if err := show(); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintf(a.stdout, "fleetpace: %v\n", err)
		}
		if !tty {
			fmt.Fprintln(a.stdout)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// writeStatus writes the report as a table: one line per platform.
func writeStatus(w io.Writer, rep *status.Report) error {
	fmt.Fprintf(w, "live workers: %d\n", rep.Workers)
	for _, wk := range rep.Fleet {
		fmt.Fprintf(w, "  %s  %s pid %d  fleetpace %s  up %s  seen %s ago\n", wk.ID, wk.Hostname, wk.PID, wk.Version,
			roundDur(rep.At.Sub(wk.StartedAt)), roundDur(rep.At.Sub(wk.SeenAt)))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PLATFORM\tCEILING/S\tEFFECTIVE/S\tMULT\tSTATE\tDUE\tQUEUED\tFAILING\tLAST MIN\tSTALE MAX\tSTALE P95")
	for _, p := range rep.Platforms {
		c := p.Counts
		fmt.Fprintf(tw, "%s\t%g\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.RatePerSec,
			fmtRate(p.Pace), fmt.Sprintf("%.3g", p.Pace.Multiplier), platformState(p), c.Due, c.Queued, c.Failing,
			p.Recent.Total(), roundDur(c.StaleMax), roundDur(c.StaleP95))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeKeys(w, rep)
}

// writeKeys writes, for each platform with keys in use or a cap on open
// requests, its keys in aggregate and its top keys under pressure.
func writeKeys(w io.Writer, rep *status.Report) error {
	header := false
	for _, p := range rep.Platforms {
		k := p.Keys
		if k == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w, "\nkeys (per platform: in use, held, slowed, open requests; the top keys under pressure):")
			header = true
		}
		inFlight := fmt.Sprintf("%d", k.InFlight)
		if p.MaxInFlight > 0 {
			inFlight += fmt.Sprintf(", platform %d/%d", k.PlatformInFlight, p.MaxInFlight)
		}
		fmt.Fprintf(w, "  %s: %d in use, %d held, %d slowed, in flight %s\n", p.Name, k.InUse, k.Held, k.Slowed, inFlight)
		for _, t := range k.Top {
			var parts []string
			if t.Hold > 0 {
				parts = append(parts, "held "+roundDur(t.Hold))
			}
			if t.Slowed {
				parts = append(parts, fmt.Sprintf("slowed to %.3g/s of %g/s", t.EffectiveRate, t.Rate))
			}
			if t.InFlight > 0 {
				parts = append(parts, fmt.Sprintf("%d in flight", t.InFlight))
			}
			fmt.Fprintf(w, "    %s: %s\n", showKey(t.Key), strings.Join(parts, ", "))
		}
	}
	return nil
}

// fmtRate is the effective rate and, when it is not the ceiling, what
// decides it.
func fmtRate(s pacer.State) string {
	r := fmt.Sprintf("%.3g", s.EffectiveRate)
	switch s.PacedBy {
	case pacer.PacedByPause, pacer.PacedByHold:
		return "0"
	case pacer.PacedByCeiling, "":
		return r
	}
	return r + " (" + s.PacedBy + ")"
}

// maxReason is how much of a reason the status table shows.
const maxReason = 28

// platformState is what holds a platform back, compactly: "paused 4m
// (maintenance)", "cooldown 14m ×2 (HTTP 429 Too Many …)", "hold 30s
// (Retry-After)", else "ok". A pause comes first, then a cooldown, then a
// hold (a cooldown is also a hold: shown once).
func platformState(p status.Platform) string {
	with := func(what, reason string) string {
		if reason == "" {
			return what
		}
		return what + " (" + truncate(reason, maxReason) + ")"
	}
	var parts []string
	switch {
	case p.Pace.PausedIndefinitely:
		parts = append(parts, with("paused", p.Pace.PauseReason))
	case p.Pace.Paused > 0:
		parts = append(parts, with("paused "+roundDur(p.Pace.Paused), p.Pace.PauseReason))
	}
	switch {
	case p.Cooldown != nil:
		what := "cooldown " + roundDur(p.Cooldown.Remaining)
		if p.Cooldown.Count > 1 {
			what += fmt.Sprintf(" ×%d", p.Cooldown.Count)
		}
		parts = append(parts, with(what, p.Cooldown.Reason))
	case p.Pace.Hold > 0:
		parts = append(parts, with("hold "+roundDur(p.Pace.Hold), p.Pace.HoldReason))
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, "; ")
}

// truncate shortens s to n runes, with an ellipsis.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// roundDur is a duration for people: milliseconds under a second, seconds
// under an hour, minutes above, without zero units at the end ("1h", "2h5m",
// "14m32s").
func roundDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Minute)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.SortedFunc(maps.Keys(m), cmp.Compare[string])
}
