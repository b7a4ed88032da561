package bench

import (
	"reflect"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/pacer"
)

// The trace's refusal lines: only refusals from `from` on, the position in
// the wall-clock second, and the gaps to the three requests before (a
// refusal among them marked).
func TestAdaptTraceRefusals(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	reqs := []arrival{
		{At: ms(5000), Limited: true}, // before from: not described
		{At: ms(10_100), Status: 200},
		{At: ms(10_520), Status: 429, Limited: true},
		{At: ms(10_930), Status: 200},
		{At: ms(11_340), Status: 200},
		{At: ms(11_750), Status: 429, Limited: true},
	}
	got := refusalLines(reqs, t0, 10*time.Second)
	want := []string{
		"429 at 10.520s (0.520 into its second), gaps before it: 0.420s 5.100s (429)",
		"429 at 11.750s (0.750 into its second), gaps before it: 0.410s 0.410s 0.410s (429)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("refusalLines =\n%q\nwant\n%q", got, want)
	}
}

// The estimate trace prints a platform when its estimate (to three
// decimals), its slow-down count or the end of its hold moves, and not
// otherwise.
func TestAdaptTraceEstimates(t *testing.T) {
	last := map[string]estimateMark{}
	st := pacer.State{Platform: "m.default", Estimate: 2.5071, EffectiveRate: 2.2064, PacedBy: pacer.PacedByBackoff, Slowdowns: 7}
	got := estimateLines(last, []pacer.State{st}, 1, 12310*time.Millisecond)
	want := []string{"run 1: m.default at  12.31s: estimate 2.507/s, pace 2.206/s (backoff), hold 0.00s, slow-downs 7"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("first read = %q, want %q", got, want)
	}
	st.Estimate, st.EffectiveRate = 2.5074, 2.3 // the same to three decimals; the pace moves on its own
	if got := estimateLines(last, []pacer.State{st}, 1, 13*time.Second); got != nil {
		t.Fatalf("unchanged estimate printed %q", got)
	}
	st.Slowdowns++
	if got := estimateLines(last, []pacer.State{st}, 1, 14*time.Second); len(got) != 1 {
		t.Fatalf("a slow-down at the same estimate printed %q, want one line", got)
	}
	st.Estimate = 2.406
	if got := estimateLines(last, []pacer.State{st}, 1, 15*time.Second); len(got) != 1 {
		t.Fatalf("a new estimate printed %q, want one line", got)
	}
	st.Hold, st.HoldReason = 980*time.Millisecond, "quota exhausted"
	got = estimateLines(last, []pacer.State{st}, 1, 16*time.Second)
	want = []string{"run 1: m.default at  16.00s: estimate 2.406/s, pace 2.300/s (backoff), hold 0.98s (quota exhausted), slow-downs 8"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("a hold printed %q, want %q", got, want)
	}
	st.Hold = 930 * time.Millisecond // the same hold, read 50 ms later
	if got := estimateLines(last, []pacer.State{st}, 1, 16050*time.Millisecond); got != nil {
		t.Fatalf("the same hold printed again: %q", got)
	}
}

// The trace's silences: each gap between two requests longer than
// traceGap from `from` on, as its start and length.
func TestAdaptTraceGaps(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	reqs := []arrival{{At: ms(2000)}, {At: ms(9000)}, {At: ms(10_100)}, {At: ms(10_600)}, {At: ms(11_630)}, {At: ms(12_000)}}
	got := gapLines(reqs, t0, 10*time.Second)
	want := []string{"9.00+1.10", "10.60+1.03"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("gapLines = %q, want %q", got, want)
	}
}
