package herd

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Describe is the scenario in one line.
func (c SimConfig) Describe() string {
	c = c.withDefaults()
	s := c.Scenario
	switch s.Kind {
	case DBRestart:
		return fmt.Sprintf("database restart at %s: every connection dropped, every attempt refused for %s", s.At, s.For)
	case Saturation:
		d := fmt.Sprintf("saturation window from %s for %s: claims take %g× as long", s.At, s.For, s.Slowdown)
		if s.Hold > 0 {
			d += fmt.Sprintf(", %d backends held", s.Hold)
		}
		return d
	}
	return "mass restart: every poller starts at t=0"
}

// WriteText prints the figures as a table, then each mode's polls per
// second as a sparkline on one shared scale.
func (r *SimResult) WriteText(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "simulate herd: %s\n", c.Describe())
	fmt.Fprintf(w, "%d pollers (poll %s→%s, jitter %g), pool of %d backends, claim %s (capacity %.0f claims/s), "+
		"retry every %s for %s, attempts cost %s of %d cores; %s of virtual time, seed %d, %s wall\n",
		c.Pollers, c.Base, c.Max, c.JitterRatio, c.Backends, c.ClaimTime, float64(c.Backends)/c.ClaimTime.Seconds(),
		c.RetryDelay, c.RetryFor, c.AttemptCost, c.Cores, c.Duration, c.Seed, r.Wall.Round(time.Millisecond))
	fmt.Fprintf(w, "steady state, polls spread evenly: %.0f polls/s, %.0f backends busy\n\n",
		float64(c.Pollers)/c.Max.Seconds(), float64(c.Pollers)/c.Max.Seconds()*c.ClaimTime.Seconds())

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODE\tPOLLS/S PEAK\tMEAN\tPEAK/MEAN\tSERVED/S PEAK\tBUSY PEAK/K\tREFUSED\tPENDING PEAK\tLONGEST CLAIM\tDRAIN\t")
	for _, m := range r.Modes {
		drain := fmt.Sprintf("%.0f s", m.DrainSeconds)
		if !m.Drained {
			drain = fmt.Sprintf("> %.0f s", m.DrainSeconds)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%d\t%d/%d\t%d\t%d\t%.1f s\t%s\t\n", m.Name, m.PeakPolls, m.MeanPolls, m.PeakToMean,
			m.PeakServed, m.PeakBusy, c.Backends, m.RefusedTotal, m.PeakPending, m.MaxClaimTime, drain)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	from := "t=0"
	if c.Scenario.Kind != Restart {
		from = "the end of the " + map[ScenarioKind]string{DBRestart: "outage", Saturation: "window"}[c.Scenario.Kind] +
			fmt.Sprintf(" (%s)", c.EventEnd())
	}
	fmt.Fprintf(w, "\npolls/s: claims attempted per second (served or refused); REFUSED counts every refused attempt, "+
		"each knock of a retrier included;\nPENDING: retriers holding a connection open while they knock; "+
		"DRAIN: from %s until no attempt is refused and none is pending, to the end of the run.\n\n", from)

	scale := 1
	for _, m := range r.Modes {
		scale = max(scale, m.PeakPolls)
	}
	width := 72
	per := max(1, (len(r.Modes[0].Polls)+width-1)/width)
	fmt.Fprintf(w, "polls/s, one column per %d s (the busiest second of each), ▁ to █ = 1 to %d, blank = none:\n", per, scale)
	nameW := 0
	for _, m := range r.Modes {
		nameW = max(nameW, len(m.Name))
	}
	for _, m := range r.Modes {
		fmt.Fprintf(w, "%-*s %s\n", nameW, m.Name, Sparkline(m.Polls, per, scale))
	}
	return nil
}

var bars = []rune("▁▂▃▄▅▆▇█")

// Sparkline draws series, per values a column (the largest of them), on a
// scale where scale is a full bar.
func Sparkline(series []int, per, scale int) string {
	var b strings.Builder
	for i := 0; i < len(series); i += per {
		v := 0
		for _, x := range series[i:min(i+per, len(series))] {
			v = max(v, x)
		}
		if v <= 0 {
			b.WriteByte(' ')
			continue
		}
		b.WriteRune(bars[min(len(bars)-1, (v*len(bars)-1)/max(scale, 1))])
	}
	return b.String()
}

// WriteJSON prints the result as one JSON object: the configuration and,
// per mode, the figures and the per-second series.
func (r *SimResult) WriteJSON(w io.Writer) error {
	c := r.Config
	out := struct {
		Scenario    ScenarioKind `json:"scenario"`
		Description string       `json:"description"`
		Pollers     int          `json:"pollers"`
		Backends    int          `json:"backends"`
		ClaimTime   float64      `json:"claim_time_seconds"`
		Base        float64      `json:"poll_base_seconds"`
		Max         float64      `json:"poll_max_seconds"`
		JitterRatio float64      `json:"jitter_ratio"`
		RetryDelay  float64      `json:"retry_delay_seconds"`
		RetryFor    float64      `json:"retry_for_seconds"`
		AttemptCost float64      `json:"attempt_cost_seconds"`
		Cores       int          `json:"cores"`
		Duration    float64      `json:"duration_seconds"`
		EventEnd    float64      `json:"event_end_seconds"`
		Seed        uint64       `json:"seed"`
		WallSeconds float64      `json:"wall_seconds"`
		Modes       []ModeResult `json:"modes"`
	}{
		Scenario: c.Scenario.Kind, Description: c.Describe(), Pollers: c.Pollers, Backends: c.Backends,
		ClaimTime: c.ClaimTime.Seconds(), Base: c.Base.Seconds(), Max: c.Max.Seconds(), JitterRatio: c.JitterRatio,
		RetryDelay: c.RetryDelay.Seconds(), RetryFor: c.RetryFor.Seconds(), AttemptCost: c.AttemptCost.Seconds(),
		Cores: c.Cores, Duration: c.Duration.Seconds(), EventEnd: c.EventEnd().Seconds(), Seed: c.Seed,
		WallSeconds: r.Wall.Seconds(), Modes: r.Modes,
	}
	return writeJSON(w, out)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
