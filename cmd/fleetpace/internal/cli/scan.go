package cli

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
)

func (a *app) scanCmd() *cobra.Command {
	var cfg scan.Config
	cmd := &cobra.Command{
		Use:   "scan",
		Short: "Run one scan tick (queue due sources), then exit; for cron and systemd timers",
		Long: `Run one scan tick: select due sources in fair order (never checked first,
then longest since checked), leave out platforms cooling down or paused and
sources already queued, cap each platform at its share (rate × look-ahead,
minus what it has queued), and enqueue one fetch job per source, all in one
transaction. A tick already running elsewhere (another scan, a worker) makes
this one skip. Then it deletes fetch history older than --history-retention.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				client, err := queue.NewClient(pool, queue.Config{Logger: a.logger})
				if err != nil {
					return err
				}
				res, err := scan.Tick(cmd.Context(), pool, client, cfg)
				if err != nil {
					return dbError(err)
				}
				if res.Skipped {
					fmt.Fprintln(a.stdout, "scan skipped: another tick is running")
					return nil
				}
				fmt.Fprintf(a.stdout, "scan: enqueued %d%s", res.Enqueued, fmtByPlatform(res.ByPlatform))
				if len(res.CoolingDown) > 0 {
					fmt.Fprintf(a.stdout, "; cooling down: %s", strings.Join(res.CoolingDown, ", "))
				}
				if len(res.Paused) > 0 {
					fmt.Fprintf(a.stdout, "; paused: %s", strings.Join(res.Paused, ", "))
				}
				if res.Pruned > 0 {
					fmt.Fprintf(a.stdout, "; %d history row(s) past the retention deleted", res.Pruned)
				}
				if res.Released > 0 {
					fmt.Fprintf(a.stdout, "; released %d source(s) whose job ended without a check", res.Released)
				}
				fmt.Fprintln(a.stdout)
				return nil
			})
		},
	}
	addTickFlags(cmd, &cfg)
	return cmd
}

func addTickFlags(cmd *cobra.Command, cfg *scan.Config) {
	f := cmd.Flags()
	f.IntVar(&cfg.Limit, "limit", scan.DefaultLimit, "most sources queued by one tick")
	f.IntVar(&cfg.PerPlatformCap, "per-platform-cap", scan.DefaultPerPlatformCap, "most sources of one platform queued by one tick")
	f.DurationVar(&cfg.LookAhead, "look-ahead", scan.DefaultLookAhead, "queue up to rate × look-ahead per platform")
	f.Var((*retention)(&cfg.HistoryRetention), "history-retention", fmt.Sprintf("keep the fetch history this long (each tick deletes older checks; up to %s); 0 keeps none (a worker then writes none)", scan.MaxHistoryRetention))
	zeroIsDefault(f, "limit", "per-platform-cap", "look-ahead")
}

// retention is scan.Config.HistoryRetention as a flag: a duration whose 0
// means "keep none" (scan.NoHistory); left out, the library's default.
type retention time.Duration

func (r *retention) String() string {
	switch d := time.Duration(*r); d {
	case 0:
		return scan.DefaultHistoryRetention.String()
	case scan.NoHistory:
		return "0s"
	default:
		return d.String()
	}
}

func (r *retention) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return fmt.Errorf("not a duration such as 72h or 30m")
	case d < 0:
		return fmt.Errorf("must be ≥ 0 (0 keeps no history)")
	case d == 0:
		d = scan.NoHistory
	}
	*r = retention(d)
	return nil
}

func (r *retention) Type() string { return "duration" }

func fmtByPlatform(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	return " (" + joinCounts(m, "%s: %d") + ")"
}

func (a *app) enqueueCmd() *cobra.Command {
	var platform string
	cmd := &cobra.Command{
		Use:   "enqueue ID... | --platform P",
		Short: "Queue fetch jobs now for the given sources or every source of a platform (never twice)",
		RunE: func(cmd *cobra.Command, args []string) error {
			if (platform == "") == (len(args) == 0) {
				return usagef("enqueue needs source IDs or --platform, not both")
			}
			var ids []int64
			if platform == "" {
				var err error
				if ids, err = parseIDs(args); err != nil {
					return err
				}
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				client, err := queue.NewClient(pool, queue.Config{Logger: a.logger})
				if err != nil {
					return err
				}
				var queued []queue.FetchArgs
				if platform != "" {
					queued, err = scan.EnqueuePlatform(cmd.Context(), pool, client, platform)
				} else {
					queued, err = scan.Enqueue(cmd.Context(), pool, client, ids)
				}
				if errors.Is(err, sources.ErrNotFound) {
					return usagef("%w", err)
				}
				if err != nil {
					return dbError(err)
				}
				fmt.Fprintf(a.stdout, "enqueued %d source(s)", len(queued))
				if skipped := len(ids) - len(queued); platform == "" && skipped > 0 {
					fmt.Fprintf(a.stdout, "; %d already queued or disabled", skipped)
				}
				fmt.Fprintln(a.stdout)
				return a.notePaused(cmd.Context(), pool, queued, platform)
			})
		},
	}
	cmd.Flags().StringVar(&platform, "platform", "", "queue every enabled, unqueued source of this platform")
	return cmd
}

// notePaused says which platforms of the jobs just queued (or the one
// named) are paused: their jobs wait for the pause to end.
func (a *app) notePaused(ctx context.Context, pool *pgxpool.Pool, queued []queue.FetchArgs, platform string) error {
	names := map[string]bool{}
	if platform != "" {
		names[platform] = true
	}
	for _, q := range queued {
		names[q.Platform] = true
	}
	states, err := pacer.StatesOf(ctx, pool, slices.Sorted(maps.Keys(names)))
	if err != nil {
		return dbError(err)
	}
	for _, st := range states {
		switch {
		case st.PausedIndefinitely:
			fmt.Fprintf(a.stdout, "platform %s is paused: its jobs wait until `fleetpace platforms resume %s`\n", st.Platform, st.Platform)
		case st.Paused > 0:
			fmt.Fprintf(a.stdout, "platform %s is paused for %s more: its jobs wait until then\n", st.Platform, roundDur(st.Paused))
		}
	}
	return nil
}
