package dashboard

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Chart is an inline SVG chart drawn on the server: stacked series of
// requests/s per time bucket, with the ceiling as a line. The template
// draws it from these numbers (no script, no external file); labels are
// escaped by the template like any other text.
type Chart struct {
	W, H    float64 // the viewBox
	Plot    rect    // the plotting area within it
	Areas   []shape // stacked series, bottom first
	Ceiling *line   // the configured ceiling (nil: not drawn)
	YTicks  []tick
	XTicks  []tick
	Legend  []legendItem
	Summary string // what the chart says, for screen readers and tooltips
	Small   bool   // a sparkline: no axes, no legend
}

type rect struct{ X, Y, W, H float64 }

type shape struct {
	D     string // SVG path data
	Class string // the series' CSS class (its colour)
	Label string
}

type line struct {
	X1, X2, Y float64
	Label     string
}

type tick struct {
	Pos   float64
	Label string
}

type legendItem struct {
	X     float64
	Class string
	Label string
}

// series is one stacked series: a value per bucket.
type series struct {
	Label  string
	Class  string
	Values []float64
}

// chartSpec is what a chart shows.
type chartSpec struct {
	Series  []series
	Bucket  time.Duration // each value's span
	Window  time.Duration // the whole x axis, ending now
	Ceiling float64       // the limit drawn as a line; 0: none drawn
	Small   bool
	// Quantity names the values in the summary. Default "requests/s".
	Quantity string
	// Format writes a value in the summary and the limit's label. Default
	// rateText.
	Format func(float64) string
	// CeilingLabel labels the line. Default "ceiling " + Format(Ceiling).
	CeilingLabel string
}

// newChart lays out a chart: the y axis from 0 to above the largest stacked
// total or the ceiling, whichever is larger, with round ticks.
func newChart(s chartSpec) *Chart {
	c := &Chart{Small: s.Small}
	if s.Quantity == "" {
		s.Quantity = "requests/s"
	}
	if s.Format == nil {
		s.Format = rateText
	}
	if s.CeilingLabel == "" {
		s.CeilingLabel = "ceiling " + s.Format(s.Ceiling)
	}
	if s.Small {
		c.W, c.H = 120, 28
		c.Plot = rect{X: 1, Y: 2, W: 118, H: 24}
	} else {
		c.W, c.H = 720, 240
		c.Plot = rect{X: 48, Y: 30, W: 656, H: 180}
	}
	n := 0
	for _, se := range s.Series {
		n = max(n, len(se.Values))
	}
	totals := make([]float64, n)
	for _, se := range s.Series {
		for i, v := range se.Values {
			totals[i] += v
		}
	}
	top := s.Ceiling
	peak := 0.0
	for _, t := range totals {
		top, peak = math.Max(top, t), math.Max(peak, t)
	}
	step, ymax := niceScale(top * 1.1)
	y := func(v float64) float64 { return c.Plot.Y + c.Plot.H - v/ymax*c.Plot.H }
	x := func(i int) float64 {
		if n <= 1 {
			return c.Plot.X
		}
		return c.Plot.X + float64(i)/float64(n-1)*c.Plot.W
	}
	base := make([]float64, n)
	for _, se := range s.Series {
		if len(se.Values) == 0 {
			continue
		}
		var b strings.Builder
		for i := range n {
			v := 0.0
			if i < len(se.Values) {
				v = se.Values[i]
			}
			cmd := "L"
			if i == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&b, "%s%s %s ", cmd, num(x(i)), num(y(base[i]+v)))
			base[i] += v
		}
		for i := n - 1; i >= 0; i-- {
			v := 0.0
			if i < len(se.Values) {
				v = se.Values[i]
			}
			fmt.Fprintf(&b, "L%s %s ", num(x(i)), num(y(base[i]-v)))
		}
		b.WriteString("Z")
		c.Areas = append(c.Areas, shape{D: b.String(), Class: se.Class, Label: se.Label})
	}
	if s.Ceiling > 0 {
		c.Ceiling = &line{X1: c.Plot.X, X2: c.Plot.X + c.Plot.W, Y: y(s.Ceiling), Label: s.CeilingLabel}
	}
	c.Summary = fmt.Sprintf("%s over the last %s in %s buckets: peak %s, now %s", s.Quantity, durText(s.Window), durText(s.Bucket),
		s.Format(peak), s.Format(last(totals)))
	if s.Ceiling > 0 {
		c.Summary += ", " + s.CeilingLabel
	}
	if s.Small {
		return c
	}
	for v := 0.0; v <= ymax+step/1e6; v += step {
		c.YTicks = append(c.YTicks, tick{Pos: y(v), Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	const xticks = 4
	for i := 0; i <= xticks; i++ {
		ago := s.Window - time.Duration(i)*s.Window/xticks
		label := "now"
		if ago > 0 {
			label = "−" + durText(ago)
		}
		c.XTicks = append(c.XTicks, tick{Pos: c.Plot.X + float64(i)/xticks*c.Plot.W, Label: label})
	}
	// The legend sits above the plotting area, clear of the data.
	lx := c.Plot.X
	for _, se := range s.Series {
		c.Legend = append(c.Legend, legendItem{X: lx, Class: se.Class, Label: se.Label})
		lx += 24 + 7*float64(len(se.Label))
	}
	return c
}

// niceScale returns a round tick step and the axis maximum (a multiple of
// it) for values up to top: 1, 2 or 5 × 10^k, about 4 steps.
func niceScale(top float64) (step, ymax float64) {
	if top <= 0 || math.IsNaN(top) || math.IsInf(top, 0) {
		return 1, 1
	}
	raw := top / 4
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if step = m * mag; step >= raw {
			break
		}
	}
	return step, math.Ceil(top/step) * step
}

func last(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[len(xs)-1]
}

// num formats a coordinate compactly.
func num(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }
