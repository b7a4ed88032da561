package bench

import (
	"errors"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/cmd/fleetpace/internal/bench/localpace"
	"github.com/fleetpace/fleetpace/internal/fakedest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// at adds n requests evenly spread over [from, to), with status.
func spread(reqs []arrival, from, to time.Duration, n, status int) []arrival {
	for k := range n {
		at := from + time.Duration(k)*(to-from)/time.Duration(n)
		reqs = append(reqs, arrival{At: t0.Add(at), Status: status, Limited: status == http.StatusTooManyRequests})
	}
	return reqs
}

// The figures of one cell, from a destination record built by hand.
func TestAdaptAnalyze(t *testing.T) {
	t.Parallel()
	const d = 80 * time.Second
	m, _ := modelByName("strict-40") // 8/s at a ceiling of 20
	var reqs []arrival
	// 0–20 s: 4 ok/s (half the allowance); a 429 at 5 s with Retry-After
	// 1 s, ignored by the 4 requests of the next second. 20–80 s: 7 ok/s
	// and one 429 per second.
	reqs = spread(reqs, 0, 20*time.Second, 80, http.StatusOK)
	reqs = append(reqs, arrival{At: t0.Add(5*time.Second + time.Millisecond), Status: 429, Limited: true, RetryAfter: time.Second})
	reqs = spread(reqs, 20*time.Second, 80*time.Second, 420, http.StatusOK)
	reqs = spread(reqs, 20*time.Second+500*time.Millisecond, 80*time.Second+500*time.Millisecond, 60, http.StatusTooManyRequests)
	f := analyze(m, reqs, t0, d, 20)
	// 10–70 s: 10 s at 4/s + 50 s at 7/s over 60 s at 8/s.
	if want := (40.0 + 350) / 480; math.Abs(f.Goodput1070-want) > 0.005 {
		t.Errorf("goodput 10–70 %.3f, want %.3f", f.Goodput1070, want)
	}
	// 10–80 s: 10 s at 4/s + 60 s at 7/s over 70 s at 8/s.
	if want := (40.0 + 420) / 560; math.Abs(f.Goodput10End-want) > 0.005 {
		t.Errorf("goodput 10–end %.3f, want %.3f", f.Goodput10End, want)
	}
	if want := 7.0 / 8; math.Abs(f.GoodputHalf-want) > 0.005 {
		t.Errorf("goodput of the last half %.3f, want %.3f", f.GoodputHalf, want)
	}
	if want := 1.0 / 8; math.Abs(f.LimitedHalf-want) > 0.002 {
		t.Errorf("429 share of the last half %.3f, want %.3f", f.LimitedHalf, want)
	}
	if want := 60.0 / (40 + 60*8); math.Abs(f.Limited10End-want) > 0.002 {
		t.Errorf("429 share 10–end %.4f, want %.4f", f.Limited10End, want)
	}
	if f.Reach != 20 {
		t.Errorf("reach %v, want 20 (the first 5-s span at ≥ 0.85 × 8/s starts at 20 s)", f.Reach)
	}
	if f.OldSpacing != 4 {
		t.Errorf("requests within the first 429's Retry-After: %v, want 4", f.OldSpacing)
	}
	if f.MaxWindow != 8 {
		t.Errorf("largest 1-s window %d, want 8", f.MaxWindow)
	}
}

// Rise and drop models: their own figures.
func TestAdaptAnalyzeSteps(t *testing.T) {
	t.Parallel()
	const d = 90 * time.Second // the step comes at 30 s
	rise, _ := modelByName("rise-40-80")
	var reqs []arrival
	reqs = spread(reqs, 0, 30*time.Second, 240, http.StatusOK)              // 8/s, all of it
	reqs = spread(reqs, 30*time.Second, 42*time.Second, 120, http.StatusOK) // 10/s of 16
	reqs = spread(reqs, 42*time.Second, 90*time.Second, 720, http.StatusOK) // 15/s
	f := analyze(rise, reqs, t0, d, 20)
	if f.Rise != 11 {
		t.Errorf("rise: %v s, want 11 (41–46 s: 10 + 4 × 15 = 70 ≥ 0.85 × 5 × 16 = 68)", f.Rise)
	}
	if f.Reach != 0 {
		t.Errorf("reach %v, want 0", f.Reach)
	}
	drop, _ := modelByName("drop-80-40")
	reqs = spread(nil, 0, 90*time.Second, 900, http.StatusOK)
	reqs = spread(reqs, 30*time.Second, 33500*time.Millisecond, 8, http.StatusTooManyRequests) // the last at 33.0625 s
	f = analyze(drop, reqs, t0, d, 20)
	if math.Abs(f.DropStop-3.0625) > 0.001 {
		t.Errorf("429s stopped %.4f s after the drop, want 3.0625", f.DropStop)
	}
	reqs = spread(reqs, 30*time.Second, 90*time.Second, 60, http.StatusTooManyRequests)
	if f := analyze(drop, reqs, t0, d, 20); f.DropStop != -1 {
		t.Errorf("429s every second until the end: stop %v, want -1 (never)", f.DropStop)
	}
}

func modelByName(name string) (Model, bool) {
	ms, err := selectModels([]string{name}, append(Models(), NginxModels(8)...))
	if err != nil || len(ms) != 1 {
		return Model{}, false
	}
	return ms[0], true
}

// Every model the issue names is there, with the limit its name says.
func TestAdaptModels(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, m := range append(Models(), NginxModels(8)...) {
		if seen[m.Name] {
			t.Errorf("model %s twice", m.Name)
		}
		seen[m.Name] = true
	}
	for _, tc := range []struct {
		name  string
		rule  fakedest.Rule
		allow float64
	}{
		{"window1s-33", fakedest.Rule{Window: time.Second, WindowLimit: 7}, 7},
		{"window5s-33", fakedest.Rule{Window: 5 * time.Second, WindowLimit: 33}, 6.6},
		{"window10s-10-xrl", fakedest.Rule{Window: 10 * time.Second, WindowLimit: 20, Headers: fakedest.XRateLimit}, 2},
		{"window60s-33-ietf", fakedest.Rule{Window: time.Minute, WindowLimit: 400, Headers: fakedest.IETF}, 400.0 / 60},
		{"strict-nginx-40", fakedest.Rule{Rate: 8, Strict: true, RetryAfter: fakedest.NoRetryAfter}, 8},
		{"strict-nginx-40-ietf", fakedest.Rule{Rate: 8, Strict: true, RetryAfter: fakedest.NoRetryAfter, Headers: fakedest.IETF}, 8},
		{"strict-40-ietf", fakedest.Rule{Rate: 8, Burst: 1, Headers: fakedest.IETF}, 8},
		{"sliding10s-33", fakedest.Rule{Window: 10 * time.Second, WindowLimit: 67, Sliding: true}, 6.7},
		{"rise-40-80", fakedest.Rule{Rate: 8, Burst: 1}, 8},
	} {
		m, ok := modelByName(tc.name)
		if !ok {
			t.Errorf("no model %s", tc.name)
			continue
		}
		if got := m.rule(20, m.Share); !reflect.DeepEqual(got, tc.rule) {
			t.Errorf("%s: rule %+v, want %+v", tc.name, got, tc.rule)
		}
		if got := m.allowance(20, 0, time.Minute); math.Abs(got-tc.allow) > 1e-9 {
			t.Errorf("%s: allows %g/s, want %g", tc.name, got, tc.allow)
		}
	}
	if m, _ := modelByName("rise-40-80"); m.allowance(20, 40*time.Second, 2*time.Minute) != 16 {
		t.Error("rise-40-80 does not allow 16/s after a third of the run")
	}
	if m, _ := modelByName("nginx-8-burst5"); m.NginxRate != 8 || m.NginxBurst != 5 || m.allowance(20, 0, time.Minute) != 8 {
		t.Errorf("nginx-8-burst5: %+v", m)
	}
	ms, err := selectModels([]string{"window1s-*", "window1s-33"}, Models())
	if err != nil || len(ms) != 9 {
		t.Errorf("window1s-* and window1s-33: %d models, %v; want the 9 1-s windows once", len(ms), err)
	}
	if _, err := selectModels([]string{"nope"}, Models()); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "strict-40") {
		t.Errorf("an unknown model: %v, want ErrInvalidConfig listing the known ones", err)
	}
	if err := (AdaptConfig{Models: []string{"strict-40"}, Nginx: true}).Validate(); err == nil {
		t.Error("--nginx with a fake model validated")
	}
}

// The oracle's worker flag follows the model's steps at OracleShare of the
// allowance; the AWS mode's caps
// each process at its share of the ceiling.
func TestAdaptLocalPacers(t *testing.T) {
	t.Parallel()
	m, _ := modelByName("drop-80-30")
	const d = 90 * time.Second
	c := cell{model: m, schedule: OracleSchedule, platform: "drop-80-30.oracle"}
	sp, err := localpace.Parse(c.localPacer(20, 4, 3, t0, d))
	if err != nil {
		t.Fatal(err)
	}
	want := []localpace.Step{{Rate: 4 * OracleShare}, {From: t0.Add(30 * time.Second), Rate: 1.5 * OracleShare}, {From: t0.Add(60 * time.Second), Rate: 4 * OracleShare}}
	if len(sp.Steps) != 3 || sp.Phase != 0.75 {
		t.Fatalf("steps %+v, phase %g; want %+v, 0.75 (the fourth process of four)", sp.Steps, sp.Phase, want)
	}
	for i := range want {
		if !sp.Steps[i].From.Equal(want[i].From) || math.Abs(sp.Steps[i].Rate-want[i].Rate) > 1e-9 {
			t.Errorf("steps %+v, want %+v", sp.Steps, want)
		}
	}
	c.schedule = AWSSchedule
	if got := c.localPacer(20, 4, 1, t0, d); got != "drop-80-30.oracle=aws:5" {
		t.Errorf("aws: %q", got)
	}
	c.schedule = DefaultSchedule()
	if got := c.localPacer(20, 4, 0, t0, d); got != "" {
		t.Errorf("default: %q, want none", got)
	}
}

// The default rows name the targets they miss, against the AWS and oracle
// rows too.
func TestAdaptJudge(t *testing.T) {
	t.Parallel()
	row := func(model, sched string, g, s, reach float64) AdaptRow {
		return AdaptRow{Model: model, Schedule: sched, Bound: 21, RunFigures: RunFigures{Goodput1070: g, Limited10End: s, Reach: reach, MaxWindow: 10}}
	}
	r := &AdaptResult{Rows: []AdaptRow{
		row("strict-40", ScheduleDefault, 0.92, 0.01, 4), row("strict-40", ScheduleAWS, 0.8, 0.05, 20), row("strict-40", ScheduleOracle, 0.95, 0, 1),
		row("window1s-33", ScheduleDefault, 0.85, 0.03, 12), row("window1s-33", ScheduleAWS, 0.9, 0, 3), row("window1s-33", ScheduleOracle, 0.99, 0, 1),
	}}
	r.judge()
	if m := r.Rows[0].Missed; len(m) != 0 {
		t.Errorf("strict-40 missed %v, want none", m)
	}
	if m := strings.Join(r.Rows[3].Missed, "; "); !strings.Contains(m, "goodput 0.85") || !strings.Contains(m, "429s 3.0%") ||
		!strings.Contains(m, "reach") || !strings.Contains(m, "< aws") || !strings.Contains(m, "oracle") {
		t.Errorf("window1s-33 missed %q, want goodput, 429s, reach, aws and oracle", m)
	}
	if r.Rows[1].Missed != nil {
		t.Error("an aws row judged")
	}
}

// A median over runs counts never as the longest: of two runs, one never
// makes the median never (not the mean of a figure and a sentinel).
func TestPickNever(t *testing.T) {
	reach := func(rs ...float64) float64 {
		var runs []RunFigures
		for _, r := range rs {
			runs = append(runs, RunFigures{Reach: r})
		}
		return pickNever(runs, func(r RunFigures) float64 { return r.Reach })
	}
	for _, c := range []struct {
		runs []float64
		want float64
	}{
		{[]float64{5, -1}, -1},
		{[]float64{5, 7}, 6},
		{[]float64{5, -1, 7}, 7},
		{[]float64{-1, -1, 7}, -1},
	} {
		if got := reach(c.runs...); got != c.want {
			t.Errorf("median of %v: %v, want %v", c.runs, got, c.want)
		}
	}
}

// The oracle's platform polls as many sources per worker as another
// platform polls in all: its processes pace fixed shares and River hands
// jobs to processes unevenly (with 60 sources, 25–31 slept in one process
// and 0–3 in another, and the oracle read 0.78 of strict-70 with nothing
// refused; 0.97 with 180). The default concurrency holds every source's
// job at once, so the oracle's sleepers take no slot from the others.
func TestAdaptOracleHasACallerForEverySlot(t *testing.T) {
	n := adaptSources(DefaultAdaptCeiling)
	if got := (cell{schedule: OracleSchedule}).sources(n, 3); got != 3*n {
		t.Errorf("oracle polls %d sources, want %d (3 workers × %d)", got, 3*n, n)
	}
	if got := (cell{schedule: DefaultSchedule()}).sources(n, 3); got != n {
		t.Errorf("default polls %d sources, want %d", got, n)
	}
	cfg := AdaptConfig{}
	schedules := cfg.schedules()
	all := 0
	for _, sc := range schedules {
		all += cell{schedule: sc}.sources(n, 3)
	}
	if c := adaptConcurrency(schedules, DefaultAdaptCeiling, 3); 3*c < all {
		t.Errorf("3 workers × concurrency %d hold fewer jobs than the run's %d sources", c, all)
	}
}
