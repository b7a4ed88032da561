package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/status"
)

// sample is one platform's state at one moment.
type sample struct {
	rate       float64 // requests/s at the destination over the last second
	multiplier float64
	n429       int
	cooldown   time.Duration // remaining
	coolCount  int
	checked    int64
	total      int64
}

// monitor samples the destination and the status, draws progress, and keeps
// the series the summary and chart are made of.
type monitor struct {
	cfg    Config
	pool   *pgxpool.Pool
	dest   *fakedest.Server
	origin time.Time
	out    io.Writer

	times   []float64  // seconds since origin, one per sample
	samples [][]sample // [sample][platform]
	drawn   int        // lines drawn last time (terminal redraw)
	last    []sample
	cooled  []float64 // seconds each platform was seen cooling down
}

func newMonitor(cfg Config, pool *pgxpool.Pool, dest *fakedest.Server, origin time.Time, out io.Writer) *monitor {
	return &monitor{cfg: cfg, pool: pool, dest: dest, origin: origin, out: out, cooled: make([]float64, len(specs))}
}

// run samples every Refresh until the duration is over (nil) or ctx ends
// (ErrInterrupted), switching the cooldown platform's rule on schedule. A
// worker that exits early ends the run with an error.
func (m *monitor) run(ctx context.Context, fl *workers.Fleet, tl timeline) error {
	tick := time.NewTicker(m.cfg.Refresh)
	defer tick.Stop()
	end := time.NewTimer(m.cfg.Duration)
	defer end.Stop()
	blockOn := time.NewTimer(tl.blockAt)
	defer blockOn.Stop()
	var blockOff <-chan time.Time
	lastPlain := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return ErrInterrupted
		case <-end.C:
			return nil
		case <-blockOn.C:
			for _, s := range specs {
				if s.cooldown {
					_ = m.dest.SetRule(s.prefix(), fakedest.Blocked(tl.retryAfter))
				}
			}
			t := time.NewTimer(tl.blockFor)
			defer t.Stop()
			blockOff = t.C
		case <-blockOff:
			for _, s := range specs {
				if s.cooldown {
					m.dest.DeleteRule(s.prefix())
				}
			}
			blockOff = nil
		case now := <-tick.C:
			if err := fl.Exited(); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			m.sample(ctx, now)
			if m.cfg.Terminal {
				m.draw(now)
			} else if now.Sub(lastPlain) >= m.cfg.PlainEvery {
				m.plain(now)
				lastPlain = now
			}
		}
	}
}

func (m *monitor) sample(ctx context.Context, now time.Time) {
	qctx, cancel := context.WithTimeout(ctx, m.cfg.Refresh)
	rep, err := status.Read(qctx, m.pool)
	cancel()
	row := make([]sample, len(specs))
	for i, s := range specs {
		arr := m.dest.Arrivals(s.prefix())
		n := 0
		for j := len(arr) - 1; j >= 0 && now.Sub(arr[j]) < time.Second; j-- {
			n++
		}
		row[i].rate = float64(n)
		row[i].n429 = m.dest.CountStatus(s.prefix(), http.StatusTooManyRequests)
		row[i].multiplier = 1
		if m.last != nil {
			row[i].multiplier = m.last[i].multiplier
			row[i].checked, row[i].total = m.last[i].checked, m.last[i].total
		}
		if err != nil || rep == nil {
			continue
		}
		for _, p := range rep.Platforms {
			if p.Name != s.name {
				continue
			}
			row[i].multiplier = p.Pace.Multiplier
			if p.Cooldown != nil {
				row[i].cooldown = p.Cooldown.Remaining
				row[i].coolCount = p.Cooldown.Count
				m.cooled[i] += m.cfg.Refresh.Seconds()
			}
			row[i].total = p.Counts.Sources
			row[i].checked = p.Counts.Sources - p.Counts.NeverChecked
		}
	}
	m.times = append(m.times, now.Sub(m.origin).Seconds())
	m.samples = append(m.samples, row)
	m.last = row
}

// lines renders the progress table.
func (m *monitor) lines(now time.Time) []string {
	var b strings.Builder
	elapsed := min(now.Sub(m.origin), m.cfg.Duration)
	fmt.Fprintf(&b, "fleetpace demo  %3.0fs / %.0fs  %d workers\n", elapsed.Seconds(), m.cfg.Duration.Seconds(), m.cfg.Workers)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "platform\treq/s\tceiling\tdest limit\tmultiplier\t429s\tcooldown left\tchecked\t\n")
	for i, s := range specs {
		var r sample
		if m.last != nil {
			r = m.last[i]
		}
		dl := "-"
		if s.destRate > 0 {
			dl = fmt.Sprintf("%g/s", s.destRate)
		}
		cd := "-"
		if r.cooldown > 0 {
			cd = r.cooldown.Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%g/s\t%s\t×%.3g\t%d\t%s\t%d/%d\t\n", s.name, r.rate, s.rate, dl, r.multiplier, r.n429, cd, r.checked, r.total)
	}
	tw.Flush()
	return strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
}

// draw redraws the table in place (ANSI: cursor up, clear line).
func (m *monitor) draw(now time.Time) {
	var b strings.Builder
	if m.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", m.drawn)
	}
	lines := m.lines(now)
	for _, l := range lines {
		b.WriteString("\x1b[2K")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	m.drawn = len(lines)
	io.WriteString(m.out, b.String())
}

// plain prints one line per platform, for logs and pipes.
func (m *monitor) plain(now time.Time) {
	t := now.Sub(m.origin).Seconds()
	for i, s := range specs {
		r := m.last[i]
		cd := "none"
		if r.cooldown > 0 {
			cd = r.cooldown.Round(time.Second).String()
		}
		fmt.Fprintf(m.out, "t=%3.0fs %-9s %3.0f req/s (ceiling %g/s)  multiplier ×%.3g  429s %d  cooldown %s  checked %d/%d\n",
			t, s.name, r.rate, s.rate, r.multiplier, r.n429, cd, r.checked, r.total)
	}
}

// finish leaves the terminal table in its last state.
func (m *monitor) finish() {
	if m.cfg.Terminal && m.last != nil {
		m.draw(time.Now())
	}
}

// summary computes the verdict from everything the destination recorded.
func (m *monitor) summary(ctx context.Context, tl timeline) *Summary {
	sum := &Summary{Workers: m.cfg.Workers, Duration: m.cfg.Duration}
	// Final counts (the workers have stopped).
	if rep, err := status.Read(context.WithoutCancel(ctx), m.pool); err == nil {
		row := make([]sample, len(specs))
		copy(row, m.last)
		for i, s := range specs {
			for _, p := range rep.Platforms {
				if p.Name == s.name {
					row[i].total = p.Counts.Sources
					row[i].checked = p.Counts.Sources - p.Counts.NeverChecked
				}
			}
		}
		m.last = row
	}
	span := time.Since(m.origin).Seconds()
	for i, s := range specs {
		arr := m.dest.Arrivals(s.prefix())
		n, at := windowMax(arr, time.Second)
		ps := PlatformSummary{
			Name: s.name, Ceiling: s.rate, Burst: s.burst, DestLimit: s.destRate,
			Requests:  len(arr),
			OK:        m.dest.CountStatus(s.prefix(), http.StatusOK) + m.dest.CountStatus(s.prefix(), http.StatusNotModified),
			Status429: m.dest.CountStatus(s.prefix(), http.StatusTooManyRequests),
			MaxIn1s:   n, Limit: s.limit(), Exceeded: n > s.limit(),
			CooledFor: m.cooled[i],
		}
		if s.cooldown {
			ps.StopAt, ps.RetryAfter = tl.blockAt.Seconds(), tl.retryAfter.Seconds()
		}
		if !at.IsZero() {
			ps.MaxWindow = at.Sub(m.origin).Seconds()
		}
		if ps.Exceeded {
			// For the diagnosis: when, in the window, each request arrived.
			for _, a := range arr {
				if d := a.Sub(at); d >= 0 && d < time.Second {
					ps.WindowArrivalsMS = append(ps.WindowArrivalsMS, float64(d.Microseconds())/1000)
				}
			}
			sort.Float64s(ps.WindowArrivalsMS)
		}
		if span > 0 {
			ps.MeanRate = float64(len(arr)) / span
		}
		for _, row := range m.samples {
			ps.MaxMult = max(ps.MaxMult, row[i].multiplier)
			ps.Cooldowns = max(ps.Cooldowns, row[i].coolCount)
		}
		if m.last != nil {
			ps.Checked, ps.SourcesTot = m.last[i].checked, m.last[i].total
		}
		sum.Platforms = append(sum.Platforms, ps)
	}
	return sum
}

// writeSummary prints the summary table, a line per platform saying what
// it shows and what happened, and the verdict.
func writeSummary(out io.Writer, s *Summary) {
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "platform\tceiling\tburst\tlimit in 1 s\tdest allows\trequests\tok\t429s\tmean/s\tmax in 1 s\tmax multiplier\tcooled down\tchecked\tceiling held\t\n")
	for _, p := range s.Platforms {
		dl := "unlimited"
		if p.DestLimit > 0 {
			dl = fmt.Sprintf("%g/s", p.DestLimit)
		}
		cd := "no"
		if p.Cooldowns > 0 {
			cd = fmt.Sprintf("~%.0fs", p.CooledFor)
		}
		held := "yes"
		if p.Exceeded {
			held = fmt.Sprintf("NO (+%.1fs)", p.MaxWindow)
		}
		fmt.Fprintf(tw, "%s\t%g/s\t%d\t%d\t%s\t%d\t%d\t%d\t%.1f\t%d\t×%.3g\t%s\t%d/%d\t%s\t\n",
			p.Name, p.Ceiling, p.Burst, p.Limit, dl, p.Requests, p.OK, p.Status429, p.MeanRate, p.MaxIn1s, p.MaxMult, cd, p.Checked, p.SourcesTot, held)
	}
	tw.Flush()
	fmt.Fprintln(out)
	for _, p := range s.Platforms {
		fmt.Fprintf(out, "%-10s %s\n", p.Name+":", p.explain())
	}
	fmt.Fprintln(out, "limit in 1 s = ceiling + burst: the most requests any 1-s window may see; max in 1 s is what the destination saw in its busiest one.")
	fmt.Fprintln(out, "checked = sources fetched at least once during the run, of the platform's sources (all are due every 2 s, more than a ceiling allows: the longest-waiting go first).")
	for _, p := range s.Platforms {
		if p.Exceeded {
			fmt.Fprintf(out, "%s: arrivals in the busiest window (ms from its start): %v\n", p.Name, p.WindowArrivalsMS)
		}
	}
	if s.ChartPath != "" {
		fmt.Fprintf(out, "chart: %s\n", s.ChartPath)
	}
	switch {
	case s.Interrupted:
		fmt.Fprintln(out, "demo: interrupted; stopping everything")
	case s.OK():
		fmt.Fprintf(out, "demo: OK — no platform exceeded its ceiling + burst in any 1-s window (%d workers, %s)\n", s.Workers, s.Duration)
	}
}

// explain says in one line what the platform is there to show and what
// happened to it.
func (p PlatformSummary) explain() string {
	held := fmt.Sprintf("at most %d requests in any 1 s (limit %d = %g + burst %d)", p.MaxIn1s, p.Limit, p.Ceiling, p.Burst)
	if p.Exceeded {
		held = fmt.Sprintf("%d requests in the 1 s from +%.1fs: ABOVE the limit %d = %g + burst %d", p.MaxIn1s, p.MaxWindow, p.Limit, p.Ceiling, p.Burst)
	}
	switch {
	case p.DestLimit > 0:
		return fmt.Sprintf("the destination allows only %g/s, below the %g/s ceiling. %s raised the shared multiplier to ×%.3g "+
			"(every worker then paces at ceiling ÷ multiplier), and the fleet fetched at %.1f/s on average; %s.",
			p.DestLimit, p.Ceiling, answers429(p.Status429), p.MaxMult, p.MeanRate, held)
	case p.RetryAfter > 0:
		what := fmt.Sprintf("the whole fleet cooled the platform down for ~%.0f s instead of retrying (%s in all)", p.CooledFor, answers429(p.Status429))
		if p.Cooldowns == 0 {
			what = fmt.Sprintf("the fleet was not seen cooling down (%s): the run may have been too short", answers429(p.Status429))
		}
		return fmt.Sprintf("at +%.0fs the destination answered 429 with Retry-After %.0fs for a moment: %s; %s.", p.StopAt, p.RetryAfter, what, held)
	default:
		return fmt.Sprintf("the destination accepts everything, so the fleet runs at its ceiling: %.1f/s on average, %s.", p.MeanRate, held)
	}
}

func answers429(n int) string {
	if n == 1 {
		return "1 answer 429"
	}
	return fmt.Sprintf("%d answers 429", n)
}
