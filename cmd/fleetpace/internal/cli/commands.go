package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

func (a *app) schemaCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schema",
		Short: "Apply or print the database schema (fleetpace's tables and River's)",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "apply",
		Short: "Create fleetpace's tables and run River's migrations; idempotent and safe to run concurrently",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				res, err := fleetpace.Apply(cmd.Context(), pool, a.logger)
				if err != nil {
					return dbError(err)
				}
				if len(res.RiverVersions) > 0 {
					fmt.Fprintf(a.stdout, "schema applied (River migrations %v)\n", res.RiverVersions)
				} else {
					fmt.Fprintln(a.stdout, "schema applied (already current)")
				}
				return nil
			})
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "print",
		Short: "Print fleetpace's own schema (migrations-free-schema.sql)",
		Args:  noArgs,
		// No database needed.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(*cobra.Command, []string) error {
			_, err := io.WriteString(a.stdout, fleetpace.SchemaSQL)
			return err
		},
	})
	return cmd
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), strings.Join(args, " "))
	}
	return nil
}

func (a *app) platformsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "platforms", Short: "Configure destinations and their rate ceilings; pause, resume, reset, check and delete them"}

	var (
		p                       sources.Platform
		asJSON                  bool
		probe, headers, respace bool
	)
	set := &cobra.Command{
		Use:   "set NAME [--rate R] [flags]",
		Short: "Create a platform (--rate required) or change the settings given of an existing one",
		Long: "Create or update a platform. NAME must match " + sources.NamePattern + ".\n" +
			"The rate is a ceiling for the whole fleet: every process and thread together.\n\n" +
			"On an existing platform only the flags given change; the others keep their\n" +
			"values (the defaults below are those of a new platform, which needs --rate).",
		Args: exactArgs(1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			f := cmd.Flags()
			var u sources.PlatformUpdate
			if f.Changed("rate-limit-headers") {
				fmt.Fprintln(a.stderr, "fleetpace: --rate-limit-headers is deprecated: use --use-headers")
			}
			for flag, set := range map[string]func(){
				"rate":               func() { u.RatePerSec = &p.RatePerSec },
				"burst":              func() { u.Burst = &p.Burst },
				"cooldown":           func() { u.Cooldown = &p.Cooldown },
				"max-multiplier":     func() { u.MaxMultiplier = &p.MaxMultiplier },
				"decay-after":        func() { u.DecayAfter = &p.DecayAfter },
				"backoff-factor":     func() { u.BackoffFactor = &p.BackoffFactor },
				"recovery-factor":    func() { u.RecoveryFactor = &p.RecoveryFactor },
				"probe":              func() { u.Probe = &probe },
				"use-headers":        func() { u.UseHeaders = &headers },
				"rate-limit-headers": func() { u.UseHeaders = &headers }, // deprecated name of --use-headers
				"respace":            func() { u.Respace = &respace },
				"adapt":              func() { u.Adapt = &p.Adapt },
				"key-rate":           func() { u.KeyRate = &p.KeyRate },
				"key-burst":          func() { u.KeyBurst = &p.KeyBurst },
				"max-in-flight":      func() { u.MaxInFlight = &p.MaxInFlight },
				"key-max-in-flight":  func() { u.KeyMaxInFlight = &p.KeyMaxInFlight },
			} {
				if f.Changed(flag) {
					set()
				}
			}
			// Validate the values given before touching the database: bad
			// input changes nothing. (A zero is an error here, not "default".)
			check := u.Apply(sources.Platform{Name: name, RatePerSec: 1}.WithDefaults())
			if err := check.Validate(); err != nil {
				return fmt.Errorf("platform: %w", renameField(err, platformFlags))
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				saved, created, err := sources.ConfigurePlatform(cmd.Context(), pool, name, u)
				if err != nil {
					return dbError(renameField(err, platformFlags))
				}
				verb := "updated"
				if created {
					verb = "created"
				}
				adapting := "adapt estimate"
				if saved.Adapt == sources.AdaptMultiplier {
					adapting = fmt.Sprintf("adapt multiplier (backoff ×%g, recovery ÷%g per %d clean, probe %v)",
						saved.BackoffFactor, saved.RecoveryFactor, saved.DecayAfter, !saved.NoProbe)
				}
				fmt.Fprintf(a.stdout, "platform %s %s: rate %g/s, burst %d, cooldown %s, max multiplier %g, %s, use headers %v, respace %v%s\n",
					saved.Name, verb, saved.RatePerSec, saved.Burst, saved.Cooldown, saved.MaxMultiplier, adapting,
					!saved.NoUseHeaders, !saved.NoRespace, fmtNested(saved))
				return nil
			})
		},
	}
	f := set.Flags()
	f.Float64Var(&p.RatePerSec, "rate", 0, fmt.Sprintf("fleet-wide ceiling in requests per second (%g to %g; required for a new platform)", sources.MinRate, sources.MaxRate))
	f.IntVar(&p.Burst, "burst", sources.DefaultBurst, fmt.Sprintf("requests allowed back to back (1 to %d)", sources.MaxBurst))
	f.DurationVar(&p.Cooldown, "cooldown", sources.DefaultCooldown, fmt.Sprintf("pause after the platform says stop (%s to %s)", sources.MinCooldown, sources.MaxCooldown))
	f.StringVar(&p.Adapt, "adapt", sources.AdaptEstimate, "how the fleet adapts when the destination pushes back: estimate (measure what it accepts, pace just under it, recover in time) or multiplier (the shared backoff multiplier, shaped by the four flags below)")
	f.Float64Var(&p.MaxMultiplier, "max-multiplier", sources.DefaultMaxMultiplier, fmt.Sprintf("slowest pace: ceiling ÷ this; pressure there cools the platform down (1 to %d)", sources.MaxMultiplierLimit))
	f.IntVar(&p.DecayAfter, "decay-after", sources.DefaultDecayAfter, fmt.Sprintf("clean responses, fleet-wide, per recovery step of the multiplier (1 to %d)", sources.MaxDecayAfter))
	f.Float64Var(&p.BackoffFactor, "backoff-factor", sources.DefaultBackoffFactor, fmt.Sprintf("rate pressure multiplies the multiplier by this, once per episode (%g to %g)", sources.MinFactor, float64(sources.MaxFactor)))
	f.Float64Var(&p.RecoveryFactor, "recovery-factor", sources.DefaultRecoveryFactor, fmt.Sprintf("every --decay-after clean responses divide the multiplier by this (%g to %g)", sources.MinFactor, float64(sources.MaxFactor)))
	f.BoolVar(&probe, "probe", true, "recover carefully: stop just short of where the last pressure began, then climb in small steps (false: the plain schedule)")
	f.BoolVar(&headers, "use-headers", true, "pace the fleet by the destination's rate-limit headers, RateLimit and X-RateLimit-* (Retry-After is always honoured)")
	// --rate-limit-headers is the deprecated name of --use-headers: hidden,
	// and it says so on stderr (stdout may be read by a script).
	f.BoolVar(&headers, "rate-limit-headers", true, "")
	if err := f.MarkHidden("rate-limit-headers"); err != nil {
		panic(err)
	}
	f.BoolVar(&respace, "respace", true, "on a slow-down, re-space slots already granted, fleet-wide, at once (false: a benchmark baseline)")
	f.Float64Var(&p.KeyRate, "key-rate", 0, fmt.Sprintf("each key's ceiling in requests per second, fleet-wide, under the platform's (0: none; else %g to %g; `keys set` overrides single keys)", sources.MinRate, sources.MaxRate))
	f.IntVar(&p.KeyBurst, "key-burst", sources.DefaultBurst, fmt.Sprintf("each key's burst under --key-rate (1 to %d)", sources.MaxBurst))
	f.IntVar(&p.MaxInFlight, "max-in-flight", 0, fmt.Sprintf("most requests open at once to the platform, fleet-wide (0: no cap; up to %d); a crashed worker's requests count until their lease expires", sources.MaxInFlight))
	f.IntVar(&p.KeyMaxInFlight, "key-max-in-flight", 0, fmt.Sprintf("most requests open at once per key, fleet-wide (0: no cap; up to %d)", sources.MaxInFlight))

	list := &cobra.Command{
		Use:   "list",
		Short: "List platforms",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				ps, err := sources.ListPlatforms(cmd.Context(), pool)
				if err != nil {
					return dbError(err)
				}
				if asJSON {
					return writeJSON(a.stdout, ps)
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tRATE/S\tBURST\tCOOLDOWN\tMAX MULT\tBACKOFF\tRECOVERY\tDECAY AFTER\tPROBE\tUSE HEADERS\tKEY RATE/S\tKEY BURST\tMAX IN FLIGHT\tKEY MAX IN FLIGHT")
				for _, p := range ps {
					fmt.Fprintf(tw, "%s\t%g\t%d\t%s\t%g\t×%g\t÷%g\t%d\t%v\t%v\t%s\t%d\t%s\t%s\n", p.Name, p.RatePerSec, p.Burst, p.Cooldown,
						p.MaxMultiplier, p.BackoffFactor, p.RecoveryFactor, p.DecayAfter, !p.NoProbe, !p.NoUseHeaders,
						zeroDash(p.KeyRate), p.KeyBurst, zeroDash(p.MaxInFlight), zeroDash(p.KeyMaxInFlight))
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(set, list, a.platformsPauseCmd(), a.platformsResumeCmd(), a.platformsResetCmd(), a.platformsCheckCmd(), a.platformsDeleteCmd())
	return cmd
}

// platformFlags names the flags (and the argument) of `platforms set` by
// the fields of sources.Platform's validation errors.
var platformFlags = map[string]string{
	"name": "NAME", "rate_per_sec": "--rate", "burst": "--burst", "cooldown": "--cooldown",
	"max_multiplier": "--max-multiplier", "decay_after": "--decay-after",
	"backoff_factor": "--backoff-factor", "recovery_factor": "--recovery-factor", "adapt": "--adapt",
	"key_rate": "--key-rate", "key_burst": "--key-burst", "max_in_flight": "--max-in-flight", "key_max_in_flight": "--key-max-in-flight",
}

// fmtNested is what `platforms set` says of a platform's nested limits
// ("" when it has none).
func fmtNested(p sources.Platform) string {
	var parts []string
	if p.KeyRate > 0 {
		parts = append(parts, fmt.Sprintf("per key %g/s burst %d", p.KeyRate, p.KeyBurst))
	}
	if p.MaxInFlight > 0 {
		parts = append(parts, fmt.Sprintf("at most %d in flight", p.MaxInFlight))
	}
	if p.KeyMaxInFlight > 0 {
		parts = append(parts, fmt.Sprintf("at most %d in flight per key", p.KeyMaxInFlight))
	}
	if len(parts) == 0 {
		return ""
	}
	return ", " + strings.Join(parts, ", ")
}

// zeroDash prints 0 (no limit) as "-".
func zeroDash[N int | float64](n N) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// sourceFlags names the flags of `sources` commands by the fields of their
// validation errors.
var sourceFlags = map[string]string{
	"platform": "--platform", "url": "--url", "interval": "--interval", "limit": "--limit", "format": "--format",
	"outcome": "--outcome", "min_failures": "--failing", "key": "--key",
}

// sourceError renames the field of a sources validation error to its flag
// and, for a platform that does not exist, says how to create one.
func sourceError(err error) error {
	if errors.Is(err, sources.ErrUnknownPlatform) {
		return fmt.Errorf("source: %w\nhint: create the platform first: fleetpace platforms set NAME --rate R", renameField(err, sourceFlags))
	}
	return dbError(err)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (a *app) sourcesCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "sources", Short: "Add, import, list, show, edit, check now, disable, enable and remove sources"}

	var ns sources.NewSource
	add := &cobra.Command{
		Use:   "add --platform P --url U",
		Short: "Add one source (adding the same platform and URL again changes nothing)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := ns.Validate(); err != nil {
				return fmt.Errorf("source: %w", renameField(err, sourceFlags))
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				id, created, err := sources.AddSource(cmd.Context(), pool, ns)
				if err != nil {
					return sourceError(err)
				}
				if created {
					fmt.Fprintf(a.stdout, "added source %d\n", id)
				} else {
					fmt.Fprintf(a.stdout, "source %d already exists (unchanged)\n", id)
				}
				return nil
			})
		},
	}
	add.Flags().StringVar(&ns.Platform, "platform", "", "platform name (required)")
	add.Flags().StringVar(&ns.URL, "url", "", fmt.Sprintf("absolute http or https URL, at most %d bytes (required)", sources.MaxURLBytes))
	add.Flags().DurationVar(&ns.Interval, "interval", sources.DefaultInterval, fmt.Sprintf("how often to check the source (%s to %s)", sources.MinInterval, sources.MaxInterval))
	add.Flags().StringVar(&ns.Key, "key", "", fmt.Sprintf("what the platform limits separately (an account, a token's name — never the secret itself; at most %d bytes; default none)", sources.MaxKeyBytes))

	var (
		format      string
		defInterval time.Duration
	)
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Import sources from CSV (header: platform,url[,interval][,key]) or JSON lines; all or nothing",
		Long: `Import sources from a CSV file with a header line naming the columns platform,
url and optionally interval (a duration such as 30m) and key (what the
platform limits separately: an account, a token's name), or from JSON lines
({"platform":"p","url":"https://…","interval":"30m","key":"acct-1"}). "-"
reads stdin.

The import is all or nothing: every bad line is reported with its line
number and nothing is written. Sources already present (same platform and
URL) are left unchanged, so importing the same file again adds nothing.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("sources import needs exactly one FILE, got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var r io.Reader = os.Stdin
			fmtOpt := sourcefile.Format(format)
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return usagef("sources import: %w", err)
				}
				defer f.Close()
				r = f
				if fmtOpt == "" {
					switch strings.ToLower(filepath.Ext(args[0])) {
					case ".csv":
						fmtOpt = sourcefile.FormatCSV
					case ".jsonl", ".ndjson", ".json":
						fmtOpt = sourcefile.FormatJSONL
					}
				}
			}
			opts := sourcefile.Options{Format: fmtOpt, DefaultInterval: defInterval}
			if err := opts.Validate(); err != nil {
				return fmt.Errorf("sources import: %w", renameField(err, sourceFlags))
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				res, err := sourcefile.Import(cmd.Context(), pool, r, opts)
				if err != nil {
					return dbError(fmt.Errorf("%s: %w", args[0], err))
				}
				fmt.Fprintf(a.stdout, "imported %s: %d rows, %d added, %d already present\n", args[0], res.Rows, res.Added, res.Existing)
				return nil
			})
		},
	}
	imp.Flags().StringVar(&format, "format", "", "csv or jsonl (default: from the file extension, else sniffed)")
	imp.Flags().DurationVar(&defInterval, "interval", sources.DefaultInterval, fmt.Sprintf("interval for rows that give none (%s to %s)", sources.MinInterval, sources.MaxInterval))
	zeroIsDefault(imp.Flags(), "interval")

	var (
		filter  sources.ListFilter
		failing int
		asJSON  bool
		key     string
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List sources in fair order (never checked first, then longest since checked), with why they failed",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("failing") {
				n, err := minFailures("sources list", failing)
				if err != nil {
					return err
				}
				filter.MinFailures = n
			}
			if cmd.Flags().Changed("key") {
				filter.Key = &key
			}
			if err := filter.Validate(); err != nil {
				return fmt.Errorf("sources list: %w", renameField(err, sourceFlags))
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				list, err := sources.ListSources(cmd.Context(), pool, filter)
				if err != nil {
					return operateError(err, sourceFlags)
				}
				for i := range list {
					list[i].URL = redact.URL(list[i].URL) // no credentials in any output
				}
				if asJSON {
					return writeJSON(a.stdout, list)
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tPLATFORM\tKEY\tINTERVAL\tLAST CHECKED\tSTATUS\tOUTCOME\tFAILURES\tQUEUED\tURL\tREASON")
				for _, s := range list {
					reason := "-"
					if s.LastError != nil && s.LastOutcome != nil && (*s.LastOutcome == fetch.Failed || *s.LastOutcome == fetch.RateLimited) {
						reason = showReason(*s.LastError)
					}
					enabled := ""
					if !s.Enabled {
						enabled = " (disabled)"
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%v\t%s%s\t%s\n", s.ID, s.Platform, orDash(showKey(s.Key)), s.Interval,
						fmtTime(s.LastCheckedAt), fmtInt(s.LastStatus), fmtStr(s.LastOutcome), s.ConsecutiveFailures, s.QueuedAt != nil,
						s.URL, enabled, reason)
				}
				return tw.Flush()
			})
		},
	}
	list.Flags().StringVar(&filter.Platform, "platform", "", "only this platform")
	list.Flags().BoolVar(&filter.DueOnly, "due", false, "only sources due now (enabled, not queued, platform neither cooling down nor paused): what the next scan would queue, less each platform's cap")
	list.Flags().IntVar(&filter.Limit, "limit", sources.DefaultListLimit, fmt.Sprintf("at most this many (up to %d)", sources.MaxListLimit))
	list.Flags().IntVar(&failing, "failing", 0, fmt.Sprintf("only sources failing more than N times in a row (0: failing now; up to %d)", sources.MaxFailures-1))
	list.Flags().StringVar((*string)(&filter.Outcome), "outcome", "", "only sources whose last outcome is this: "+outcomeNames())
	list.Flags().StringVar(&key, "key", "", "only sources of this key (--key '': those without one)")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	remove := &cobra.Command{
		Use:   "remove ID...",
		Short: "Remove sources and their history (all or nothing)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("sources remove needs at least one ID")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			return a.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				n, err := sources.RemoveSources(cmd.Context(), pool, ids)
				if err != nil {
					return operateError(err, map[string]string{"id": "ID"})
				}
				fmt.Fprintf(a.stdout, "removed %d source(s)\n", n)
				return nil
			})
		},
	}
	cmd.AddCommand(add, imp, list, a.sourcesShowCmd(), a.sourcesSetCmd(), a.sourcesCheckCmd(), a.sourcesEnableCmd(false), a.sourcesEnableCmd(true), remove)
	return cmd
}

func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, s := range args {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id <= 0 {
			return nil, usagef("ID %q is not a positive integer", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

func fmtInt(p *int) string {
	if p == nil {
		return "-"
	}
	return strconv.Itoa(*p)
}

func fmtStr[S ~string](p *S) string {
	if p == nil {
		return "-"
	}
	return string(*p)
}

// outcomeNames lists fetch.Outcomes for --help.
func outcomeNames() string {
	names := make([]string, len(fetch.Outcomes))
	for i, o := range fetch.Outcomes {
		names[i] = string(o)
	}
	return strings.Join(names, ", ")
}

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
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
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

func (a *app) embeddedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "embedded",
		Short: "Manage the local embedded PostgreSQL cluster (used when no database URL is given)",
	}
	noDB := func(cmd *cobra.Command, _ []string) error { return a.setup(cmd) }
	cmd.AddCommand(&cobra.Command{
		Use:               "status",
		Short:             "Show whether the embedded cluster under --data-dir is running",
		Args:              noArgs,
		PersistentPreRunE: noDB,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := pgembed.Attach(pgembed.Config{DataDir: a.dataDir})
			if errors.Is(err, pgembed.ErrNotRunning) {
				fmt.Fprintf(a.stdout, "embedded PostgreSQL in %s: not running\n", a.dataDir)
				return nil
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "embedded PostgreSQL in %s: running on 127.0.0.1:%d (database %s)\n", a.dataDir, c.Port(), pgembed.DatabaseName)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "url",
		Short: "Print the embedded cluster's database URL (starting it and applying the schema if needed)",
		Long: `Print the URL of the embedded cluster's database under --data-dir — for
DATABASE_URL, or a program using fleetpace as a library (pacer.Config's
DatabaseURL) — starting the cluster if it is not running and applying the
schema, so the URL works at once. It ignores --database-url and
DATABASE_URL. Only the URL goes to stdout:

  export DATABASE_URL=$(fleetpace embedded url)`,
		Args:              noArgs,
		PersistentPreRunE: noDB,
		RunE: func(cmd *cobra.Command, _ []string) error {
			url, err := a.embeddedURL(cmd.Context())
			if err != nil {
				return dbError(err)
			}
			fmt.Fprintln(a.stdout, url)
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:               "stop",
		Short:             "Stop the embedded cluster under --data-dir (its data is kept)",
		Args:              noArgs,
		PersistentPreRunE: noDB,
		RunE: func(cmd *cobra.Command, _ []string) error {
			was, err := pgembed.StopShared(cmd.Context(), a.dataDir, pgembed.Config{})
			if err != nil {
				return err
			}
			if was {
				fmt.Fprintf(a.stdout, "embedded PostgreSQL in %s stopped\n", a.dataDir)
			} else {
				fmt.Fprintf(a.stdout, "embedded PostgreSQL in %s was not running\n", a.dataDir)
			}
			return nil
		},
	})
	return cmd
}
