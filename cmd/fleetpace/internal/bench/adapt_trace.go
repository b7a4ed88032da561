package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/pacer"
)

// traceEnv turns the run's trace on: every cell's requests per second, the
// shared pacer's estimate as it moves, and what came before each of the
// default schedule's refusals. It is how a run that misses a figure is
// read: where the estimate went, and whether a refusal came from the pace
// (requests closer than the limit allows) or from the window's phase.
const traceEnv = "FLEETPACE_BENCH_ADAPT_TRACE"

// traceEvery is how often the estimate trace reads the pace rows.
const traceEvery = 100 * time.Millisecond

// traceEstimates records, until stop is called, each change of the
// estimate or of the slow-down count of the cells paced by the shared pacer
// (the default and classic schedules), with the pace and hold at that
// moment; stop returns the lines (printed after the run, not among its
// progress lines).
func traceEstimates(ctx context.Context, pool *pgxpool.Pool, run int, cells []cell, start time.Time) (stop func() []string) {
	var platforms []string
	for _, c := range cells {
		if c.schedule.Local == "" {
			platforms = append(platforms, c.platform)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg    sync.WaitGroup
		lines []string
	)
	wg.Go(func() {
		t := time.NewTicker(traceEvery)
		defer t.Stop()
		last := map[string]estimateMark{}
		for {
			states, err := pacer.StatesOf(ctx, pool, platforms)
			if err == nil {
				lines = append(lines, estimateLines(last, states, run, time.Since(start))...)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	return func() []string {
		cancel()
		wg.Wait()
		return lines
	}
}

// estimateMark is what the estimate trace compares: a line is printed when
// any of them moves.
type estimateMark struct {
	estimate  string // three decimals
	slowdowns int64
	holdEnd   string // when the fleet's hold ends, seconds into the run (tenths; "": none)
}

// estimateLines are the trace's lines for the states read at elapsed into
// run whose estimate or slow-down count moved since last (updated).
func estimateLines(last map[string]estimateMark, states []pacer.State, run int, elapsed time.Duration) []string {
	var out []string
	for _, st := range states {
		m := estimateMark{estimate: fmt.Sprintf("%.3f", st.Estimate), slowdowns: st.Slowdowns}
		if st.Hold > 0 {
			m.holdEnd = fmt.Sprintf("%.1f", (elapsed + st.Hold).Seconds())
		}
		if prev, ok := last[st.Platform]; ok && prev == m {
			continue
		}
		last[st.Platform] = m
		hold := fmt.Sprintf("%.2fs", st.Hold.Seconds())
		if st.Hold > 0 && st.HoldReason != "" {
			hold += " (" + st.HoldReason + ")"
		}
		out = append(out, fmt.Sprintf("run %d: %s at %6.2fs: estimate %s/s, pace %.3f/s (%s), hold %s, slow-downs %d",
			run, st.Platform, elapsed.Seconds(), m.estimate, st.EffectiveRate, st.PacedBy, hold, st.Slowdowns))
	}
	return out
}

// trace prints a cell's accepted and refused requests per second and, for
// the default schedule, its refusals from second 10 on.
func trace(cfg AdaptConfig, run int, c cell, reqs []arrival, start time.Time) {
	var ok, lim []time.Time
	for _, r := range reqs {
		if r.Limited {
			lim = append(lim, r.At)
		} else {
			ok = append(ok, r.At)
		}
	}
	fmt.Fprintf(cfg.Progress, "run %d: %s per second ok:  %v\n", run, c.platform, fakedest.RateSeries(ok, start, time.Second))
	fmt.Fprintf(cfg.Progress, "run %d: %s per second 429: %v\n", run, c.platform, fakedest.RateSeries(lim, start, time.Second))
	if c.schedule.Name == ScheduleDefault {
		for _, line := range refusalLines(reqs, start, 10*time.Second) {
			fmt.Fprintf(cfg.Progress, "run %d: %s %s\n", run, c.platform, line)
		}
		if gaps := gapLines(reqs, start, 10*time.Second); len(gaps) > 0 {
			fmt.Fprintf(cfg.Progress, "run %d: %s gaps over %v: %s\n", run, c.platform, traceGap, strings.Join(gaps, ", "))
		}
	}
}

// refusalNeighbours is how many requests before a refusal its trace line
// shows: enough to read the spacing the destination saw.
const refusalNeighbours = 3

// refusalLines describes each refusal in reqs (in arrival order) from
// `from` into the run on: when it came, how far into its wall-clock second
// (fixed windows of the fake destination are aligned on whole seconds),
// and the gaps to the requests before it — requests closer than the limit
// allows read as gaps under 1/limit, a window's phase as gaps at it.
func refusalLines(reqs []arrival, start time.Time, from time.Duration) []string {
	var out []string
	for i, r := range reqs {
		if !r.Limited || r.At.Sub(start) < from {
			continue
		}
		var b strings.Builder
		fmt.Fprintf(&b, "429 at %.3fs (%.3f into its second), gaps before it:", r.At.Sub(start).Seconds(),
			r.At.Sub(r.At.Truncate(time.Second)).Seconds())
		for j := i - 1; j >= 0 && j >= i-refusalNeighbours; j-- {
			mark := ""
			if reqs[j].Limited {
				mark = " (429)"
			}
			fmt.Fprintf(&b, " %.3fs%s", reqs[j+1].At.Sub(reqs[j].At).Seconds(), mark)
		}
		out = append(out, b.String())
	}
	return out
}

// traceGap is the silence at the destination the trace lists: longer than
// any spacing the benchmark's limits ask for below 2/s, so each one is a
// hold or a stall of the fleet.
const traceGap = 600 * time.Millisecond

// gapLines lists each silence at the destination longer than traceGap from
// `from` into the run on, as "start+length" in seconds.
func gapLines(reqs []arrival, start time.Time, from time.Duration) []string {
	var out []string
	for i := 1; i < len(reqs); i++ {
		if d := reqs[i].At.Sub(reqs[i-1].At); d > traceGap && reqs[i].At.Sub(start) >= from {
			out = append(out, fmt.Sprintf("%.2f+%.2f", reqs[i-1].At.Sub(start).Seconds(), d.Seconds()))
		}
	}
	return out
}
