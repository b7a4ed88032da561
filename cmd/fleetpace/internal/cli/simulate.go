package cli

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/herd"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/redact"
)

func (a *app) simulateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Reproduce a fleet's poll herd: in virtual time (herd) or against a real PostgreSQL (drill)",
		Long: `Reproduce what a large fleet of pollers does to a capped database pool, with
fleetpace's polling (startup jitter, per-cycle jitter, one connection attempt
and fail fast) side by side with a deterministic schedule and
retry-on-acquire — the pair that turned a 30-second herd into a multi-hour
outage.`,
	}
	cmd.AddCommand(a.simulateHerdCmd(), a.simulateDrillCmd())
	return cmd
}

func (a *app) simulateHerdCmd() *cobra.Command {
	var (
		cfg         herd.SimConfig
		scenario    string
		modes       string
		attemptCost time.Duration
		asJSON      bool
		chart       string
	)
	cmd := &cobra.Command{
		Use:   "herd",
		Short: "Discrete-event simulation of N pollers against a pool of K backends, every polling mode in one run",
		Long: `Simulate a fleet of --pollers pollers, in virtual time, against a pool capped at
--backends backends whose claim query takes --claim-time. Every poller runs
the poller package's own schedule, jitter and startup delay. The defaults are
a fleet that once went down: 11,543 pollers, 368 backends, a 170-ms claim.

Scenarios (--scenario):
  restart     every poller starts at t=0 (a rollout, or a restart of the fleet)
  db-restart  a warm fleet; at --at every connection drops and every attempt
              is refused for --for
  saturation  a warm fleet; from --at for --for every claim takes --slowdown
              times as long and --hold backends are taken
A warm fleet has been running: schedules at --poll-max, next polls spread
over it (so startup jitter changes nothing there).

Modes, each on its own copy of the fleet: the schedule deterministic, with
per-cycle jitter only, startup jitter only, or both (fleetpace); and on a
refused connection fail-fast (fleetpace: the cycle fails, the schedule backs
off) or retry (the poller holds a pending connection and knocks again every
--retry-delay for --retry-for). Every connection attempt costs the server
--attempt-cost of CPU out of --cores, and claims slow down by the share it
takes: thousands of knocking retriers are what keeps a pool from draining.

Printed per mode: polls (claims attempted) per second — peak, mean over the
run, peak/mean — claims served per second, peak backends busy against the
pool's size, refused attempts, peak pending connections, the longest claim,
the time to drain after the event, and a sparkline of polls per second.
The same seed gives the same figures.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Scenario.Kind = herd.ScenarioKind(scenario)
			cfg.AttemptCost = attemptCost
			if attemptCost == 0 {
				cfg.AttemptCost = herd.NoAttemptCost
			}
			if modes != "all" {
				for _, s := range strings.Split(modes, ",") {
					m, err := herd.ParseMode(s)
					if err != nil {
						return usagef("--modes: %w", err)
					}
					cfg.Modes = append(cfg.Modes, m)
				}
			}
			if err := herdFlagErrors(cmd, cfg); err != nil {
				return err
			}
			res, err := herd.Simulate(cmd.Context(), cfg)
			if errors.Is(err, herd.ErrInvalidConfig) {
				return usagef("%w", err)
			}
			if err != nil {
				return err
			}
			if chart != "" {
				if err := res.WriteChart(chart); err != nil {
					return fmt.Errorf("--chart %s: %w", chart, err)
				}
			}
			if asJSON {
				return res.WriteJSON(a.stdout)
			}
			if err := res.WriteText(a.stdout); err != nil {
				return err
			}
			if chart != "" {
				fmt.Fprintf(a.stdout, "\nchart: %s\n", chart)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Pollers, "pollers", herd.DefaultPollers, "pollers in the fleet (up to 1,000,000)")
	f.IntVar(&cfg.Backends, "backends", herd.DefaultBackends, "the pool's cap on concurrent claims")
	f.DurationVar(&cfg.ClaimTime, "claim-time", herd.DefaultClaimTime, "service time of one claim on an unloaded server")
	f.DurationVar(&cfg.Base, "poll-base", poller.DefaultBase, "the pollers' shortest sleep (the schedule's first step)")
	f.DurationVar(&cfg.Max, "poll-max", poller.DefaultMax, "the pollers' longest sleep, and the startup jitter's bound")
	f.Float64Var(&cfg.JitterRatio, "poll-jitter", poller.DefaultJitterRatio, "per-cycle jitter ratio of the modes that have it, in (0, 1]")
	f.StringVar(&scenario, "scenario", string(herd.Restart), "restart, db-restart or saturation")
	f.DurationVar(&cfg.Scenario.At, "at", 0, "when the database restart or the saturation window starts (default: --poll-max)")
	f.DurationVar(&cfg.Scenario.For, "for", 0, "how long the database is down or saturated (default: 20s db-restart, 1m saturation)")
	f.Float64Var(&cfg.Scenario.Slowdown, "slowdown", herd.DefaultSlowdown, "saturation: claims take this many times as long (≥ 1)")
	f.IntVar(&cfg.Scenario.Hold, "hold", 0, "saturation: backends taken by something else during the window")
	f.DurationVar(&cfg.Duration, "duration", 0, "virtual time simulated (default: 2 × --poll-max for restart, else --at + --for + 10 × --poll-max)")
	f.DurationVar(&cfg.RetryDelay, "retry-delay", herd.DefaultRetryDelay, "retry modes: a refused poller knocks again this often")
	f.DurationVar(&cfg.RetryFor, "retry-for", herd.DefaultRetryFor, "retry modes: how long it knocks before its cycle fails")
	f.DurationVar(&attemptCost, "attempt-cost", herd.DefaultAttemptCost, "server CPU one connection attempt costs, granted or refused (0: free)")
	f.IntVar(&cfg.Cores, "cores", herd.DefaultCores, "the server's CPUs that connection attempts compete for")
	f.Uint64Var(&cfg.Seed, "seed", herd.DefaultSeed, "random seed (same seed, same figures)")
	f.StringVar(&modes, "modes", "all", "comma-separated modes to simulate, e.g. deterministic/retry,both-jitter/fail-fast")
	f.BoolVar(&asJSON, "json", false, "print one JSON object, with the per-second series")
	f.StringVar(&chart, "chart", "", "also draw polls and claims served per second, one panel per mode (.svg, or .png)")
	return cmd
}

// herdFlagErrors names the flag behind a zero or negative value that the
// config would otherwise read as "default".
func herdFlagErrors(cmd *cobra.Command, cfg herd.SimConfig) error {
	checks := []struct {
		flag string
		bad  bool
	}{
		{"pollers", cfg.Pollers <= 0}, {"backends", cfg.Backends <= 0}, {"claim-time", cfg.ClaimTime <= 0},
		{"poll-base", cfg.Base <= 0}, {"poll-max", cfg.Max <= 0}, {"poll-jitter", cfg.JitterRatio <= 0},
		{"retry-delay", cfg.RetryDelay <= 0}, {"retry-for", cfg.RetryFor <= 0}, {"cores", cfg.Cores <= 0},
		{"seed", cfg.Seed == 0}, {"slowdown", !(cfg.Scenario.Slowdown >= 1) || math.IsInf(cfg.Scenario.Slowdown, 1)},
	}
	for _, c := range checks {
		if c.bad {
			return usagef("--%s: %s is out of range (see --help)", c.flag, cmd.Flags().Lookup(c.flag).Value)
		}
	}
	for _, name := range []string{"at", "for", "duration", "hold", "attempt-cost"} {
		if v := cmd.Flags().Lookup(name).Value.String(); strings.HasPrefix(v, "-") {
			return usagef("--%s: %s must not be negative", name, v)
		}
	}
	return nil
}

func (a *app) simulateDrillCmd() *cobra.Command {
	var (
		cfg    herd.DrillConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "drill",
		Short: "Real saturation drill: thousands of pollers against a PostgreSQL with max_connections lowered",
		Long: `Run --pollers real pollers in this process against a real PostgreSQL — a
throwaway embedded cluster started with --max-connections, or --database-url —
twice: with fleetpace's polling (startup jitter, per-cycle jitter, one
connection attempt and fail fast) and with the outage's baseline
(deterministic schedule, retry-on-acquire every --retry-delay for
--retry-for).

Each poller runs the poller package's loop on the real clock; each claim
opens a connection from the poller's own fail-fast pool (the dbconn
configuration every fleetpace pool has), runs the claim for --claim-time and
closes the connection. After --warmup, for --window, an advisory lock blocks
every claim: the claims in flight hold their connections and the server
fills up to max_connections, so further attempts are refused (SQLSTATE
53300). pg_stat_activity is sampled every --sample-every.

Printed per mode: peak active backends (overall and after the window), refused
connection attempts by SQLSTATE, and the time from the window's end to the
last refused attempt. The drill creates nothing in the database. With
--database-url, the server's own max_connections applies, and other clients
of that server will be refused during the drill.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.DatabaseURL = a.databaseURL
			cfg.ConnectTimeout = a.connectTimeout
			cfg.Logger = a.logger
			for _, name := range []string{"pollers", "max-connections", "claim-time", "poll-base", "poll-max",
				"warmup", "window", "after", "retry-delay", "retry-for", "sample-every", "seed"} {
				v := cmd.Flags().Lookup(name).Value.String()
				if strings.HasPrefix(v, "-") || v == "0" || v == "0s" {
					return usagef("--%s: %s is out of range (see --help)", name, v)
				}
			}
			if cfg.JitterRatio <= 0 {
				return usagef("--poll-jitter: must be in (0, 1], got %v", cfg.JitterRatio)
			}
			if err := cfg.Validate(); err != nil {
				return usagef("%w", err)
			}
			if a.databaseURL != "" {
				if _, err := dbconn.PoolConfig(dbconn.Config{URL: a.databaseURL}); err != nil {
					return err
				}
				a.announce("drilling database %s", redact.DescribeDatabase(a.databaseURL))
			}
			res, err := herd.Drill(cmd.Context(), cfg)
			if err != nil {
				return dbError(err)
			}
			if asJSON {
				return res.WriteJSON(a.stdout)
			}
			return res.WriteText(a.stdout)
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Pollers, "pollers", herd.DefaultDrillPollers, "pollers in this process, each with its own pool")
	f.IntVar(&cfg.MaxConnections, "max-connections", herd.DefaultDrillMaxConnections, "the embedded cluster's max_connections (ignored with --database-url)")
	f.DurationVar(&cfg.ClaimTime, "claim-time", herd.DefaultDrillClaimTime, "how long one claim works once it has its lock")
	f.DurationVar(&cfg.Base, "poll-base", poller.DefaultBase, "the pollers' shortest sleep")
	f.DurationVar(&cfg.Max, "poll-max", poller.DefaultMax, "the pollers' longest sleep, and fleetpace's startup jitter bound")
	f.Float64Var(&cfg.JitterRatio, "poll-jitter", poller.DefaultJitterRatio, "fleetpace's per-cycle jitter ratio, in (0, 1]")
	f.DurationVar(&cfg.Warmup, "warmup", 40*time.Second, "how long the pollers run before the window")
	f.DurationVar(&cfg.Window, "window", herd.DefaultDrillWindow, "how long every claim is blocked")
	f.DurationVar(&cfg.After, "after", 50*time.Second, "how long the pollers run after the window")
	f.DurationVar(&cfg.RetryDelay, "retry-delay", herd.DefaultRetryDelay, "baseline: a refused poller tries again this often")
	f.DurationVar(&cfg.RetryFor, "retry-for", herd.DefaultRetryFor, "baseline: how long it tries before its cycle fails")
	f.DurationVar(&cfg.SampleEvery, "sample-every", herd.DefaultSampleEvery, "pg_stat_activity sampling interval")
	f.Uint64Var(&cfg.Seed, "seed", herd.DefaultSeed, "random seed of fleetpace's jitter")
	f.BoolVar(&asJSON, "json", false, "print one JSON object, with per-second series")
	return cmd
}
