package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/status"
)

// A destination answering `429 Retry-After: 10` to every request, fetched
// by two worker processes: between its holds as during them, status never
// says "running" (nor the dashboard), its 429s per minute show, the last
// answer's reason is recorded (status and Retry-After), and a destination
// that hangs shows its requests in flight, fleet-wide, within seconds.
func TestSteady429sAreVisible(t *testing.T) {
	t.Parallel()
	url := newURL(t)
	d := newDest(t, map[string]fakedest.Rule{
		"/limited/": fakedest.Blocked(10 * time.Second),
		"/hanging/": {Delay: 60 * time.Second},
	})
	setPlatform(t, url, "limited", "--rate", "5", "--max-multiplier", "1024")
	setPlatform(t, url, "hanging", "--rate", "5")
	importSources(t, url, "limited", d.URL(), pathsN("/limited/", 40))
	w1 := startWorker(t, url, "w1", "--concurrency", "8", "--max-pacer-wait", "2s", "--job-timeout", "2m")
	w2 := startWorker(t, url, "w2", "--concurrency", "8", "--max-pacer-wait", "2s", "--job-timeout", "2m")
	db := pool(t, url)
	ctx := context.Background()

	first := waitArrivals(t, d, "/limited/", 1, 30*time.Second)
	// Until the status shows the first 429 (its check recorded: on a slow
	// machine under two packages' tests that took over 2 s), at most 10 s.
	waitFor(t, 10*time.Second, "the status showing the first 429", func() bool {
		rep, err := status.Read(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		p := platformOf(t, rep, "limited")
		return status.Level(p.State) != status.LevelOK && p.Use.RefusedPerMin > 0
	})
	shown := time.Now()
	t.Logf("the status showed the first 429 %s after it", shown.Sub(first).Round(time.Millisecond))
	// Then sample it for 25 s: two holds of 10 s and what lies between
	// them; it must show the 429s all along.
	var samples, between int
	var last *status.Report
	for end := shown.Add(25 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		rep, err := status.Read(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		last = rep
		p := platformOf(t, rep, "limited")
		samples++
		if p.Pace.Hold == 0 && p.Cooldown == nil {
			between++
		}
		if status.Level(p.State) == status.LevelOK || p.Use.RefusedPerMin == 0 {
			t.Fatalf("%s after the first 429: limited shows %v, %g 429s/min (hold %s)", time.Since(first).Round(time.Millisecond),
				p.State, p.Use.RefusedPerMin, p.Pace.Hold)
		}
	}
	t.Logf("steady 429s: %d status samples over 25 s, %d between holds; none running; last: %v, %.3g 429s/min, used %s",
		samples, between, platformOf(t, last, "limited").State, platformOf(t, last, "limited").Use.RefusedPerMin,
		platformOf(t, last, "limited").Use.Text())
	if between == 0 {
		t.Errorf("no sample between holds in 25 s of 10-s holds")
	}
	// The CLI says it in words, with the reason of every 429.
	out := cli(t, url, "status")
	if m := regexp.MustCompile(`(?m)^limited .*$`).FindString(out); m == "" || strings.Contains(m, " running ") || !strings.Contains(m, "429s: ") {
		t.Errorf("status's line of limited: %q\n%s", m, out)
	}
	var answered string
	if err := db.QueryRow(ctx, `SELECT id::text FROM fleetpace_source WHERE platform = 'limited' AND last_outcome IS NOT NULL ORDER BY id LIMIT 1`).Scan(&answered); err != nil {
		t.Fatal(err)
	}
	show := cli(t, url, "sources", "show", answered)
	if !strings.Contains(show, "HTTP 429 Too Many Requests, Retry-After 10s") || !strings.Contains(show, "last answer") {
		t.Errorf("sources show of a source answered 429: no reason\n%s", show)
	}
	// The dashboard's overview: the limited platform's state is not running.
	res, err := http.Get(w1.http() + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(res.Body)
	res.Body.Close()
	row := regexp.MustCompile(`(?s)<tr data-platform="limited".*?</tr>`).Find(page)
	if row == nil || strings.Contains(string(row), `class="state running`) || !strings.Contains(string(row), "429s: ") {
		t.Errorf("the overview's row of limited: %s", row)
	}
	// The hanging destination: its requests show in flight, fleet-wide
	// (the heartbeats, every second), and in the worker's /metrics. Its
	// sources come now, so that their requests are still in flight (the
	// fetch gives up after 30 s) however long the checks above took on a
	// loaded machine.
	importSources(t, url, "hanging", d.URL(), pathsN("/hanging/", 4))
	var hanging status.Platform
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		rep, err := status.Read(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if hanging = platformOf(t, rep, "hanging"); hanging.Use.InFlight >= 4 {
			break
		}
	}
	if hanging.Use.InFlight < 4 || len(hanging.State) != 1 || hanging.State[0].Kind != status.KindWaiting {
		t.Errorf("hanging destination: %d request(s) in flight fleet-wide, state %v; want its 4 sources, waiting", hanging.Use.InFlight, hanging.State)
	}
	var js status.Report
	res, err = http.Get(w1.http() + "/status")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(res.Body).Decode(&js)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if p := platformOf(t, &js, "limited"); len(p.State) == 0 || p.State[0].Kind == status.KindRunning {
		t.Errorf("/status: limited is %v", p.State)
	}
	// Each process's own gauge: the two workers' add up to the 4.
	gauge := regexp.MustCompile(`(?m)^fleetpace_fetches_in_flight\{platform="hanging"\} (\d+)`)
	sum, all := 0, ""
	for _, w := range []*proc{w1, w2} {
		metrics := metricsOf(t, w)
		if m := gauge.FindSubmatch(metrics); m != nil {
			n, _ := strconv.Atoi(string(m[1]))
			sum += n
		}
		all += grepLines(string(metrics), "in_flight") + "\n"
	}
	if sum != 4 {
		t.Errorf("the workers' /metrics say %d fetch(es) in flight to the hanging destination, want 4:\n%s", sum, all)
	}
}

// `platforms reset` after a destination announced a small quota and then
// lifted it: the next request within a second, then the configured 10/s
// in seconds 1–5 (by every worker). The control: `cooldowns clear` of a
// platform in the same state leaves the announced quota in force (well
// under 10/s).
func TestResetGoesAtTheConfiguredPace(t *testing.T) {
	t.Parallel()
	url := newURL(t)
	quota := fakedest.Rule{Window: time.Minute, WindowLimit: 30, Headers: fakedest.XRateLimit}
	d := newDest(t, map[string]fakedest.Rule{"/a/": quota, "/b/": quota})
	for _, p := range []string{"a", "b"} {
		platformWithSources(t, url, p, d.URL(), 300, "--rate", "10", "--burst", "1")
	}
	names := []string{"w1", "w2"}
	for _, n := range names {
		startWorker(t, url, n, "--concurrency", "10", "--max-pacer-wait", "2s")
	}
	db := pool(t, url)
	ctx := context.Background()
	// Until both are paced by the quota the destination announced, and b's
	// announcement (renewed by each answer until its window's reset) holds
	// long enough for the control: on a loaded machine the two commands
	// below took 3.7 s, and an announcement that ended meanwhile left b at
	// its configured pace.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		rep, err := status.Read(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		a, b := platformOf(t, rep, "a"), platformOf(t, rep, "b")
		if a.Pace.EffectiveRate < 2 && b.Pace.EffectiveRate < 2 && b.Pace.AnnouncedFor >= 20*time.Second {
			t.Logf("before: a %v (%.2g/s), b %v (%.2g/s)", a.State, a.Pace.EffectiveRate, b.State, b.Pace.EffectiveRate)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("90 s on, a and b are not paced by the announced quota with 20 s of it left: a %.2g/s, b %.2g/s (%s left)", a.Pace.EffectiveRate, b.Pace.EffectiveRate, b.Pace.AnnouncedFor)
		}
	}
	d.DeleteRule("/a/") // the destination lifts its quota
	d.DeleteRule("/b/")
	start := time.Now()
	cli(t, url, "cooldowns", "clear", "b")
	out := cli(t, url, "platforms", "reset", "a")
	done := time.Now()
	if !strings.Contains(out, "platform a reset: 10/s, burst 1 from now") {
		t.Errorf("platforms reset: %s", out)
	}
	firstA := firstArrival(t, d, "/a/", done, 10*time.Second)
	waitUntil(t, d, "/a/", done.Add(5*time.Second), 30*time.Second)
	paceA := float64(arrivalsBetween(d.Arrivals("/a/"), done.Add(time.Second), done.Add(5*time.Second))) / 4
	paceB := float64(arrivalsBetween(d.Arrivals("/b/"), done.Add(time.Second), done.Add(5*time.Second))) / 4
	_, byUA := arrivalsBy(d, "/a/", done, done.Add(5*time.Second))
	t.Logf("platforms reset: the first request to a %s after the command returned (both commands took %s), then %.1f/s (rate 10/s), by process %v; b after cooldowns clear (the control): %.1f/s",
		firstA.Sub(done).Round(time.Millisecond), done.Sub(start).Round(time.Millisecond), paceA, byUA, paceB)
	if wait := firstA.Sub(done); wait > time.Second {
		t.Errorf("the first request to a came %s after platforms reset; want ≤ 1 s", wait)
	}
	if paceA < 7 {
		t.Errorf("a ran at %.1f/s in seconds 1–5 after platforms reset; want ≥ 0.7 × its configured 10/s", paceA)
	}
	if paceB > 3 {
		t.Errorf("the control: b ran at %.1f/s after cooldowns clear; the announced quota (0.5/s) should still pace it", paceB)
	}
	for _, n := range names {
		if byUA[n] == 0 {
			t.Errorf("worker %s did not fetch a within 5 s of platforms reset", n)
		}
	}
}

func platformOf(t *testing.T, rep *status.Report, name string) status.Platform {
	t.Helper()
	for _, p := range rep.Platforms {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no platform %s in the status", name)
	return status.Platform{}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// workerCounter is the sum of the unlabelled counter name over the
// workers' /metrics.
func workerCounter(t *testing.T, ws []*proc, name string) int {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)`)
	sum := 0
	for _, w := range ws {
		if m := re.FindSubmatch(metricsOf(t, w)); m != nil {
			v, _ := strconv.ParseFloat(string(m[1]), 64)
			sum += int(v)
		}
	}
	return sum
}

// metricsOf is w's /metrics page.
func metricsOf(t *testing.T, w *proc) []byte {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	res, err := c.Get(w.http() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	metrics, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return metrics
}
