package cli

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/internal/bench"
)

func (a *app) benchWorkerCmd() *cobra.Command {
	var (
		cfg    bench.WorkerConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Jobs/s of the whole fleetpace fetch job (no-op fetcher) vs bare River jobs, same workers",
		Long: `Measures jobs per second of fleetpace's fetch job as the scan queues it —
pacer reserve and report, the check recorded (written behind the job, with
group commit) — with a no-op fetcher and an effectively unlimited platform
(1e9/s), side by side with bare River jobs whose worker does nothing, on one
database with the same River settings and worker count. Each run inserts
--jobs jobs, starts a client and times until all have completed and, for
fleetpace, every check has been written; the sides alternate for --runs runs
and medians are reported. Target: ratio ≥ 0.7.

--fetch-cooldown defaults to River's minimum (1ms): with River's default
(100ms) both sides are capped at --workers jobs per 100 ms and the ratio says
nothing about the cost of a job.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cfg.Validate(); err != nil {
				return err
			}
			return a.runBench(cmd.Context(), asJSON, func(_ *pgxpool.Pool, url string) (benchResult, error) {
				cfg.DatabaseURL = url
				cfg.Progress = a.stderr
				cfg.Logger = a.logger
				return bench.Worker(cmd.Context(), cfg)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Workers, "workers", bench.DefaultWorkerWorkers, "River workers (MaxWorkers) of both clients, like the worker's --concurrency")
	f.IntVar(&cfg.Jobs, "jobs", bench.DefaultWorkerJobs, "jobs per run")
	f.IntVar(&cfg.Runs, "runs", bench.DefaultWorkerRuns, "runs of each side (alternating); medians are reported")
	f.DurationVar(&cfg.FetchCooldown, "fetch-cooldown", bench.DefaultWorkerFetchCooldown, "River FetchCooldown of both clients (River's minimum; its default 100ms would cap both sides)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object (fleetpace_jobs_per_sec, river_jobs_per_sec, ratio, workers, …)")
	zeroIsDefault(f, "workers", "jobs", "runs", "fetch-cooldown")
	return cmd
}
