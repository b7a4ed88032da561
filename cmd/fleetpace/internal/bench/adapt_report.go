package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// AdaptRow is one (model, schedule) cell: the medians of its runs, and
// every run.
type AdaptRow struct {
	Model    string `json:"model"`
	Schedule string `json:"schedule"`
	Headers  bool   `json:"headers"`
	Figure   string `json:"figure,omitempty"`
	Nginx    bool   `json:"nginx,omitempty"`
	// Allowance is what the destination allows at the start, requests/s.
	Allowance float64 `json:"allowance_per_sec"`
	// Bound is ceiling + burst, which no 1-s window may exceed; MaxWindow
	// (in RunFigures) is the largest of the runs, not a median.
	Bound int `json:"bound"`
	RunFigures
	// Runs are the figures of every run, in run order.
	Runs []RunFigures `json:"runs"`
	// Missed lists the targets this row misses (default schedule
	// only; empty: all met).
	Missed []string `json:"missed,omitempty"`
}

// AdaptResult is the benchmark's outcome.
type AdaptResult struct {
	Workers     int        `json:"workers"`
	Concurrency int        `json:"concurrency"`
	Ceiling     float64    `json:"ceiling_per_sec"`
	Duration    string     `json:"duration"`
	Runs        int        `json:"runs"`
	Sweep       string     `json:"sweep,omitempty"`
	Nginx       bool       `json:"nginx,omitempty"`
	Schedules   []Schedule `json:"schedules"`
	Rows        []AdaptRow `json:"rows"`
	// LoadBefore and LoadAfter are /proc/loadavg's 1-, 5- and 15-minute
	// load averages when the benchmark started and ended: figures from a
	// loaded machine read low on the strict models.
	LoadBefore string `json:"load_average_before"`
	LoadAfter  string `json:"load_average_after"`
}

// Targets of the default schedule: goodput over seconds
// 10–70 ≥ 0.9 with ≤ 2 % 429s; announced limits ≥ 0.95 with ≤ 0.5 %; real
// nginx ≥ 0.9 with ≤ 1 % without burst, ≥ 0.97 with; a 5-s span at ≥ 0.85
// within 10 s; after a drop ×2 the 429s stop within 3 s, after a rise ×2
// ≥ 0.85 of the new limit within 30 s; goodput ≥ the AWS mode's and within
// 0.05 of the oracle's; no 1-s window over ceiling + burst.
const (
	AdaptGoodputTarget       = 0.9
	AdaptShareTarget         = 0.02
	AdaptHeaderGoodputTarget = 0.95
	AdaptHeaderShareTarget   = 0.005
	AdaptNginxShareTarget    = 0.01
	AdaptNginxBurstTarget    = 0.97
	AdaptReachTarget         = 10.0
	AdaptDropStopTarget      = 3.0
	AdaptRiseTarget          = 30.0
	AdaptOracleMargin        = 0.05
)

// medianRow is a cell's row: the median of every figure over its runs, the
// largest 1-s window of any.
func medianRow(c cell, bound int, allowance float64, runs []RunFigures) AdaptRow {
	row := AdaptRow{Model: c.model.Name, Schedule: c.schedule.Name, Headers: c.model.announces(), Figure: c.model.Figure,
		Nginx: c.model.nginx(), Allowance: allowance, Bound: bound, Runs: runs}
	pick := func(get func(RunFigures) float64) float64 {
		var xs []float64
		for _, r := range runs {
			xs = append(xs, get(r))
		}
		return median(xs)
	}
	row.Goodput1070 = pick(func(r RunFigures) float64 { return r.Goodput1070 })
	row.GoodputHalf = pick(func(r RunFigures) float64 { return r.GoodputHalf })
	row.Goodput10End = pick(func(r RunFigures) float64 { return r.Goodput10End })
	row.Limited10End = pick(func(r RunFigures) float64 { return r.Limited10End })
	row.LimitedHalf = pick(func(r RunFigures) float64 { return r.LimitedHalf })
	row.Reach = pickNever(runs, func(r RunFigures) float64 { return r.Reach })
	row.Rise = pickNever(runs, func(r RunFigures) float64 { return r.Rise })
	row.DropStop = pickNever(runs, func(r RunFigures) float64 { return r.DropStop })
	row.OldSpacing = pick(func(r RunFigures) float64 { return r.OldSpacing })
	for _, r := range runs {
		row.MaxWindow = max(row.MaxWindow, r.MaxWindow)
	}
	return row
}

// pickNever is the median of a figure where -1 means never: never counts
// as the longest, and a median of an even count that averages never in is
// never.
func pickNever(runs []RunFigures, get func(RunFigures) float64) float64 {
	var xs []float64
	never := false
	for _, r := range runs {
		v := get(r)
		if v < 0 {
			v, never = 1e18, true
		}
		xs = append(xs, v)
	}
	m := median(xs)
	if never && m >= 1e17 {
		return -1
	}
	return m
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// judge fills Missed for every default-schedule row: the targets it misses,
// those against the AWS and oracle rows of the same model included.
func (r *AdaptResult) judge() {
	byCell := map[[2]string]AdaptRow{}
	for _, row := range r.Rows {
		byCell[[2]string{row.Model, row.Schedule}] = row
	}
	for i := range r.Rows {
		row := &r.Rows[i]
		if row.Schedule != ScheduleDefault {
			continue
		}
		row.Missed = nil
		miss := func(cond bool, what string, args ...any) {
			if cond {
				row.Missed = append(row.Missed, fmt.Sprintf(what, args...))
			}
		}
		g, s := AdaptGoodputTarget, AdaptShareTarget
		switch {
		case row.Nginx && strings.Contains(row.Model, "burst"):
			g, s = AdaptNginxBurstTarget, AdaptNginxShareTarget
		case row.Nginx:
			s = AdaptNginxShareTarget
		case row.Headers:
			g, s = AdaptHeaderGoodputTarget, AdaptHeaderShareTarget
		}
		steady := row.Figure == ""
		miss(steady && row.Goodput1070 < g, "goodput %.2f < %.2f", row.Goodput1070, g)
		miss(steady && row.Limited10End > s, "429s %.1f%% > %.1f%%", 100*row.Limited10End, 100*s)
		miss(row.Figure != FigureRise && (row.Reach < 0 || row.Reach > AdaptReachTarget), "reach > %.0fs", AdaptReachTarget)
		miss(row.MaxWindow > row.Bound, "1-s window %d > %d", row.MaxWindow, row.Bound)
		miss(row.Figure == FigureDrop && (row.DropStop < 0 || row.DropStop > AdaptDropStopTarget), "drop > %.0fs", AdaptDropStopTarget)
		miss(row.Figure == FigureRise && (row.Rise < 0 || row.Rise > AdaptRiseTarget), "rise > %.0fs", AdaptRiseTarget)
		if aws, ok := byCell[[2]string{row.Model, ScheduleAWS}]; ok {
			miss(row.Goodput1070 < aws.Goodput1070, "< aws")
		}
		if o, ok := byCell[[2]string{row.Model, ScheduleOracle}]; ok {
			miss(row.Goodput1070 < o.Goodput1070-AdaptOracleMargin, "oracle −%.2f", o.Goodput1070-row.Goodput1070)
		}
	}
}

// WriteText prints the table.
func (r *AdaptResult) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "bench adapt: %d workers × concurrency %d, ceiling %g/s, %s per run of a model, medians of %d run(s)\n",
		r.Workers, r.Concurrency, r.Ceiling, r.Duration, r.Runs)
	fmt.Fprintf(w, "load average (1, 5, 15 min): %s before, %s after\n", r.LoadBefore, r.LoadAfter)
	for _, s := range r.Schedules {
		fmt.Fprintf(w, "  schedule %-8s %s\n", s.Name, s.describe())
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\tschedule\tallows/s\tgood 10-70\tgood half\t429 10-end\t429 half\treach 0.85\tmax 1 s\trise/drop\told spacing\ttargets\t")
	for _, row := range r.Rows {
		figure := "-"
		switch row.Figure {
		case FigureRise:
			figure = "rise " + seconds(row.Rise)
		case FigureDrop:
			figure = "drop " + seconds(row.DropStop)
		}
		old := "-"
		if row.OldSpacing >= 0 {
			old = fmt.Sprintf("%.0f", row.OldSpacing)
		}
		targets := "-"
		if row.Schedule == ScheduleDefault && r.Sweep == "" {
			targets = "met"
			if len(row.Missed) > 0 {
				targets = strings.Join(row.Missed, "; ")
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3g\t%.2f\t%.2f\t%.1f%%\t%.1f%%\t%s\t%d/%d\t%s\t%s\t%s\t\n", row.Model, row.Schedule, row.Allowance,
			row.Goodput1070, row.GoodputHalf, 100*row.Limited10End, 100*row.LimitedHalf, seconds(row.Reach),
			row.MaxWindow, row.Bound, figure, old, targets)
	}
	return tw.Flush()
}

// seconds formats a figure in seconds, -1 as "never".
func seconds(s float64) string {
	if s < 0 {
		return "never"
	}
	return fmt.Sprintf("%.1fs", s)
}

// WriteJSON prints the result as JSON.
func (r *AdaptResult) WriteJSON(w io.Writer) error { return writeJSON(w, r) }
