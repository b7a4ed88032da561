package cli

import (
	"os"
	"os/exec"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/internal/bench"
)

func (a *app) benchPacerCmd() *cobra.Command {
	var (
		cfg    bench.PacerConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "pacer",
		Short: "Reservation latency and throughput vs SELECT 1 and a bare upsert; accuracy of a multi-process fleet",
		Long: `Measures, in one run on one database:
  - round trips of SELECT 1 (the floor), a bare single-row upsert of the
    reservation's shape (the physical limit of one row) and a pacer
    reservation at an unlimited rate, one statement each: median and p99
    latency with one caller, throughput with 1, 4 and 16 concurrent callers
    on one platform; beside them, the same reservations with blocks on (the
    pacer's default), which take many slots per statement;
  - accuracy: a ceiling shared by several processes × goroutines for a while:
    delivered rate / ceiling and the largest 1-s window.
Targets: reservation median ≤ 1.5× the bare upsert; throughput at 4 callers
≥ 0.8× the upsert's; delivered/ceiling ≥ 0.97; largest window ≤ ceiling + burst.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			return a.runBench(cmd.Context(), asJSON, func(_ *pgxpool.Pool, url string) (benchResult, error) {
				cfg.DatabaseURL = url
				cfg.Progress = a.stderr
				cfg.Spawn = func(args []string) *exec.Cmd {
					return exec.Command(self, append([]string{"bench", "pacer-child"}, args...)...)
				}
				return bench.Pacer(cmd.Context(), cfg)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.LatencySamples, "samples", bench.DefaultPacerSamples, "round trips of each kind for the latency figures")
	f.DurationVar(&cfg.ThroughputDuration, "throughput-duration", bench.DefaultPacerThroughputDuration, "length of each throughput measurement")
	f.Float64Var(&cfg.Ceiling, "ceiling", bench.DefaultPacerCeiling, "rate of the accuracy measurement, per second")
	f.IntVar(&cfg.Burst, "burst", bench.DefaultPacerBurst, "burst of the accuracy measurement")
	f.IntVar(&cfg.Processes, "processes", bench.DefaultPacerProcesses, "processes of the accuracy measurement")
	f.IntVar(&cfg.Goroutines, "goroutines", bench.DefaultPacerGoroutines, "goroutines per process of the accuracy measurement")
	f.DurationVar(&cfg.AccuracyDuration, "accuracy-duration", bench.DefaultPacerAccuracyDuration, "length of the accuracy measurement")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	zeroIsDefault(f, "samples", "throughput-duration", "ceiling", "burst", "processes", "goroutines", "accuracy-duration")
	return cmd
}

// benchPacerChildCmd is one process of the accuracy measurement; hidden.
func (a *app) benchPacerChildCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "pacer-child",
		Hidden:             true,
		DisableFlagParsing: true,
		PersistentPreRunE:  func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.PacerChild(cmd.Context(), args, a.stdout)
		},
	}
}
