package cli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/sources"
)

// The keys commands: a key's own limits on a platform, and what is in force
// for each key in use.

// keyFlags names the flags and arguments of `keys` commands by the fields
// of their validation errors.
var keyFlags = map[string]string{
	"platform": "PLATFORM", "key": "KEY", "rate": "--rate", "burst": "--burst", "max_in_flight": "--max-in-flight",
	"limit": "--limit",
}

// showKey is a key as printed on a terminal: as it is when every character
// is a visible one, else quoted with escapes (a control character or a
// bidirectional override in a key cannot rewrite the output around it).
func showKey(k string) string {
	if strings.IndexFunc(k, func(r rune) bool { return !unicode.IsGraphic(r) || r == '\t' }) >= 0 {
		return strconv.QuoteToGraphic(k)
	}
	return k
}

func (a *app) keysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Set a key's own limits on a platform, list its keys in use, remove a key's limits",
		Long: `A source may carry a key (sources add --key): an account, a token's name, a
tenant. A platform may limit each key separately (platforms set --key-rate,
--key-burst, --key-max-in-flight) under its own limits for all keys
together; these commands give single keys limits of their own. See
docs/keys.md.`,
	}
	var (
		rate          float64
		burst, inFlgt int
	)
	set := &cobra.Command{
		Use:   "set PLATFORM KEY [--rate R] [--burst B] [--max-in-flight N]",
		Short: "Give one key of a platform limits of its own (only the flags given change; the others stay the platform's)",
		Long: `Set one key's own limits on a platform: its rate, burst and cap on open
requests, fleet-wide, under the platform's limits for all keys together.
Only the flags given change; a key's limits that were never set follow the
platform's per-key settings. They take effect at the key's next request,
in every worker. ` + "`keys delete`" + ` removes them.`,
		Args: exactArgs(2, "arguments (PLATFORM KEY)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var u sources.KeyLimitUpdate
			f := cmd.Flags()
			if f.Changed("rate") {
				u.Rate = &rate
			}
			if f.Changed("burst") {
				u.Burst = &burst
			}
			if f.Changed("max-in-flight") {
				u.MaxInFlight = &inFlgt
			}
			if err := u.Validate(); err != nil {
				return fmt.Errorf("keys set: %w", renameField(err, keyFlags))
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				l, created, err := sources.SetKeyLimit(cmd.Context(), pool, args[0], args[1], u)
				if err != nil {
					return operateError(err, keyFlags)
				}
				verb := "updated"
				if created {
					verb = "set"
				}
				fmt.Fprintf(a.stdout, "key %s of %s: own limits %s: rate %s, burst %s, max in flight %s\n", showKey(l.Key), l.Platform, verb,
					ownOr(l.Rate, "/s"), ownOr(l.Burst, ""), ownOr(l.MaxInFlight, ""))
				return nil
			})
		},
	}
	set.Flags().Float64Var(&rate, "rate", 0, fmt.Sprintf("the key's ceiling in requests per second, fleet-wide (%g to %g)", sources.MinRate, sources.MaxRate))
	set.Flags().IntVar(&burst, "burst", sources.DefaultBurst, fmt.Sprintf("the key's requests allowed back to back (1 to %d)", sources.MaxBurst))
	set.Flags().IntVar(&inFlgt, "max-in-flight", 0, fmt.Sprintf("the key's most requests open at once, fleet-wide (0: no cap; up to %d)", sources.MaxInFlight))

	var (
		opts   sources.KeyListOptions
		asJSON bool
	)
	list := &cobra.Command{
		Use:   "list PLATFORM [--after KEY] [--limit N]",
		Short: "List a platform's keys in use or with limits of their own: the limits in force, held, slowed, in flight (paged)",
		Long: `List a platform's keys that are in use (a worker reserved for them lately;
idle keys are forgotten after a while) or that have limits of their own, in
key order, a page at a time: what is in force for each (rate, burst, cap on
open requests; "own" marks a key's own limits), how long it is held and
why (a 429 with a Retry-After for that key, its exhausted quota), whether
it is slowed (paced more than 10 % under its rate) and how many of its
requests are open. The next page starts after the last key: --after KEY.`,
		Args: exactArgs(1, "PLATFORM"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := opts.Validate(); err != nil {
				return fmt.Errorf("keys list: %w", renameField(err, map[string]string{"limit": "--limit", "key": "--after"}))
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				page, err := sources.ListKeys(cmd.Context(), pool, args[0], opts)
				if err != nil {
					return operateError(err, keyFlags)
				}
				if asJSON {
					return writeJSON(a.stdout, page)
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "KEY\tRATE/S\tBURST\tMAX IN FLIGHT\tOWN\tIN USE\tHELD\tSLOWED\tIN FLIGHT")
				for _, k := range page.Keys {
					held := "-"
					if k.Hold > 0 {
						held = roundDur(k.Hold)
						if k.HoldReason != "" {
							held += " (" + showKey(k.HoldReason) + ")"
						}
					}
					slowed := "-"
					if k.Slowed {
						slowed = fmt.Sprintf("%.3g/s", k.EffectiveRate)
					}
					own := "-"
					if k.Own != nil {
						own = "own"
					}
					fmt.Fprintf(tw, "%s\t%g\t%d\t%s\t%s\t%v\t%s\t%s\t%d\n", showKey(k.Key), k.Rate, k.Burst, zeroDash(k.MaxInFlight),
						own, k.InUse, held, slowed, k.InFlight)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if page.Next != "" {
					fmt.Fprintf(a.stdout, "more: --after %s\n", strconv.Quote(page.Next))
				}
				return nil
			})
		},
	}
	list.Flags().StringVar(&opts.After, "after", "", "start after this key (the last of the previous page)")
	list.Flags().IntVar(&opts.Limit, "limit", sources.DefaultKeyListLimit, fmt.Sprintf("at most this many keys (up to %d)", sources.MaxKeyListLimit))
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON (durations in seconds, under keys ending in _s)")
	zeroIsDefault(list.Flags(), "limit")

	del := &cobra.Command{
		Use:   "delete PLATFORM KEY",
		Short: "Remove a key's own limits: it follows the platform's per-key settings again",
		Args:  exactArgs(2, "arguments (PLATFORM KEY)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				if err := sources.DeleteKeyLimit(cmd.Context(), pool, args[0], args[1]); err != nil {
					return operateError(err, keyFlags)
				}
				fmt.Fprintf(a.stdout, "key %s of %s: own limits removed; the platform's per-key settings apply\n", showKey(args[1]), args[0])
				return nil
			})
		},
	}
	cmd.AddCommand(set, list, del)
	return cmd
}

// ownOr prints a key's own setting, or "the platform's" when it has none.
func ownOr[N int | float64](p *N, unit string) string {
	if p == nil {
		return "the platform's"
	}
	return fmt.Sprint(*p) + unit
}
