// Package browser starts a real browser for the tests that check a page or
// a chart as a user sees it: Debian's Chromium (package chromium), headless,
// with a fresh profile, driven over the DevTools protocol by chromedp. A
// browser that downloads itself cannot work here; `.ci/run` installs
// chromium when it is missing.
package browser

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"
)

// Candidates are the executables tried, in order, after $CHROMIUM.
var Candidates = []string{"chromium", "chromium-browser", "google-chrome"}

// ErrNotFound is returned by Path when no Chromium is installed.
var ErrNotFound = errors.New("browser: chromium not found (Debian: apt-get install chromium; or set CHROMIUM to its path)")

// Path returns the Chromium executable: $CHROMIUM if set, else the first of
// Candidates on PATH.
func Path() (string, error) {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p, nil
	}
	for _, c := range Candidates {
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	return "", ErrNotFound
}

// New starts a headless Chromium for the test (failing it if there is
// none) with a fresh profile in a temporary directory, and returns the
// context of its first tab. The browser is closed when the test ends.
//
// The flags are those Chromium needs as root in a container without a
// display, and those that keep it from talking to anything but the pages
// it is given.
func New(t testing.TB, width, height int) context.Context {
	t.Helper()
	path, err := Path()
	if err != nil {
		t.Fatal(err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("mute-audio", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("browser: start %s: %v", path, err)
	}
	return ctx
}
