package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// arrivalsBy returns the arrival times of requests under prefix, in order,
// and which processes (User-Agents) they came from.
func arrivalsBy(d *fakedest.Server, prefix string, from, to time.Time) (times []time.Time, uas map[string]int) {
	uas = map[string]int{}
	for _, r := range d.Requests() {
		if strings.HasPrefix(r.Path, prefix) && !r.Time.Before(from) && r.Time.Before(to) {
			times = append(times, r.Time)
			uas[r.UserAgent]++
		}
	}
	return times, uas
}

// firstArrival waits for the first request under prefix at or after from,
// for at most timeout, and returns its arrival time.
func firstArrival(t *testing.T, d *fakedest.Server, prefix string, from time.Time, timeout time.Duration) time.Time {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if times, _ := arrivalsBy(d, prefix, from, from.Add(24*time.Hour)); len(times) > 0 {
			return times[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("destination: no request under %q within %s of %s", prefix, timeout, from.Format(time.StampMilli))
		}
	}
}

// `platforms pause A` with three worker processes: from one second after
// the command until `platforms resume`, no request for A reaches the
// destination — not even across a worker's restart — while B keeps its
// rate; on resume A's jobs, snoozed meanwhile, run at once. Then
// `--for 5s` ends by itself.
func TestPause(t *testing.T) {
	t.Parallel()
	const rate = 5.0
	url := newURL(t)
	d := newDest(t, nil)
	for _, p := range []string{"a", "b"} {
		platformWithSources(t, url, p, d.URL(), 400, "--rate", "5", "--burst", "1")
	}
	names := []string{"w1", "w2", "w3"}
	ws := map[string]*proc{}
	for _, n := range names {
		ws[n] = startWorker(t, url, n, "--concurrency", "5", "--max-pacer-wait", "2s")
	}
	waitArrivals(t, d, "/a/", 10, 30*time.Second)

	cli(t, url, "platforms", "pause", "a", "--reason", "maintenance")
	paused := time.Now()
	if out := cli(t, url, "status"); !strings.Contains(out, "paused by operator until resumed (maintenance)") {
		t.Fatalf("status does not show the pause:\n%s", out)
	}
	// Observe 5 s of the pause, restart a worker, observe 5 s more (B's
	// arrivals mark the destination's time).
	waitUntil(t, d, "/b/", paused.Add(5*time.Second), 30*time.Second)
	ws["w1"].stop()
	ws["w1"] = startWorker(t, url, "w1", "--concurrency", "5", "--max-pacer-wait", "2s")
	restarted := time.Now()
	waitUntil(t, d, "/b/", restarted.Add(5*time.Second), 30*time.Second)
	// The pause is judged until the resume command starts: once it has
	// committed, A's jobs may run before the command's process has exited
	// (CI: a request to A 11.62 s after the pause, the command returning
	// at 11.6 s).
	resuming := time.Now()
	cli(t, url, "platforms", "resume", "a")
	resumed := time.Now()

	aDuring, _ := arrivalsBy(d, "/a/", paused.Add(time.Second), resuming)
	bDuring := float64(arrivalsBetween(d.Arrivals("/b/"), paused.Add(time.Second), resuming)) / resuming.Sub(paused.Add(time.Second)).Seconds()
	firstAfter := waitArrivals(t, d, "/a/", d.Count("/a/")+1, 10*time.Second)
	// A's rate over the 4 s after the first second of the resume: its
	// snoozed jobs run now, not at their snooze's end.
	waitUntil(t, d, "/b/", resumed.Add(5*time.Second), 30*time.Second)
	aAfter := float64(arrivalsBetween(d.Arrivals("/a/"), resumed.Add(time.Second), resumed.Add(5*time.Second))) / 4
	aBefore, _ := arrivalsBy(d, "/a/", paused.Add(-time.Second), paused.Add(time.Second))
	t.Logf("pause: %d request(s) to A in the second before and after the command, %d from 1 s after it to resume (%s, a worker restarted); B at %.1f/s meanwhile (rate %.0f/s); A's first request %s after resume, then %.1f/s",
		len(aBefore), len(aDuring), resumed.Sub(paused).Round(100*time.Millisecond), bDuring, rate, firstAfter.Sub(resumed).Round(time.Millisecond), aAfter)
	if len(aDuring) > 0 {
		t.Errorf("%d request(s) to A while paused, the first %s after the pause command", len(aDuring), aDuring[0].Sub(paused))
	}
	if bDuring < 0.8*rate {
		t.Errorf("B ran at %.1f/s while A was paused; want ≥ 0.8 × %.0f/s", bDuring, rate)
	}
	if wait := firstAfter.Sub(resumed); wait > 3*time.Second {
		t.Errorf("A's first request came %s after resume; its jobs should run at once", wait)
	}
	if aAfter < 0.8*rate {
		t.Errorf("A ran at %.1f/s in the 4 s after the first second of its resume; want ≥ 0.8 × %.0f/s", aAfter, rate)
	}

	// A pause for 5 s ends by itself. The database's clock starts it while
	// the command runs: it ends no earlier than 5 s after the command began,
	// and is in force from 1 s after the command returned.
	issued := time.Now()
	cli(t, url, "platforms", "pause", "a", "--for", "5s")
	timed := time.Now()
	back := waitUntil(t, d, "/a/", timed.Add(time.Second), 30*time.Second)
	early, _ := arrivalsBy(d, "/a/", timed.Add(time.Second), issued.Add(5*time.Second))
	t.Logf("pause --for 5s: A's first request from 1 s after the command came %s after it", back.Sub(timed).Round(time.Millisecond))
	if len(early) > 0 {
		t.Errorf("%d request(s) to A during its 5-s pause", len(early))
	}
	if back.Sub(timed) > 5*time.Second+12*time.Second {
		t.Errorf("A came back %s after a 5-s pause", back.Sub(timed))
	}
	for _, n := range names {
		ws[n].stop()
	}
}

// A platform cooling down after a Retry-After of 600 s: `cooldowns clear`
// ends the cooldown, the pacer's hold and its backoff, fleet-wide: the
// first request comes within 1 s of the command, the platform runs at its
// configured pace (not the backed-off one) from then on, and every worker
// process takes part. The workers run no scan (one `scan` queues every
// source at the start), and the command comes once every job of the
// platform has snoozed for the cooldown: what runs after it are those
// jobs, woken by the command.
func TestCooldownClear(t *testing.T) {
	t.Parallel()
	url := newURL(t)
	d := newDest(t, nil)
	platformWithSources(t, url, "a", d.URL(), 80, "--rate", "10", "--burst", "1")
	if out := cli(t, url, "scan"); !strings.Contains(out, "enqueued 80") {
		t.Fatalf("scan: %s", out)
	}
	names := []string{"w1", "w2", "w3"}
	var ws []*proc
	for _, n := range names {
		ws = append(ws, startWorker(t, url, n, "--concurrency", "5", "--max-pacer-wait", "2s", "--no-scan"))
	}
	waitArrivals(t, d, "/a/", 10, 30*time.Second)
	if err := d.SetRule("/a/", fakedest.Blocked(600*time.Second)); err != nil {
		t.Fatal(err)
	}
	blocked := time.Now()
	db := pool(t, url)
	// Wait for the cooldown, and for every job of the platform to have
	// snoozed for it (none available or running).
	var cooling, waiting int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := db.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM fleetpace_cooldown WHERE platform = 'a' AND until > now() + interval '5 minutes'),
			(SELECT count(*) FROM river_job WHERE args->>'platform' = 'a' AND state IN ('available', 'running'))`).Scan(&cooling, &waiting); err != nil {
			t.Fatal(err)
		}
		if cooling == 1 && waiting == 0 && time.Since(blocked) > 3*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("platform a: cooldown %d, %d job(s) not snoozed, 30 s after a 429 with Retry-After 600", cooling, waiting)
		}
	}
	if out := cli(t, url, "status"); !strings.Contains(out, "cooling down: ") {
		t.Fatalf("status does not show the cooldown:\n%s", out)
	}
	d.DeleteRule("/a/") // the destination answers again
	quietFrom := blocked.Add(3 * time.Second)
	cleared := time.Now() // the command's start
	cli(t, url, "cooldowns", "clear", "a")
	done := time.Now()
	if n := arrivalsBetween(d.Arrivals("/a/"), quietFrom, cleared); n > 0 {
		t.Fatalf("%d request(s) to A while it cooled down", n)
	}
	first := firstArrival(t, d, "/a/", cleared, 10*time.Second)
	// The configured pace over seconds 1–5 after the command, by the
	// destination's clock (its arrivals after that mark the time).
	waitUntil(t, d, "/a/", done.Add(5*time.Second), 30*time.Second)
	pace := float64(arrivalsBetween(d.Arrivals("/a/"), done.Add(time.Second), done.Add(5*time.Second))) / 4
	_, byUA := arrivalsBy(d, "/a/", cleared, done.Add(5*time.Second))
	t.Logf("cooldowns clear: the first request to A %s after the command returned, then %.1f/s (rate 10/s); by process within 5 s: %v",
		first.Sub(done).Round(time.Millisecond), pace, byUA)
	if wait := first.Sub(done); wait > time.Second {
		t.Errorf("the first request to A came %s after cooldowns clear; want ≤ 1 s", wait)
	}
	// The 429 raised the backoff multiplier (×1.5: 6.7/s); clearing the
	// cooldown clears it too. The fleet's pace shows it (above 6.7/s, with
	// room for a loaded machine), the pace row says it exactly.
	var mult float64
	if err := db.QueryRow(context.Background(), `SELECT multiplier FROM fleetpace_pace WHERE platform = 'a'`).Scan(&mult); err != nil {
		t.Fatal(err)
	}
	if mult != 1 {
		t.Errorf("A's backoff multiplier is %g after cooldowns clear; want 1", mult)
	}
	if pace < 7 {
		t.Errorf("A ran at %.1f/s in seconds 1–5 after cooldowns clear; want ≥ 0.7 × its configured 10/s (backed off, it would be ≤ 6.7/s)", pace)
	}
	for _, n := range names {
		if byUA[n] == 0 {
			t.Errorf("worker %s did not fetch A within 5 s of cooldowns clear", n)
		}
	}
	var left int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM fleetpace_cooldown WHERE platform = 'a'`).Scan(&left); err != nil || left != 0 {
		t.Errorf("cooldown rows of a after clear: %d (%v)", left, err)
	}
	stopAll(ws)
}
