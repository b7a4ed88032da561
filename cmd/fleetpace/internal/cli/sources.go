package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

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
