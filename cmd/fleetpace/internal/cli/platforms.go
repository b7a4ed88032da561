package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/sources"
)

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
