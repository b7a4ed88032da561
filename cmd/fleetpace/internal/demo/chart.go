package demo

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/atomicfile"
)

// platformColors, one per spec.
var platformColors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
}

var (
	ceilingColor = color.RGBA{R: 0x22, G: 0x22, B: 0x22, A: 0xff}
	destColor    = color.RGBA{R: 0xe8, G: 0x59, B: 0x0c, A: 0xff}
	coolColor    = color.NRGBA{R: 0x88, G: 0x88, B: 0x88, A: 0x40}
)

// legendRoom is how much of a panel's height, from the top, is kept free
// of data for its legend: the y axis reaches 1/(1 − legendRoom) times the
// largest value drawn.
const legendRoom = 0.42

// Verdict is the chart's title: whether every ceiling held.
func (s *Summary) Verdict() string {
	switch {
	case s.Interrupted:
		return fmt.Sprintf("fleetpace demo, %d workers: interrupted before the end", s.Workers)
	case s.OK():
		return fmt.Sprintf("fleetpace demo, %d workers, %s: OK, no platform above its ceiling + burst in any 1-s window", s.Workers, s.Duration)
	}
	var bad []string
	for _, p := range s.Platforms {
		if p.Exceeded {
			bad = append(bad, fmt.Sprintf("%s %d in 1 s > %d", p.Name, p.MaxIn1s, p.Limit))
		}
	}
	return fmt.Sprintf("fleetpace demo, %d workers, %s: CEILING EXCEEDED (%s)", s.Workers, s.Duration, strings.Join(bad, "; "))
}

// writeChart writes one panel per platform — requests per second at the
// destination (1-s buckets) with its ceiling and the destination's own
// limit drawn and labelled, the time it cooled down shaded — and a panel of
// the shared backoff multiplier, under the verdict as the title. Legends
// sit in a band above the data; y ticks are whole numbers. ".png" writes a
// PNG, else an SVG.
func writeChart(path string, m *monitor, sum *Summary) error {
	end := m.cfg.Duration.Seconds()
	if n := len(m.times); n > 0 {
		end = max(end, m.times[n-1])
	}
	var grid [][]*plot.Plot
	for i, s := range specs {
		p, err := ratePanel(m, i, s, end)
		if err != nil {
			return err
		}
		grid = append(grid, []*plot.Plot{p})
	}
	mp, err := multiplierPanel(m, end)
	if err != nil {
		return err
	}
	grid = append(grid, []*plot.Plot{mp})

	const w, h = 24 * vg.Centimeter, 30 * vg.Centimeter
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if strings.EqualFold(filepath.Ext(path), ".png") {
		c := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))
		canvas = vgimg.PngCanvas{Canvas: c}
	} else {
		canvas = vgsvg.New(w, h)
	}
	dc := draw.New(canvas)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	title := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 13), XAlign: draw.XCenter, YAlign: draw.YTop,
		Handler: plot.DefaultTextHandler}
	dc.FillText(title, vg.Point{X: w / 2, Y: h - 4*vg.Millimeter}, sum.Verdict())
	tiles := draw.Tiles{Rows: len(grid), Cols: 1, PadX: vg.Millimeter, PadY: 5 * vg.Millimeter,
		PadTop: 12 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 5 * vg.Millimeter}
	cs := plot.Align(grid, tiles, dc)
	for i := range grid {
		grid[i][0].Draw(cs[i][0])
	}

	return atomicfile.Write(path, canvas)
}

// role is what a platform of the demo shows, for its panel's title.
func (p platformSpec) role() string {
	switch {
	case p.destRate > 0:
		return fmt.Sprintf("the destination allows %g/s, below the ceiling: 429s raise the shared multiplier until the fleet fits", p.destRate)
	case p.cooldown:
		return "the destination says stop (429, long Retry-After): the whole fleet cools the platform down"
	default:
		return "the destination accepts everything: the fleet holds the ceiling"
	}
}

func newPanel(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = 10
	p.Title.Padding = vg.Points(4)
	p.Y.Label.Text = ylabel
	p.X.Tick.Marker = intTicks{}
	p.Y.Tick.Marker = intTicks{}
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.Padding = vg.Points(3)
	p.Legend.TextStyle.Font.Size = 10
	p.Legend.YOffs = -vg.Points(2)
	return p
}

func ratePanel(m *monitor, i int, s platformSpec, end float64) (*plot.Plot, error) {
	col := platformColors[i%len(platformColors)]
	p := newPanel(fmt.Sprintf("%s — %s", s.name, s.role()), "requests/s")
	series := fakedestRates(m, s)
	top := max(float64(s.limit()), s.destRate)
	pts := make(plotter.XYs, len(series))
	for j, r := range series {
		pts[j] = plotter.XY{X: float64(j) + 0.5, Y: r}
		top = max(top, r)
	}
	ymax := top / (1 - legendRoom)
	// Cooling down: a band across the data wherever a sample saw it, under
	// the lines.
	cooled := false
	for j, t := range m.times {
		if m.samples[j][i].cooldown <= 0 {
			continue
		}
		from := max(0, t-m.cfg.Refresh.Seconds())
		band, err := plotter.NewPolygon(plotter.XYs{{X: from, Y: 0}, {X: t, Y: 0}, {X: t, Y: top}, {X: from, Y: top}})
		if err != nil {
			return nil, err
		}
		band.Color = coolColor
		band.LineStyle.Width = 0
		p.Add(band)
		if !cooled {
			cooled = true
			p.Legend.Add("the fleet cooling the platform down", band)
		}
	}
	if len(pts) > 0 {
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = col, vg.Points(1.5)
		p.Add(l)
		p.Legend.Add("requests/s at the destination (1-s buckets)", l)
	}
	ceil, err := hline(s.rate, end, ceilingColor, []vg.Length{vg.Points(6), vg.Points(3)})
	if err != nil {
		return nil, err
	}
	p.Add(ceil)
	p.Legend.Add(fmt.Sprintf("ceiling %g/s (+ burst %d: at most %d in any 1 s)", s.rate, s.burst, s.limit()), ceil)
	if s.destRate > 0 {
		dl, err := hline(s.destRate, end, destColor, []vg.Length{vg.Points(2), vg.Points(2)})
		if err != nil {
			return nil, err
		}
		p.Add(dl)
		p.Legend.Add(fmt.Sprintf("the destination's own limit, %g/s", s.destRate), dl)
	}
	p.X.Min, p.X.Max = 0, end
	p.Y.Min, p.Y.Max = 0, ymax
	return p, nil
}

func multiplierPanel(m *monitor, end float64) (*plot.Plot, error) {
	p := newPanel("shared backoff multiplier: every worker paces a platform at ceiling ÷ multiplier", "multiplier")
	p.X.Label.Text = "seconds since the workers started"
	top := 1.0
	for i, s := range specs {
		pts := make(plotter.XYs, 0, len(m.times))
		for j, t := range m.times {
			pts = append(pts, plotter.XY{X: t, Y: m.samples[j][i].multiplier})
			top = max(top, m.samples[j][i].multiplier)
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.StepStyle = plotter.PostStep
		l.Color, l.Width = platformColors[i%len(platformColors)], vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	p.X.Min, p.X.Max = 0, end
	p.Y.Min, p.Y.Max = 0, top/(1-legendRoom)
	return p, nil
}

// hline is a horizontal line at y across the run.
func hline(y, end float64, c color.Color, dashes []vg.Length) (*plotter.Line, error) {
	l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: y}, {X: end, Y: y}})
	if err != nil {
		return nil, err
	}
	l.Color, l.Width, l.Dashes = c, vg.Points(1.2), dashes
	return l, nil
}

// intTicks marks whole numbers only, 1, 2 or 5 × 10^k apart, about five
// of them.
type intTicks struct{}

// Ticks returns the ticks between lo and hi.
func (intTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 1.0
search:
	for mag := 1.0; mag < 1e12; mag *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if step = m * mag; (hi-lo)/step <= 6 {
				break search
			}
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+1e-9; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', 0, 64)})
	}
	return ticks
}

// fakedestRates is the platform's request rate per 1-s bucket since the
// origin, padded with zeros to the end of the run.
func fakedestRates(m *monitor, s platformSpec) []float64 {
	rs := m.dest.RateSeries(s.prefix(), time.Second)
	n := int(m.cfg.Duration / time.Second)
	for len(rs) < n {
		rs = append(rs, 0)
	}
	return rs
}
