package cli

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
)

// The operator's actions a job dashboard's user expects: reset a
// platform's pace, check sources now (one, some, or a whole platform's),
// and change the interval of every source of a platform at once.

func (a *app) platformsResetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "reset NAME",
		Short: "Put a platform back at its configured pace: no backoff, estimate, hold, cooldown or announced quota",
		Long: `Reset a platform's pace from a known state, fleet-wide: its cooldown ends
(and its escalation is forgotten), the pacer forgets what adaptation learnt —
the backoff multiplier or the estimate of what the destination accepts, its
holds, the quota the destination announced — and its waiting jobs run now.
The next request leaves within a second, at the configured --rate and
--burst, as on a platform just created; if the destination still refuses,
adaptation starts again from there. A pause stays (platforms resume ends it).
Use it after the destination raised its limit, or to undo a backoff an
incident left behind.`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				c, err := control.Reset(cmd.Context(), pool, args[0])
				if err != nil {
					return operateError(err, nil)
				}
				p, err := sources.GetPlatform(cmd.Context(), pool, args[0])
				if err != nil {
					return dbError(err)
				}
				fmt.Fprintf(a.stdout, "platform %s reset: %g/s, burst %d from now, fleet-wide", p.Name, p.RatePerSec, p.Burst)
				if c.Cooldown != nil {
					fmt.Fprintf(a.stdout, "; cooldown ended (%s left, ×%d)", roundDur(c.Cooldown.Remaining), c.Cooldown.Count)
				}
				fmt.Fprintf(a.stdout, "; %d waiting job(s) run now", c.Woken)
				if st, err := pacer.StatesOf(cmd.Context(), pool, []string{p.Name}); err == nil && len(st) == 1 && st[0].PacedBy == pacer.PacedByPause {
					fmt.Fprintf(a.stdout, "; still paused (platforms resume %s ends the pause)", p.Name)
				}
				fmt.Fprintln(a.stdout)
				return nil
			})
		},
	}
}

func (a *app) platformsCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check NAME",
		Short: "Check every enabled source of a platform now, at the platform's pace",
		Long: `Check every enabled source of a platform now: each without a fetch job gets
one, and its jobs waiting for a later time (snoozed) are made available now.
The jobs still take their slots from the pacer: checking now never goes over
the platform's pace (a paused or cooling-down platform's jobs wait for it).
Like River UI's "run now", for the platform's sources.`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(cmd, func(pool *pgxpool.Pool, client *queue.Client) error {
				c, err := control.CheckPlatform(cmd.Context(), pool, client, args[0])
				if err != nil {
					return operateError(err, nil)
				}
				fmt.Fprintf(a.stdout, "platform %s: %s\n", args[0], fmtChecked(c))
				return nil
			})
		},
	}
}

func (a *app) sourcesCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check ID...",
		Short: "Check sources now, at their platform's pace",
		Long: `Check the given sources now: each enabled source without a fetch job gets
one, and a job already queued and waiting for a later time (snoozed) is made
available now. The jobs still take their slots from the pacer: checking now
never goes over the platform's pace. All or nothing: an unknown id checks
nothing (exit 2). A disabled source is not checked (sources enable first).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("%s needs at least one source ID", cmd.CommandPath())
			}
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			return a.withClient(cmd, func(pool *pgxpool.Pool, client *queue.Client) error {
				c, err := control.CheckSources(cmd.Context(), pool, client, ids)
				if err != nil {
					return operateError(err, map[string]string{"id": "ID"})
				}
				fmt.Fprintf(a.stdout, "%d source(s)%s: %s\n", len(ids), fmtIDs(ids), fmtChecked(c))
				return nil
			})
		},
	}
}

// fmtChecked says what a check now did.
func fmtChecked(c control.Checked) string {
	parts := []string{fmt.Sprintf("%d queued now", c.Queued), fmt.Sprintf("%d already queued made due now", c.Woken)}
	if c.Disabled > 0 {
		parts = append(parts, fmt.Sprintf("%d disabled (not checked)", c.Disabled))
	}
	return strings.Join(parts, ", ") + "; they fetch as soon as the platform's pace allows"
}

// withClient runs fn with a pool and an insert-only River client.
func (a *app) withClient(cmd *cobra.Command, fn func(*pgxpool.Pool, *queue.Client) error) error {
	return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
		client, err := queue.NewClient(pool, queue.Config{Logger: a.logger})
		if err != nil {
			return err
		}
		return fn(pool, client)
	})
}

// setSources is `sources set --platform P`: every source of the platform
// at once, all or nothing.
func (a *app) setSources(cmd *cobra.Command, platform string, u sources.SourceUpdate) error {
	return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
		ids, err := sources.UpdateSources(cmd.Context(), pool, sources.Selection{Platform: platform}, u)
		if err != nil {
			return sourceError(renameField(err, sourceFlags))
		}
		var changed []string
		if u.Interval != nil {
			changed = append(changed, "interval "+u.Interval.String())
		}
		if u.Enabled != nil {
			changed = append(changed, fmt.Sprintf("enabled %v", *u.Enabled))
		}
		fmt.Fprintf(a.stdout, "platform %s: %d source(s) set to %s", platform, len(ids), strings.Join(changed, ", "))
		if u.Interval != nil {
			fmt.Fprintf(a.stdout, "; each healthy one is next due at its last check + %s", *u.Interval)
		}
		fmt.Fprintln(a.stdout)
		return nil
	})
}
