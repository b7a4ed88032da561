package herd

import (
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/atomicfile"
)

var (
	pollsColor  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // blue
	servedColor = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff} // green
	capColor    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff} // red
)

// WriteChart draws one panel per mode — polls per second and claims served
// per second against the pool's capacity (Backends / ClaimTime), on one
// shared scale — to path: a PNG if it ends in ".png", else an SVG. The file
// is written whole or not at all.
func (r *SimResult) WriteChart(path string) error {
	c := r.Config
	capacity := float64(c.Backends) / c.ClaimTime.Seconds()
	ymax := capacity
	for _, m := range r.Modes {
		ymax = max(ymax, float64(m.PeakPolls))
	}
	cols := 1
	if len(r.Modes) > 1 && len(r.Modes)%2 == 0 {
		cols = 2
	}
	rows := (len(r.Modes) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, m := range r.Modes {
		p := plot.New()
		p.Title.Text = m.Name
		p.X.Label.Text = "seconds"
		p.Y.Label.Text = "per second"
		p.X.Min, p.X.Max = 0, c.Duration.Seconds()
		p.Y.Min, p.Y.Max = 0, ymax*1.05
		p.Add(plotter.NewGrid())
		for _, s := range []struct {
			name   string
			series []int
			col    color.Color
		}{{"polls", m.Polls, pollsColor}, {"served", m.Served, servedColor}} {
			pts := make(plotter.XYs, len(s.series))
			for j, v := range s.series {
				pts[j] = plotter.XY{X: float64(j) + 0.5, Y: float64(v)}
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.Color, l.Width = s.col, vg.Points(1)
			p.Add(l)
			if i == 0 {
				p.Legend.Add(s.name+"/s", l)
			}
		}
		cl, err := plotter.NewLine(plotter.XYs{{X: 0, Y: capacity}, {X: c.Duration.Seconds(), Y: capacity}})
		if err != nil {
			return err
		}
		cl.Color, cl.Width, cl.Dashes = capColor, vg.Points(1), []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(cl)
		if i == 0 {
			p.Legend.Add(fmt.Sprintf("capacity %.0f/s", capacity), cl)
			p.Legend.Top = true
		}
		grid[i/cols][i%cols] = p
	}

	w, h := 16*vg.Centimeter*vg.Length(cols), 6*vg.Centimeter*vg.Length(rows)+vg.Centimeter
	var canvas interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if strings.EqualFold(filepath.Ext(path), ".png") {
		canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100))}
	} else {
		canvas = vgsvg.New(w, h)
	}
	dc := draw.New(canvas)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: 4 * vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	cs := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j, p := range grid[i] {
			if p != nil {
				p.Draw(cs[i][j])
			}
		}
	}
	return atomicfile.Write(path, canvas)
}
