package cli_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// startDashboard starts `fleetpace dashboard` with env and args, and returns
// the address it announces and its stderr so far; it is stopped with
// SIGTERM when the test ends and must exit 0.
func startDashboard(t *testing.T, env []string, args ...string) (addr string, stderr func() string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := envCommand(ctx, env, args...)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		log   strings.Builder
		found = make(chan string, 1)
		done  = make(chan struct{})
	)
	logged := func() string {
		mu.Lock()
		defer mu.Unlock()
		return log.String()
	}
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pipe)
		re := regexp.MustCompile(`dashboard at http://(\S+)/`)
		for sc.Scan() {
			mu.Lock()
			log.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		if err := cmd.Wait(); err != nil {
			t.Errorf("dashboard exit after SIGTERM: %v\n%s", err, logged())
		}
		cancel()
	})
	select {
	case addr = <-found:
	case <-done:
		t.Fatalf("dashboard exited:\n%s", logged())
	case <-ctx.Done():
		t.Fatalf("dashboard never said where it listens:\n%s", logged())
	}
	return addr, logged
}

// `fleetpace dashboard` serves the dashboard and River UI without a
// worker; FLEETPACE_ADMIN_TOKEN turns its actions on; on loopback it warns
// of nothing.
func TestDashboardCommand(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	if r := run(t, "", "-q", "--database-url", dbURL, "platforms", "set", "feeds", "--rate", "7"); r.code != 0 {
		t.Fatal(r)
	}
	addr, stderr := startDashboard(t, []string{"FLEETPACE_ADMIN_TOKEN=s3cret", "FLEETPACE_DATABASE_URL=" + dbURL},
		append(noCluster(t), "dashboard", "--http-addr", "127.0.0.1:0")...)
	base := "http://" + addr
	get := func(path string) (int, string) {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, page := get("/"); code != 200 || !strings.Contains(page, `data-platform="feeds"`) || !strings.Contains(page, "Sign in to act") {
		t.Errorf("GET /: %d\n%s", code, page)
	}
	// With a token River UI is behind the sign-in: its pages send a browser
	// to sign in, its API answers 401.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	status := func(req *http.Request) (int, string) {
		t.Helper()
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode, res.Header.Get("Location")
	}
	req, _ := http.NewRequest(http.MethodGet, base+"/riverui/", nil)
	if code, loc := status(req); code != http.StatusSeeOther || loc != "/login?back=%2Friverui%2F" {
		t.Errorf("GET /riverui/ without signing in: %d to %q, want 303 to the sign-in", code, loc)
	}
	req, _ = http.NewRequest(http.MethodGet, base+"/riverui/api/jobs?state=completed", nil)
	if code, _ := status(req); code != http.StatusUnauthorized {
		t.Errorf("River UI's API without signing in: %d, want 401", code)
	}
	res, err := client.PostForm(base+"/login", url.Values{"token": {"s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther || len(res.Cookies()) != 1 {
		t.Fatalf("sign-in with FLEETPACE_ADMIN_TOKEN: %d, cookies %v", res.StatusCode, res.Cookies())
	}
	for _, path := range []string{"/riverui/", "/riverui/api/jobs?state=completed"} {
		req, _ = http.NewRequest(http.MethodGet, base+path, nil)
		req.AddCookie(res.Cookies()[0])
		if code, _ := status(req); code != http.StatusOK {
			t.Errorf("GET %s signed in: %d, want 200", path, code)
		}
	}
	if strings.Contains(stderr(), "beyond loopback") {
		t.Errorf("a warning on loopback:\n%s", stderr())
	}
}

// Listening beyond loopback without a token warns, naming the risk; with a
// token it does not, and every page needs sign-in. A bad address exits 2.
func TestDashboardExposureWarning(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	addr, stderr := startDashboard(t, nil, "--database-url", dbURL, "dashboard", "--http-addr", "0.0.0.0:0")
	if !regexp.MustCompile(`beyond loopback, without an admin token: anyone who can reach it sees every platform, source URL`).MatchString(stderr()) {
		t.Errorf("no warning when listening on 0.0.0.0 without a token:\n%s", stderr())
	}
	// Without a token River UI is open, as the warning says.
	if res, err := http.Get("http://" + addr + "/riverui/"); err != nil || res.StatusCode != http.StatusOK {
		t.Errorf("GET /riverui/ without a token: %v %v, want 200", res, err)
	} else {
		res.Body.Close()
	}
	// With a token, no warning: the start says what needs sign-in (every
	// page) and what stays public.
	addr2, stderr2 := startDashboard(t, nil, "--database-url", dbURL, "dashboard", "--http-addr", "0.0.0.0:0",
		"--admin-token", "a token of at least thirty-two bytes")
	if regexp.MustCompile(`level=WARN.*beyond loopback`).MatchString(stderr2()) || !strings.Contains(stderr2(), "every page and River UI need sign-in") {
		t.Errorf("listening on 0.0.0.0 with a token: a warning, or no word of the sign-in:\n%s", stderr2())
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if res, err := client.Get("http://" + addr2 + "/"); err != nil || res.StatusCode != http.StatusSeeOther {
		t.Errorf("GET / beyond loopback with a token, not signed in: %v %v, want 303 to sign in", res, err)
	} else {
		res.Body.Close()
	}
	if r := run(t, "", "--database-url", dbURL, "dashboard", "--http-addr", "nonsense"); r.code != 2 || !strings.Contains(r.stderr, "--http-addr") {
		t.Errorf("bad --http-addr: %s", r)
	}
}
