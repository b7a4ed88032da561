package dashboard_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleetpace/fleetpace/internal/browser"
	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/internal/workers"
	"github.com/fleetpace/fleetpace/sourcefile"
	"github.com/fleetpace/fleetpace/sources"
)

// screenshot, if set, is where TestBrowser also saves its screenshot of the
// overview (the README's image):
//
//	go test ./dashboard -run TestBrowser -count=1 -args -screenshot=$PWD/docs/dashboard.png
var screenshot = flag.String("screenshot", "", "also save the browser test's screenshot of the overview here")

// The dashboard in a real browser, served by a real worker while two
// worker processes fetch from the fake destination: the overview shows the
// platform rows, the effective rates and a ticking cooldown countdown;
// signed in with the admin token (given through FLEETPACE_ADMIN_TOKEN),
// clicking pause on a platform stops its requests at the destination and
// the page shows it paused; resume shows it running and its requests
// reach the destination again.
func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: drives a real browser through every page")
	}
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.PoolOf(t, url)
	dest, err := fakedest.New(fakedest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dest.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dest.Close() })
	// gamma's destination says stop for 10 minutes: it cools down.
	if err := dest.SetRule("/gamma/", fakedest.Blocked(10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []sources.Platform{{Name: "alpha", RatePerSec: 4}, {Name: "beta", RatePerSec: 4}, {Name: "gamma", RatePerSec: 2}} {
		storetest.Platform(t, pool, p)
		var csv strings.Builder
		csv.WriteString("platform,url,interval\n")
		for i := range 30 {
			fmt.Fprintf(&csv, "%s,%s/%s/%d,5s\n", p.Name, dest.URL(), p.Name, i)
		}
		if _, err := sourcefile.Import(ctx, pool, strings.NewReader(csv.String()), sourcefile.Options{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Setenv("FLEETPACE_NO_SCAN", "true") // stripped from the workers' environment, or nothing would be fetched
	dir := t.TempDir()
	fl, err := workers.Start(workers.Config{
		Executable: binary, N: 2, Dir: dir,
		Args: []string{"worker", "--database-url", url, "-q", "--allow-private-networks", "--http-addr", "127.0.0.1:0",
			"--startup-jitter", "0", "--poll-base", "300ms", "--poll-max", "1s", "--heartbeat", "1s",
			"--max-pacer-wait", "2s", "--soft-stop", "2s"},
		Env: []string{"FLEETPACE_ADMIN_TOKEN=" + token},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := fl.Stop(context.Background()); err != nil {
			t.Errorf("workers: %v", err)
		}
	})
	addr, err := fl.Listening(0, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr

	b := browser.New(t, 1400, 900)
	step := func(what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(b, timeout)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("%s: %v\nworker log:\n%s", what, err, workers.Tail(fl.Logs()[0], 20))
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(b, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.Join(strings.Fields(s), " ")
	}
	// waitText polls the page (which refreshes itself) until sel's text
	// satisfies ok.
	waitText := func(sel string, ok func(string) bool, timeout time.Duration) string {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for {
			sctx, cancel := context.WithTimeout(b, 2*time.Second)
			s, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
			cancel()
			s = strings.Join(strings.Fields(s), " ")
			if err == nil && ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: text %q (%v) never as expected within %s", sel, s, err, timeout)
			}
			time.Sleep(100 * time.Millisecond) // polling the page, not deciding anything
		}
	}

	step("load the overview", 20*time.Second, chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-platform="alpha"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-platform="beta"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-platform="gamma"]`)))
	if got := text(`tr[data-platform="alpha"] .effective`); got != "4/s" {
		t.Errorf("alpha's effective rate shows %q, want 4/s", got)
	}
	if got := text(`tr[data-platform="gamma"] td:nth-child(2)`); got != "2/s burst 1" {
		t.Errorf("gamma's ceiling shows %q", got)
	}
	// gamma cools down once its destination has said stop; the page shows
	// it on its own (live refresh), and the script ticks the countdown.
	// The fleet-wide Retry-After hold comes first (the pacer's report), the
	// cooldown when the check is recorded: the page may show the hold
	// meanwhile. A countdown reads like 16m01s, or 16m on the minute.
	waitText(`tr[data-platform="gamma"] .state`, func(s string) bool {
		return strings.HasPrefix(s, "cooling down: Retry-After 10m,") && strings.Contains(s, "429")
	}, 45*time.Second)
	countdown := regexp.MustCompile(`^\d+m(\d\ds)?$`)
	first := waitText(`tr[data-platform="gamma"] .countdown`, countdown.MatchString, 5*time.Second)
	next := waitText(`tr[data-platform="gamma"] .countdown`, func(s string) bool { return s != first }, 5*time.Second)
	if !countdown.MatchString(next) {
		t.Errorf("the cooldown countdown went from %s to %q", first, next)
	}
	waitArrivals(t, dest, "/beta/", 4, 30*time.Second)

	// Sign in with the token, once.
	step("sign in", 15*time.Second,
		chromedp.Click(chromedp.CSS(`header a.signin`)),
		chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token),
		chromedp.Submit(chromedp.CSS(`form.login`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-platform="beta"] button.pause`)))

	// Pause beta: no request for it reaches the destination from 1 s after
	// the page said so, while alpha keeps its rate.
	step("pause beta", 15*time.Second,
		chromedp.Click(chromedp.CSS(`tr[data-platform="beta"] button.pause`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-platform="beta"] .state.paused`)))
	pausedAt := time.Now()
	if got := text(`tr[data-platform="beta"] .state`); !strings.HasPrefix(got, "paused by operator until resumed") || !strings.Contains(got, "paused from the dashboard") {
		t.Errorf("beta's state shows %q", got)
	}
	if got := text(`tr[data-platform="beta"] .effective`); got != "0/s" {
		t.Errorf("beta's effective rate shows %q while paused", got)
	}
	if got := text(`.notice`); !strings.HasPrefix(got, "Paused") {
		t.Errorf("no notice of the pause: %q", got)
	}
	alphaThen := dest.Count("/alpha/")
	// ≥ 4 s at 4/s, and enough history for the screenshot's sparklines.
	waitArrivals(t, dest, "/alpha/", max(alphaThen+16, 60), 40*time.Second)
	var late []time.Time
	for _, at := range dest.Arrivals("/beta/") {
		if at.After(pausedAt.Add(time.Second)) {
			late = append(late, at)
		}
	}
	if len(late) > 0 {
		t.Errorf("beta received %d request(s) more than 1 s after it was paused, the first %s after", len(late), late[0].Sub(pausedAt))
	}
	t.Logf("paused beta: no request to it in the %s after; alpha received %d meanwhile",
		time.Since(pausedAt.Add(time.Second)).Round(time.Millisecond), dest.Count("/alpha/")-alphaThen)

	step("reload the overview", 15*time.Second, chromedp.Navigate(base+"/?done=paused"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-platform="beta"] .state.paused`)))
	shot, err := chromedp.Run(b, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	saveScreenshot(t, shot)

	// Resume: its waiting jobs are woken, and beta is fetched again.
	betaThen := dest.Count("/beta/")
	step("resume beta", 15*time.Second,
		chromedp.Click(chromedp.CSS(`tr[data-platform="beta"] button.resume`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-platform="beta"] .state.running`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-platform="beta"] button.pause`)))
	resumedAt := time.Now()
	if got := text(`tr[data-platform="beta"] .effective`); got != "4/s" {
		t.Errorf("beta's effective rate shows %q after resuming", got)
	}
	waitArrivals(t, dest, "/beta/", betaThen+4, 15*time.Second)
	t.Logf("resumed beta: 4 requests to it within %s", time.Since(resumedAt).Round(time.Millisecond))

	// Reset gamma's pace: its cooldown ends and it is asked again at once
	// (its destination still says stop: it cools down anew, its state says
	// so with the rule).
	gammaThen := dest.Count("/gamma/")
	// The resume's notice is still on the page until the reset's answer
	// replaces it: wait for the reset's own.
	step("reset gamma", 15*time.Second,
		chromedp.Click(chromedp.CSS(`tr[data-platform="gamma"] button.reset`)))
	waitText(`.notice`, func(s string) bool { return strings.HasPrefix(s, "Reset:") }, 15*time.Second)
	waitArrivals(t, dest, "/gamma/", gammaThen+1, 15*time.Second)
	if got := waitText(`tr[data-platform="gamma"] .state`, func(s string) bool { return strings.HasPrefix(s, "cooling down:") }, 15*time.Second); !strings.Contains(got, "→") {
		t.Errorf("gamma's state after the reset and a new 429: %q, want the cooldown's rule", got)
	}
}

// waitArrivals waits until the destination has received n requests under
// prefix.
func waitArrivals(t *testing.T, d *fakedest.Server, prefix string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for d.Count(prefix) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s received %d requests in %s, want %d", prefix, d.Count(prefix), timeout, n)
		}
		time.Sleep(20 * time.Millisecond) // polling a counter, not deciding anything
	}
}

func saveScreenshot(t *testing.T, png []byte) {
	t.Helper()
	paths := []string{filepath.Join(t.TempDir(), "overview.png")}
	if *screenshot != "" {
		paths = append(paths, *screenshot)
	}
	for _, p := range paths {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot of the overview: %s", p)
	}
}
