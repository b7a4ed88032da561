package worker

import (
	"context"
	"errors"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// jobMetrics is River worker middleware (river.Config.Middleware) that
// counts the jobs this process works by kind and result and times them:
// fleetpace_river_jobs_worked_total, fleetpace_river_job_run_seconds and
// fleetpace_river_job_queue_wait_seconds. Labels are bounded: the kinds
// the client works and five results.
type jobMetrics struct {
	river.MiddlewareDefaults
	m *Metrics
}

var _ rivertype.WorkerMiddleware = (*jobMetrics)(nil)

func (j *jobMetrics) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	start := time.Now()
	if job.AttemptedAt != nil && !job.ScheduledAt.IsZero() {
		j.m.jobWait.WithLabelValues(job.Kind).Observe(max(job.AttemptedAt.Sub(job.ScheduledAt), 0).Seconds())
	}
	err := doInner(ctx)
	j.m.jobRun.WithLabelValues(job.Kind).Observe(time.Since(start).Seconds())
	j.m.jobs.WithLabelValues(job.Kind, jobResult(job, err)).Inc()
	return err
}

// jobResult is what River does with a job that returned err.
func jobResult(job *rivertype.JobRow, err error) string {
	var snooze *rivertype.JobSnoozeError
	var cancel *rivertype.JobCancelError
	switch {
	case err == nil:
		return "completed"
	case errors.As(err, &snooze):
		return "snoozed"
	case errors.As(err, &cancel):
		return "cancelled"
	case job.Attempt >= job.MaxAttempts:
		return "discarded"
	}
	return "retried"
}

// RiverMiddleware is the River middleware that feeds m's job metrics
// (nil: none).
func (m *Metrics) RiverMiddleware() []rivertype.Middleware {
	if m == nil {
		return nil
	}
	return []rivertype.Middleware{&jobMetrics{m: m}}
}
