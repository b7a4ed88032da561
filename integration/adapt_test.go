package integration

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// naiveFlags are the negative control of the test below: no adaptation —
// the fleet paces at its ceiling (maximum multiplier 1) and only obeys the
// destination's Retry-After (a cooldown as long as it asks, 1 s), as a
// poller without adaptive pacing does.
var naiveFlags = []string{"--max-multiplier", "1", "--cooldown", "1s"}

// Three workers, ceiling 20/s, a destination that allows 8/s with strict
// spacing (a token bucket of capacity 1; a 429 says Retry-After: 1): over
// seconds 20–50 the default schedule gets at least 0.7 of what the
// destination allows with at most 5 % 429s (each probe past the limit
// costs the destination's 1-s hold and a cut, so a 20-s span on a loaded
// machine could fall under the bar when two probes fell into it; the
// simulation and bench adapt put the figure at 0.8–0.9); the naive fleet,
// run beside it on a destination of its own, does not. (How close to the allowance each
// schedule gets, against the AWS SDKs' adaptive mode and an oracle, is
// `fleetpace bench adapt`'s to measure.)
func TestAdaptiveGoodputStrictDestination(t *testing.T) {
	// Not parallel: beside three other scenarios, on a machine where
	// starting a process is slow, its workers took 8 s to get going and
	// the judged span read 0.66 and 0.68 in two fresh-clone runs (0.87–0.88
	// alone, 0.77–0.87 beside a busy loop).
	const (
		ceiling = 20.0
		allowed = 8.0
		run     = 50 * time.Second
		judged  = 20 * time.Second // from
	)
	url := newURL(t)
	d := newDest(t, map[string]fakedest.Rule{
		"/new/":   {Rate: allowed, Burst: 1},
		"/naive/": {Rate: allowed, Burst: 1},
	})
	setPlatform(t, url, "new", "--rate", fmt.Sprint(ceiling))
	setPlatform(t, url, "naive", append([]string{"--rate", fmt.Sprint(ceiling)}, naiveFlags...)...)
	importSources(t, url, "new", d.URL(), pathsN("/new/", 600))
	importSources(t, url, "naive", d.URL(), pathsN("/naive/", 600))
	ws := startWorkers(t, url, "w", 3, "--concurrency", "20")
	start := waitArrivals(t, d, "/new/", 1, 30*time.Second)
	// (Not a naive request after the span: its cooldowns escalate, 15 s
	// and more by the end, and a refusal at the ceiling is no jitter.)
	waitUntil(t, d, "/new/", start.Add(run), 30*time.Second)
	stopAll(ws)
	from, to := start.Add(judged), start.Add(run)
	figures := map[string][2]float64{}
	for _, p := range []string{"new", "naive"} {
		tl := d.Tally("/"+p+"/", from, to)
		goodput := float64(tl.Accepted) / (allowed * (to.Sub(from)).Seconds())
		figures[p] = [2]float64{goodput, tl.LimitedShare()}
		t.Logf("%s: seconds 20–50: %d requests, %d accepted, %d refused: goodput %.2f of the allowance, 429 share %.1f %%; per second %s",
			p, tl.Requests, tl.Accepted, tl.Limited, goodput, 100*tl.LimitedShare(),
			perSecond(rateSeries(d.Arrivals("/"+p+"/", http.StatusOK), start, time.Second)))
	}
	if g, s := figures["new"][0], figures["new"][1]; g < 0.7 || s > 0.05 {
		t.Errorf("default schedule: goodput %.2f (want ≥ 0.7), 429 share %.1f %% (want ≤ 5 %%)", g, 100*s)
	}
	if g, s := figures["naive"][0], figures["naive"][1]; g >= 0.7 && s <= 0.05 {
		t.Errorf("the naive fleet got %.2f with %.1f %% refused: the bar above proves nothing", g, 100*s)
	}
}

// Two worker processes pace one platform; the destination starts answering
// 429 with Retry-After: 5. The first 429 reaches one process; from reach
// after it (timestamps at the destination), no request of either process
// reaches the destination until the hold ends: the other process's slots,
// granted at the old spacing and waiting, were moved past the hold. With
// re-spacing off (the baseline, on a platform of its own), granted
// slots keep going out.
func TestPressureStopsEveryProcessSlots(t *testing.T) {
	t.Parallel()
	// reach is how soon the event reaches the other process: a report and
	// a notification, tens of ms on a quiet machine; on a slow one under
	// the whole suite a process had been cut off from the database for 2 s
	// just before, and one of its requests came more than 100 ms after.
	const hold, reach = 5 * time.Second, 500 * time.Millisecond
	for _, tc := range []struct {
		name    string
		flags   []string
		respace bool
	}{
		{"respace", nil, true},
		{"no-respace", []string{"--respace=false"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := newURL(t)
			prefix := "/" + tc.name + "/"
			d := newDest(t, map[string]fakedest.Rule{prefix: {}})
			setPlatform(t, url, tc.name, append([]string{"--rate", "20", "--decay-after", "1000"}, tc.flags...)...)
			importSources(t, url, tc.name, d.URL(), pathsN(prefix, 600))
			ws := startWorkers(t, url, "p", 2, "--concurrency", "20")
			start := waitArrivals(t, d, prefix, 1, 30*time.Second)
			waitUntil(t, d, prefix, start.Add(3*time.Second), 30*time.Second) // both processes hold granted slots now
			if err := d.SetRule(prefix, fakedest.Rule{Status: http.StatusTooManyRequests, RetryAfter: hold}); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, d, prefix, time.Now().Add(hold+time.Second), 30*time.Second)
			stopAll(ws)
			var first time.Time
			for _, r := range d.Requests() {
				if r.Status == http.StatusTooManyRequests && (first.IsZero() || r.Time.Before(first)) {
					first = r.Time
				}
			}
			if first.IsZero() {
				t.Fatal("no 429 recorded")
			}
			late := map[string]int{}
			n := 0
			var at []string
			for _, r := range d.Requests() {
				if r.Time.After(first.Add(reach)) && r.Time.Before(first.Add(hold-100*time.Millisecond)) {
					late[r.UserAgent]++
					n++
					at = append(at, fmt.Sprintf("%s +%.3f s", r.UserAgent, r.Time.Sub(first).Seconds()))
				}
			}
			t.Logf("%s: requests from %s after the first 429 until the hold ended: %d %v", tc.name, reach, n, late)
			switch {
			case tc.respace && n != 0:
				t.Errorf("%d request(s) reached the destination more than %s after the first 429, inside the hold: %v", n, reach, at)
			case !tc.respace && n < 5:
				t.Errorf("negative control: only %d request(s) went out at the old spacing without re-spacing; the test cannot tell", n)
			}
		})
	}
}

// A destination that announces 5/s (X-RateLimit-Limit: 5 per 1-s window,
// with Remaining and Reset) under a 20/s ceiling: across three processes, no
// window of the destination holds more than 5 + burst (1) requests, and no
// request is refused after the first answer's window (in it, at most the
// burst: the fleet learns of the answer by its report). The windows are
// the destination's (fakedest's fixed windows start on the second): an
// announcement of r left for t seconds lets r more go before the reset, so
// a 1-s span across a reset may hold more than 5 + 1 (CI: 3 in the tail of
// one window, then 5 in the next, none refused). The fleet holds the
// announced pace: at least 40 accepted in its best 10 s.
func TestAnnouncedLimitPacesTheFleet(t *testing.T) {
	t.Parallel()
	url := newURL(t)
	d := newDest(t, map[string]fakedest.Rule{"/ann/": {Window: time.Second, WindowLimit: 5, Headers: fakedest.XRateLimit}})
	platformWithSources(t, url, "ann", d.URL(), 300, "--rate", "20")
	ws := startWorkers(t, url, "a", 3, "--concurrency", "10")
	start := waitArrivals(t, d, "/ann/", 1, 30*time.Second)
	waitUntil(t, d, "/ann/", start.Add(20*time.Second), 30*time.Second)
	late, lateSends := workerCounter(t, ws, "fleetpace_pacer_slots_late_total"), workerCounter(t, ws, "fleetpace_fetch_late_sends_total")
	stopAll(ws)
	t.Logf("slots given up as woken late: %d; requests not written past their send-by time: %d", late, lateSends)
	reqs := d.Requests()
	var firstAnswer time.Time
	for _, r := range reqs {
		if !r.Done.IsZero() && (firstAnswer.IsZero() || r.Done.Before(firstAnswer)) {
			firstAnswer = r.Done
		}
	}
	// The first answer's window may hold the quota + the burst (the
	// retro re-spacing bounds it so, for the requests granted before the
	// fleet knew): its burst may be refused (a fresh-clone CI run: a third
	// process sent the sixth 240 ms after the first answer, before that
	// answer's report had reached it). None after that window.
	refused, refusedFirst := 0, 0
	firstWindowEnd := firstAnswer.Truncate(time.Second).Add(time.Second)
	for _, r := range reqs {
		switch {
		case r.Limited && !r.Time.Before(firstWindowEnd):
			refused++
		case r.Limited && r.Time.After(firstAnswer):
			refusedFirst++
		}
	}
	w := maxInWindow(times(reqs), time.Second)
	perWindow := map[time.Time]int{}
	inWindow := 0
	for _, r := range reqs {
		k := r.Time.Truncate(time.Second)
		perWindow[k]++
		inWindow = max(inWindow, perWindow[k])
	}
	// The best 10 s from the third second on: a fleet paced by what it was
	// announced holds 5/s there; one paced under it (0.37 × before the
	// announcement was read right) holds it nowhere. A loaded machine's
	// stall (CI: the database did not accept a connection for 2 s) costs a
	// few seconds, not all ten.
	accepted, from := 0, start
	for s := 3; s <= 10; s++ {
		if n := d.Tally("/ann/", start.Add(time.Duration(s)*time.Second), start.Add(time.Duration(s+10)*time.Second)).Accepted; n > accepted {
			accepted, from = n, start.Add(time.Duration(s)*time.Second)
		}
	}
	t.Logf("announced 5/s: largest window of the destination %d (of any 1-s span %d), refused after the first answer %d in its window and %d after it, accepted in the best 10 s (from %.0f s) %d (%.2f/s); per second %s",
		inWindow, w, refusedFirst, refused, from.Sub(start).Seconds(), accepted, float64(accepted)/10, perSecond(rateSeries(times(reqs), start, time.Second)))
	if inWindow > 6 {
		t.Errorf("a window of the destination held %d requests; it announced 5 per 1-s window and the burst is 1", inWindow)
	}
	if refused != 0 || refusedFirst > 1 {
		t.Errorf("%d request(s) refused in the first answer's window after it (at most the burst, 1) and %d after that window (want none)", refusedFirst, refused)
	}
	if t.Failed() {
		for _, r := range reqs {
			if r.Time.Before(start.Add(5 * time.Second)) {
				t.Logf("%8.3f s  %s  %d  answered %+.3f s  %v", r.Time.Sub(start).Seconds(), r.UserAgent, r.Status, r.Done.Sub(r.Time).Seconds(), r.RateLimit)
			}
		}
	}
	if accepted < 40 {
		t.Errorf("only %d requests accepted in 10 s of a 5/s allowance: paced far below what was announced", accepted)
	}
}
