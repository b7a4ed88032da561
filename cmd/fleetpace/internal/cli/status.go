package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/queue"
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
		Long: `Show the live workers (with their fetches in flight), the River jobs not
finished by state and, per platform: its ceiling, the rate used over the last
minute against the rate the fleet paces it at now ("4.2 of 7/s"), its 429 (and
503) answers per minute, its fetches in flight fleet-wide, what it is doing in
words (paused by operator, cooling down and which rule set its length, holding
for Retry-After, throttled ×N, backing off to an estimate, 429s in the last
minute, or running), its sources due now (as ` + "`sources list --due`" + `
counts them), queued and failing, and how late its most overdue sources are.
Below the table, why: each state's reason or rule.

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

// writeStatus writes the report as a table, one line per platform, and
// then, for each platform that is not simply running, what it is doing and
// why, in words.
func writeStatus(w io.Writer, rep *status.Report) error {
	fmt.Fprintf(w, "live workers: %d\n", rep.Workers)
	for _, wk := range rep.Fleet {
		fmt.Fprintf(w, "  %s  %s pid %d  fleetpace %s  up %s  seen %s ago%s\n", wk.ID, wk.Hostname, wk.PID, wk.Version,
			roundDur(rep.At.Sub(wk.StartedAt)), roundDur(rep.At.Sub(wk.SeenAt)), fmtInFlight(wk.InFlight))
	}
	if jobs := fmtJobs(rep.Jobs); jobs != "" {
		fmt.Fprintf(w, "river jobs: %s\n", jobs)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PLATFORM\tCEILING/S\tUSED/S (LAST MIN)\t429S/MIN\tIN FLIGHT\tSTATE\tDUE\tQUEUED\tFAILING\tSTALE MAX\tSTALE P95")
	for _, p := range rep.Platforms {
		c := p.Counts
		fmt.Fprintf(tw, "%s\t%g\t%s\t%s\t%d\t%s\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.RatePerSec,
			p.Use.Text(), strconv.FormatFloat(p.Use.RefusedPerMin, 'g', 3, 64), p.Use.InFlight, platformState(p.State),
			c.Due, c.Queued, c.Failing, roundDur(c.StaleMax), roundDur(c.StaleP95))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	why := false
	for _, p := range rep.Platforms {
		for _, c := range p.State {
			if c.Detail == "" && c.Reason == "" {
				continue
			}
			if !why {
				fmt.Fprintln(w, "\nwhy:")
				why = true
			}
			fmt.Fprintf(w, "  %s: %s\n", p.Name, c)
			writeDetail(w, "      ", c)
		}
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

// writeDetail writes a condition's why indented, a line per clause
// (split at "; " and before " → "), and the reason it came with, each at
// most maxDetail runes.
func writeDetail(w io.Writer, indent string, c status.Condition) {
	if c.Detail != "" {
		for _, clause := range strings.Split(c.Detail, "; ") {
			for i, part := range strings.Split(clause, " → ") {
				if i > 0 {
					part = "→ " + part
				}
				fmt.Fprintf(w, "%s%s\n", indent, truncate(part, maxDetail))
			}
		}
	}
	switch {
	case c.Reason == "":
	case c.Kind == status.KindPaused:
		fmt.Fprintf(w, "%sthe operator's reason: %s\n", indent, truncate(c.Reason, maxDetail))
	default:
		fmt.Fprintf(w, "%sthe answer: %s\n", indent, truncate(c.Reason, maxDetail))
	}
}

// maxDetail is how much of one line of a condition's detail status shows.
const maxDetail = 140

// fmtJobs is the unfinished River jobs by state ("12 available, 3
// running, 40 scheduled"), every kind together.
func fmtJobs(jobs []queue.JobCount) string {
	by := map[string]int64{}
	for _, j := range jobs {
		by[j.State] += j.Jobs
	}
	var parts []string
	for _, state := range []string{"available", "running", "scheduled", "retryable", "pending"} {
		if n := by[state]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, state))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, ", ")
}

// fmtInFlight is a worker's fetches in flight, if any: "  in flight: feeds 3".
func fmtInFlight(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	return "  in flight: " + joinCounts(m, "%s %d")
}

// joinCounts lists the counts of m in the order of their names, each as
// format makes it of a name and its count: "a: 1, b: 2" for "%s: %d".
func joinCounts(m map[string]int, format string) string {
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf(format, k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// maxReason is how much of a pause's reason the status table shows.
const maxReason = 28

// platformState is what a platform is doing, compactly, most constraining
// first: "paused by operator, 4m left (maintenance)", "cooling down: max
// multiplier reached, 14m left", "holding for Retry-After, 7s left",
// "throttled ×5.1", "backing off: estimate 9.6/s", "429s: 12 in the last
// minute", "running".
func platformState(cs []status.Condition) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		s := c.String()
		if c.Kind == status.KindPaused && c.Reason != "" {
			s += " (" + truncate(c.Reason, maxReason) + ")"
		}
		parts = append(parts, s)
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
func roundDur(d time.Duration) string { return sources.HumanDuration(d) }

func sortedKeys[V any](m map[string]V) []string {
	return slices.SortedFunc(maps.Keys(m), cmp.Compare[string])
}
