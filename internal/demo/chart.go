package demo

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// platformColors, one per spec.
var platformColors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
}

// writeChart writes two aligned panels to path: requests per second per
// platform at the destination (1-s buckets) against each ceiling, and the
// shared backoff multiplier over time. ".png" writes a PNG, else an SVG.
func writeChart(path string, m *monitor, sum *Summary) error {
	rates := plot.New()
	rates.Title.Text = fmt.Sprintf("fleetpace demo: %d workers — requests/s at the destination (1-s buckets) vs ceiling", sum.Workers)
	rates.Y.Label.Text = "requests/s"
	rates.Legend.Top = true
	rates.Legend.Left = true
	mult := plot.New()
	mult.Title.Text = "shared backoff multiplier (shaded: platform cooling down)"
	mult.X.Label.Text = "seconds since the workers started"
	mult.Y.Label.Text = "multiplier"
	mult.Legend.Top = true
	mult.Legend.Left = true

	end := m.cfg.Duration.Seconds()
	if n := len(m.times); n > 0 {
		end = max(end, m.times[n-1])
	}
	ymax := 0.0
	for i, s := range specs {
		col := platformColors[i%len(platformColors)]
		series := fakedestRates(m, s)
		pts := make(plotter.XYs, len(series))
		for j, r := range series {
			pts[j] = plotter.XY{X: float64(j) + 0.5, Y: r}
			ymax = max(ymax, r)
		}
		if len(pts) > 0 {
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.Color, l.Width = col, vg.Points(1.5)
			rates.Add(l)
			rates.Legend.Add(fmt.Sprintf("%s (ceiling %g/s)", s.name, s.rate), l)
		}
		ceil, err := plotter.NewLine(plotter.XYs{{X: 0, Y: s.rate}, {X: end, Y: s.rate}})
		if err != nil {
			return err
		}
		ceil.Color, ceil.Width, ceil.Dashes = col, vg.Points(1), []vg.Length{vg.Points(5), vg.Points(3)}
		rates.Add(ceil)
		ymax = max(ymax, s.rate)

		mpts := make(plotter.XYs, 0, len(m.times))
		for j, t := range m.times {
			mpts = append(mpts, plotter.XY{X: t, Y: m.samples[j][i].multiplier})
		}
		if len(mpts) > 0 {
			ml, err := plotter.NewLine(mpts)
			if err != nil {
				return err
			}
			ml.StepStyle = plotter.PostStep
			ml.Color, ml.Width = col, vg.Points(1.5)
			mult.Add(ml)
			mult.Legend.Add(s.name, ml)
		}
		// Cooldown: a translucent band under the multiplier panel.
		for j, t := range m.times {
			if m.samples[j][i].cooldown <= 0 {
				continue
			}
			r, g, b, _ := col.RGBA()
			band, err := plotter.NewPolygon(plotter.XYs{{X: t - m.cfg.Refresh.Seconds(), Y: 0}, {X: t, Y: 0}, {X: t, Y: 0.5}, {X: t - m.cfg.Refresh.Seconds(), Y: 0.5}})
			if err != nil {
				return err
			}
			band.Color = color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 0x50}
			band.LineStyle.Width = 0
			mult.Add(band)
		}
	}
	rates.X.Min, rates.X.Max = 0, end
	// Headroom above the lines for the legend.
	rates.Y.Min, rates.Y.Max = 0, ymax*1.45
	mult.X.Min, mult.X.Max = 0, end
	mmax := 1.0
	for _, row := range m.samples {
		for _, smp := range row {
			mmax = max(mmax, smp.multiplier)
		}
	}
	mult.Y.Min, mult.Y.Max = 0, mmax*1.5
	rates.Add(plotter.NewGrid())
	mult.Add(plotter.NewGrid())

	const w, h = 26 * vg.Centimeter, 18 * vg.Centimeter
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
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	grid := [][]*plot.Plot{{rates}, {mult}}
	cs := plot.Align(grid, tiles, dc)
	rates.Draw(cs[0][0])
	mult.Draw(cs[1][0])

	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
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
