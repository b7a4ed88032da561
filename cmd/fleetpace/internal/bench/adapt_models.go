package bench

import (
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// Model is a destination that allows less than the ceiling: a fake one
// (fakedest) or, with Nginx, a real nginx's limit_req.
type Model struct {
	Name string
	// Share is the part of the ceiling the destination allows (fake
	// destinations).
	Share float64
	// Burst is a token bucket's capacity (default 1), or with Strict the
	// excess nginx lets through with nodelay (default 0).
	Burst int
	// Window makes it a fixed window of this length instead (a sliding
	// log with Sliding), WindowLimit = Share × ceiling × Window.
	Window  time.Duration
	Sliding bool
	// Strict is nginx's limit_req (fakedest's Strict rule): a request
	// earlier than 1/rate after the last accepted one is refused, a refusal
	// changes nothing, and no Retry-After is sent.
	Strict bool
	// Headers is the rate-limit header family it announces.
	Headers fakedest.HeaderStyle
	// Steps move the allowance during a run: from At (a fraction of the
	// run) on, the destination allows Share of the ceiling instead.
	Steps []Step
	// Figure is the model's own figure: "rise" (seconds until goodput
	// holds ≥ 0.85 × the new limit after its first step) or "drop" (seconds
	// until the 429s stop after it). Default: none.
	Figure string
	// NginxRate, if set, makes the destination a real nginx with
	// limit_req rate=NginxRate r/s (burst NginxBurst, nodelay), serving
	// static files: `bench adapt --nginx`.
	NginxRate  int
	NginxBurst int
}

// Step is a change of a model's allowance during a run.
type Step struct {
	At    float64 // fraction of the run, in (0, 1)
	Share float64 // of the ceiling
}

// Figures of models with steps.
const (
	FigureRise = "rise"
	FigureDrop = "drop"
)

// nginx reports whether the model is a real nginx.
func (m Model) nginx() bool { return m.NginxRate > 0 }

// shareAt is the share of the ceiling allowed at t into a run of length d.
func (m Model) shareAt(t, d time.Duration) float64 {
	s := m.Share
	for _, st := range m.Steps {
		if t >= stepAt(st, d) {
			s = st.Share
		}
	}
	return s
}

// stepAt is when st happens in a run of length d, to the millisecond.
func stepAt(st Step, d time.Duration) time.Duration {
	return time.Duration(st.At * float64(d)).Round(time.Millisecond)
}

// rule is the model's fake-destination rule at share s of ceiling c.
func (m Model) rule(c, s float64) fakedest.Rule {
	switch {
	case m.Window > 0:
		return fakedest.Rule{Window: m.Window, WindowLimit: windowLimit(c, s, m.Window), Sliding: m.Sliding, Headers: m.Headers}
	case m.Strict:
		return fakedest.Rule{Rate: c * s, Burst: m.Burst, Strict: true, RetryAfter: fakedest.NoRetryAfter, Headers: m.Headers}
	}
	return fakedest.Rule{Rate: c * s, Burst: max(m.Burst, 1), Headers: m.Headers}
}

func windowLimit(c, s float64, w time.Duration) int {
	return max(1, int(math.Round(c*s*w.Seconds())))
}

// allowance is what the model allows at t into a run of length d, in
// requests/s: the rule's rate, or its window's limit over its length.
func (m Model) allowance(c float64, t, d time.Duration) float64 {
	if m.nginx() {
		return float64(m.NginxRate)
	}
	s := m.shareAt(t, d)
	if m.Window > 0 {
		return float64(windowLimit(c, s, m.Window)) / m.Window.Seconds()
	}
	return c * s
}

// announces reports whether the model announces its limit in headers.
func (m Model) announces() bool { return m.Headers != fakedest.None }

// Models are the fake destination models of the benchmark, by concern:
//   - token buckets: strict spacing (capacity 1) at 40 % and 70 % of the
//     ceiling, capacity 10 at 50 %; each again with X-RateLimit-* headers,
//     the burst-10 one and the one at 40 % with the IETF RateLimit fields
//     (whose policy states a bucket of 8/s and capacity 1 as q=8;w=1: a
//     quota of 8 per second that a strict limiter enforces by spacing);
//   - fixed windows of 1 s, 10 s and 60 s at 1/3 and 1/10 of the ceiling
//     (and the earlier 1-s and 60-s ones at 50 %, and one of 5 s at 1/3: a
//     length the others do not hold), each with no headers,
//     X-RateLimit-* (-xrl) and the IETF fields (-ietf);
//   - strict-nginx-40: nginx's limit_req at 40 % (no burst, no
//     Retry-After), again announcing q=8;w=1 in the IETF fields
//     (strict-nginx-40-ietf); sliding10s-33: a sliding log of 10 s at 1/3;
//   - limits that move: 80 % down to 30 % and back (drop-80-30, also with
//     headers), up ×2 from 40 % to 80 % (rise-40-80), down ×2 from 80 % to
//     40 % (drop-80-40), a third into the run.
func Models() []Model {
	var out []Model
	tokens := []Model{
		{Name: "strict-40", Share: 0.4, Burst: 1},
		{Name: "strict-70", Share: 0.7, Burst: 1},
		{Name: "bucket10-50", Share: 0.5, Burst: 10},
	}
	for _, m := range tokens {
		out = append(out, m, withHeaders(m, fakedest.XRateLimit))
	}
	out = append(out, withHeaders(tokens[2], fakedest.IETF), withHeaders(tokens[0], fakedest.IETF))
	for _, w := range []struct {
		size  time.Duration
		share float64
		pct   int
	}{
		{time.Second, 1.0 / 3, 33}, {time.Second, 0.1, 10}, {time.Second, 0.5, 50},
		{5 * time.Second, 1.0 / 3, 33},
		{10 * time.Second, 1.0 / 3, 33}, {10 * time.Second, 0.1, 10},
		{time.Minute, 1.0 / 3, 33}, {time.Minute, 0.1, 10}, {time.Minute, 0.5, 50},
	} {
		m := Model{Name: fmt.Sprintf("window%s-%d", shortDuration(w.size), w.pct), Share: w.share, Window: w.size}
		out = append(out, m, withHeaders(m, fakedest.XRateLimit), withHeaders(m, fakedest.IETF))
	}
	return append(out,
		Model{Name: "strict-nginx-40", Share: 0.4, Strict: true},
		Model{Name: "strict-nginx-40-ietf", Share: 0.4, Strict: true, Headers: fakedest.IETF},
		Model{Name: "sliding10s-33", Share: 1.0 / 3, Window: 10 * time.Second, Sliding: true},
		Model{Name: "drop-80-30", Share: 0.8, Burst: 1, Steps: []Step{{1.0 / 3, 0.3}, {2.0 / 3, 0.8}}, Figure: FigureDrop},
		Model{Name: "drop-80-30-xrl", Share: 0.8, Burst: 1, Steps: []Step{{1.0 / 3, 0.3}, {2.0 / 3, 0.8}}, Figure: FigureDrop, Headers: fakedest.XRateLimit},
		Model{Name: "rise-40-80", Share: 0.4, Burst: 1, Steps: []Step{{1.0 / 3, 0.8}}, Figure: FigureRise},
		Model{Name: "drop-80-40", Share: 0.8, Burst: 1, Steps: []Step{{1.0 / 3, 0.4}}, Figure: FigureDrop},
	)
}

// NginxModels are the models of `bench adapt --nginx`: a real nginx with
// limit_req rate=rate r/s, without burst and with burst=5 nodelay.
func NginxModels(rate int) []Model {
	return []Model{
		{Name: fmt.Sprintf("nginx-%d", rate), NginxRate: rate},
		{Name: fmt.Sprintf("nginx-%d-burst5", rate), NginxRate: rate, NginxBurst: 5},
	}
}

func withHeaders(m Model, h fakedest.HeaderStyle) Model {
	m.Headers = h
	m.Name += map[fakedest.HeaderStyle]string{fakedest.XRateLimit: "-xrl", fakedest.IETF: "-ietf"}[h]
	return m
}

// shortDuration is 1s, 10s, 60s.
func shortDuration(d time.Duration) string { return fmt.Sprintf("%gs", d.Seconds()) }

// selectModels resolves names (exact, or path.Match patterns such as
// "window*") against known, in known's order; a name that matches nothing
// is an error listing the known ones.
func selectModels(names []string, known []Model) ([]Model, error) {
	var out []Model
	for _, name := range names {
		matched := false
		for _, m := range known {
			if ok, _ := path.Match(name, m.Name); ok || name == m.Name {
				matched = true
				if !slices.ContainsFunc(out, func(o Model) bool { return o.Name == m.Name }) {
					out = append(out, m)
				}
			}
		}
		if !matched {
			var all []string
			for _, m := range known {
				all = append(all, m.Name)
			}
			return nil, fmt.Errorf("%w: bench.AdaptConfig.Models (--models): unknown model %q (known: %s)", ErrInvalidConfig, name, strings.Join(all, ", "))
		}
	}
	return out, nil
}
