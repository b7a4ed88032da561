package cli

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
)

// The commands that operate a running fleet: pause, resume and delete a
// platform, clear a cooldown, and show, edit, disable and enable sources.

// exactArgs requires exactly n arguments, named what in the error.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s needs exactly %d %s, got %d argument(s)", cmd.CommandPath(), n, what, len(args))
		}
		return nil
	}
}

// operateError maps the errors of an operation to what the user needs:
// a platform or source that does not exist, an input field named by its
// flag, are bad input (exit 2); the rest are the database's.
func operateError(err error, fields map[string]string) error {
	if errors.Is(err, sources.ErrNotFound) && !errors.Is(err, sources.ErrInvalid) {
		return usagef("%w", err)
	}
	return dbError(renameField(err, fields))
}

func (a *app) platformsPauseCmd() *cobra.Command {
	var o control.PauseOptions
	cmd := &cobra.Command{
		Use:   "pause NAME [--for DURATION] [--reason TEXT]",
		Short: "Stop every request to a platform, from every process, until resumed (or for a while)",
		Long: `Pause a platform fleet-wide: no request leaves for it from any worker
process until ` + "`platforms resume`" + ` (or until --for has passed), slots already
granted are given back at once, the scan queues none of its sources, and
its queued fetch jobs wait (River snoozes them: no attempt is used up).
The pause is kept in the database, so it survives worker restarts; status
shows it with its reason and the time left.`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Validate(); err != nil {
				return fmt.Errorf("platforms pause: %w", renameField(err, pauseFlags))
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				until, err := control.Pause(cmd.Context(), pool, args[0], o)
				if err != nil {
					return operateError(err, pauseFlags)
				}
				if until.IsZero() {
					fmt.Fprintf(a.stdout, "platform %s paused until resumed\n", args[0])
				} else {
					fmt.Fprintf(a.stdout, "platform %s paused for %s (until %s)\n", args[0], o.For, until.UTC().Format(time.RFC3339))
				}
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&o.For, "for", 0, fmt.Sprintf("end the pause by itself after this long (0: until resumed; up to %s)", control.MaxPauseFor))
	cmd.Flags().StringVar(&o.Reason, "reason", "", fmt.Sprintf("why, shown by status while the pause lasts (up to %d bytes)", control.MaxReasonLen))
	return cmd
}

var pauseFlags = map[string]string{"for": "--for", "reason": "--reason"}

func (a *app) platformsResumeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "resume NAME",
		Short: "End a platform's pause at once; its waiting jobs run within a second",
		Args:  exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				woken, err := control.Resume(cmd.Context(), pool, args[0])
				if errors.Is(err, control.ErrNotPaused) {
					fmt.Fprintf(a.stdout, "platform %s is not paused; nothing changed\n", args[0])
					return nil
				}
				if err != nil {
					return operateError(err, nil)
				}
				fmt.Fprintf(a.stdout, "platform %s resumed; %d waiting job(s) run now\n", args[0], woken)
				return nil
			})
		},
	}
}

func (a *app) platformsDeleteCmd() *cobra.Command {
	var withSources bool
	cmd := &cobra.Command{
		Use:   "delete NAME [--with-sources]",
		Short: "Delete a platform: its settings, pacer state, cooldown, history and waiting jobs",
		Long: `Delete a platform with its pacer state, its cooldown, its fetch history and
its fetch jobs waiting in the queue (a job running at that moment finishes).
A platform that still has sources is refused unless --with-sources, which
deletes them too. It prints what it deleted.`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				d, err := control.DeletePlatform(cmd.Context(), pool, args[0], withSources)
				if errors.Is(err, sources.ErrHasSources) {
					return usagef("%w\nhint: add --with-sources to delete them too", renameField(err, map[string]string{"with_sources": "--with-sources"}))
				}
				if err != nil {
					return operateError(err, nil)
				}
				cooldown := "no cooldown"
				if d.Cooldown {
					cooldown = "its cooldown"
				}
				fmt.Fprintf(a.stdout, "platform %s deleted with %d source(s), %d history row(s), %s, its pacer state and %d waiting job(s)\n",
					d.Platform, d.Sources, d.History, cooldown, d.Jobs)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&withSources, "with-sources", false, "delete the platform's sources (and their history) too")
	return cmd
}

func (a *app) cooldownsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "cooldowns", Short: "End a platform's cooldown early"}
	cmd.AddCommand(&cobra.Command{
		Use:   "clear NAME",
		Short: "End a platform's cooldown and the pacer's hold at once, fleet-wide, and reset its escalation",
		Long: `End a platform's cooldown now: every worker process may fetch it again at
once (the pacer's fleet-wide hold ends too, whether a cooldown's or a
Retry-After's), its jobs waiting for the cooldown run within a second, and
the escalation is forgotten (the next cooldown lasts the platform's own
--cooldown, not a doubled one).`,
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				c, err := control.ClearCooldown(cmd.Context(), pool, args[0])
				if err != nil {
					return operateError(err, nil)
				}
				if c.Cooldown == nil {
					fmt.Fprintf(a.stdout, "platform %s had no cooldown; pacer hold cleared; %d waiting job(s) run now\n", args[0], c.Woken)
					return nil
				}
				fmt.Fprintf(a.stdout, "cooldown of %s cleared (%s left, escalation ×%d: %s); %d waiting job(s) run now\n",
					args[0], roundDur(c.Cooldown.Remaining), c.Cooldown.Count, c.Cooldown.Reason, c.Woken)
				return nil
			})
		},
	})
	return cmd
}

// showReason is a check's reason as shown to a user: the library states the
// fact, the command line adds what the user can do about it. A refusal by
// the fetcher's SSRF guard (fetch.ErrRefusedAddress, whose text is
// "refused: ADDRESS is a … address") is lifted by --allow-private-networks.
func showReason(reason string) string {
	if strings.HasPrefix(reason, "refused: ") && strings.HasSuffix(reason, " address") {
		return reason + " (use --allow-private-networks)"
	}
	return reason
}

func (a *app) sourcesShowCmd() *cobra.Command {
	var (
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "show ID|URL",
		Short: "Show a source: settings, state, last error, next check, and its recent checks",
		Args:  exactArgs(1, "ID or URL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 || limit > sources.MaxHistoryLimit {
				return usagef("--history: must be in [1, %d], got %d", sources.MaxHistoryLimit, limit)
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				rep, err := status.ReadSource(cmd.Context(), pool, args[0], limit)
				if err != nil {
					return operateError(err, map[string]string{"id": "ID|URL"})
				}
				rep.Source.URL = redact.URL(rep.Source.URL)
				if asJSON {
					return writeJSON(a.stdout, rep)
				}
				return a.writeSource(rep)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "history", sources.DefaultHistoryLimit, fmt.Sprintf("how many recent checks to show (up to %d)", sources.MaxHistoryLimit))
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	zeroIsDefault(cmd.Flags(), "history")
	return cmd
}

func (a *app) writeSource(rep *status.SourceReport) error {
	s := rep.Source
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "source\t%d\n", s.ID)
	fmt.Fprintf(tw, "platform\t%s\n", s.Platform)
	if s.Key != "" {
		fmt.Fprintf(tw, "key\t%s\n", showKey(s.Key))
	}
	fmt.Fprintf(tw, "url\t%s\n", s.URL)
	fmt.Fprintf(tw, "interval\t%s\n", s.Interval)
	fmt.Fprintf(tw, "enabled\t%v\n", s.Enabled)
	state := "never checked"
	switch {
	case s.ConsecutiveFailures > 0:
		state = fmt.Sprintf("failing (%d in a row)", s.ConsecutiveFailures)
	case s.LastOutcome != nil:
		state = string(*s.LastOutcome)
	}
	fmt.Fprintf(tw, "state\t%s\n", state)
	// The last check that counted (a 429 is no check: the source keeps its
	// place) and the last answer, whatever it was, each with its own time.
	if s.LastCheckedAt != nil {
		fmt.Fprintf(tw, "last checked\t%s (%s ago)\n", fmtTime(s.LastCheckedAt), roundDur(rep.At.Sub(*s.LastCheckedAt)))
	} else {
		fmt.Fprintf(tw, "last checked\tnever\n")
	}
	switch a := rep.LastAnswer; {
	case a != nil:
		fmt.Fprintf(tw, "last answer\t%s (%s ago): %s%s\n", a.CheckedAt.UTC().Format(time.RFC3339), roundDur(rep.At.Sub(a.CheckedAt)),
			fmtAnswer(a.Status, a.Outcome), fmtWhy(a.Reason))
	case s.LastOutcome != nil:
		fmt.Fprintf(tw, "last answer\t%s%s (its time is not kept: no fetch history)\n", fmtAnswer(derefInt(s.LastStatus), *s.LastOutcome),
			fmtWhy(fmtStrOr(s.LastError, "")))
	}
	for i, c := range rep.State {
		label := ""
		if i == 0 {
			label = "platform now"
		}
		fmt.Fprintf(tw, "%s\t%s\n", label, c)
		if c.Detail != "" {
			fmt.Fprintf(tw, "\t  %s\n", c.Detail)
		}
		if c.Reason != "" {
			fmt.Fprintf(tw, "\t  reason: %s\n", c.Reason)
		}
	}
	next := "—"
	switch {
	case rep.NextCheck.IsZero() && rep.HeldBy == "disabled":
		next = "never (disabled)"
	case rep.NextCheck.IsZero():
		next = "when its platform is resumed (paused)"
	case !rep.NextCheck.After(rep.At):
		next = "now (due)"
	default:
		next = fmt.Sprintf("%s (in %s)", rep.NextCheck.UTC().Format(time.RFC3339), roundDur(rep.NextCheck.Sub(rep.At)))
	}
	if rep.HeldBy != "" && rep.HeldBy != "disabled" {
		next += "; held by: " + rep.HeldBy
	}
	fmt.Fprintf(tw, "next check\t%s\n", next)
	if s.QueuedAt != nil {
		fmt.Fprintf(tw, "queued\tsince %s (job %d)\n", fmtTime(s.QueuedAt), derefInt64(s.QueuedJobID))
	}
	if s.ETag != nil || s.LastModified != nil {
		fmt.Fprintf(tw, "validators\tETag %s, Last-Modified %s\n", fmtStr(s.ETag), fmtStr(s.LastModified))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.History) == 0 {
		fmt.Fprintln(a.stdout, "\nno checks recorded")
		return nil
	}
	fmt.Fprintf(a.stdout, "\nrecent checks (newest first):\n")
	tw = tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECKED AT\tOUTCOME\tSTATUS\tDURATION\tBYTES\tWORKER\tREASON")
	for _, h := range rep.History {
		st := "-"
		if h.Status != 0 {
			st = fmt.Sprint(h.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", h.CheckedAt.UTC().Format("2006-01-02T15:04:05.000Z"), h.Outcome, st,
			h.Duration.Round(time.Millisecond), h.Bytes, orDash(h.Worker), orDash(showReason(h.Reason)))
	}
	return tw.Flush()
}

// fmtAnswer is an answer's status and outcome: "HTTP 429, rate_pressure",
// "no answer, failed".
func fmtAnswer(status int, outcome fetch.Outcome) string {
	if status == 0 {
		return "no answer, " + string(outcome)
	}
	return fmt.Sprintf("HTTP %d, %s", status, outcome)
}

// fmtWhy is " — reason" (with its hint), or nothing without a reason.
func fmtWhy(reason string) string {
	if reason == "" {
		return ""
	}
	return " — " + showReason(reason)
}

func fmtStrOr(p *string, or string) string {
	if p == nil {
		return or
	}
	return *p
}

func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func derefInt64(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func (a *app) sourcesSetCmd() *cobra.Command {
	var (
		interval time.Duration
		enabled  bool
	)
	var platform string
	cmd := &cobra.Command{
		Use:   "set ID|URL | --platform P  [--interval D] [--enabled=false]",
		Short: "Change the interval of a source, or of every source of a platform, or whether they are enabled (only the flags given change)",
		Long: `Change one source (by id or URL), or every source of --platform at once
(all or nothing: an unknown platform or a bad value changes nothing, exit 2).
Only the flags given change. A new --interval moves the next check of each
healthy source to its last check + the interval (a failing source keeps its
backoff).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if (platform == "") == (len(args) == 0) || len(args) > 1 {
				return usagef("%s needs one source ID or URL, or --platform, not both", cmd.CommandPath())
			}
			var u sources.SourceUpdate
			if cmd.Flags().Changed("interval") {
				u.Interval = &interval
			}
			if cmd.Flags().Changed("enabled") {
				u.Enabled = &enabled
			}
			if err := u.Validate(); err != nil {
				return fmt.Errorf("sources set: %w", renameField(err, map[string]string{"interval": "--interval"}))
			}
			if platform != "" {
				if err := (sources.Selection{Platform: platform}).Validate(); err != nil {
					return fmt.Errorf("sources set: %w", renameField(err, sourceFlags))
				}
				return a.setSources(cmd, platform, u)
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				src, err := sources.Lookup(cmd.Context(), pool, args[0])
				if err != nil {
					return operateError(err, map[string]string{"id": "ID|URL"})
				}
				saved, err := sources.UpdateSource(cmd.Context(), pool, src.ID, u)
				if err != nil {
					return operateError(err, sourceFlags)
				}
				fmt.Fprintf(a.stdout, "source %d: interval %s, enabled %v, next due %s\n", saved.ID, saved.Interval, saved.Enabled,
					saved.DueAt.UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", sources.DefaultInterval, fmt.Sprintf("how often to check the source (%s to %s); a healthy source is next checked at its last check + this", sources.MinInterval, sources.MaxInterval))
	cmd.Flags().BoolVar(&enabled, "enabled", true, "false: queue the source no more (a job already queued still runs)")
	cmd.Flags().StringVar(&platform, "platform", "", "every source of this platform instead of one")
	return cmd
}

// sourcesEnableCmd is `sources enable` (enabled true) or `sources disable`.
func (a *app) sourcesEnableCmd(enabled bool) *cobra.Command {
	var (
		platform string
		failing  int
	)
	verb, short := "disable", "Stop queueing sources (by id, by platform, or those failing more than N times in a row)"
	if enabled {
		verb, short = "enable", "Queue sources again (by id, by platform, or those failing more than N times in a row)"
	}
	cmd := &cobra.Command{
		Use:   verb + " ID... | --platform P | --failing N",
		Short: short,
		Long: `By id (all or nothing: an unknown id changes nothing), or every source of
--platform, or every source failing more than --failing N times in a row
(both together: those of the platform). A source already queued runs once
more.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			sel := sources.Selection{Platform: platform}
			if cmd.Flags().Changed("failing") {
				n, err := minFailures("sources "+verb, failing)
				if err != nil {
					return err
				}
				sel.MinFailures = n
			}
			if len(args) > 0 {
				ids, err := parseIDs(args)
				if err != nil {
					return err
				}
				sel.IDs = ids
			}
			if err := sel.Validate(); err != nil {
				return fmt.Errorf("sources %s: %w", verb, renameField(err, selectionFlags))
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				ids, err := sources.SetEnabled(cmd.Context(), pool, sel, enabled)
				if err != nil {
					return operateError(err, selectionFlags)
				}
				fmt.Fprintf(a.stdout, "%sd %d source(s)%s\n", verb, len(ids), fmtIDs(ids))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&platform, "platform", "", "every source of this platform")
	cmd.Flags().IntVar(&failing, "failing", 0, fmt.Sprintf("every source failing more than N times in a row (up to %d)", sources.MaxFailures-1))
	return cmd
}

// minFailures is the MinFailures of --failing N (more than N failures in a
// row), or the usage error of a count out of range.
func minFailures(command string, failing int) (int, error) {
	if failing < 0 || failing >= sources.MaxFailures {
		return 0, usagef("%s: --failing must be in [0, %d], got %d", command, sources.MaxFailures-1, failing)
	}
	return failing + 1, nil
}

var selectionFlags = map[string]string{"id": "ID", "platform": "--platform", "min_failures": "--failing"}

// fmtIDs lists up to 20 ids: ": 3, 4, 9".
func fmtIDs(ids []int64) string {
	if len(ids) == 0 {
		return ""
	}
	parts := make([]string, 0, 21)
	for i, id := range ids {
		if i == 20 {
			parts = append(parts, fmt.Sprintf("… (%d more)", len(ids)-20))
			break
		}
		parts = append(parts, fmt.Sprint(id))
	}
	return ": " + strings.Join(parts, ", ")
}
