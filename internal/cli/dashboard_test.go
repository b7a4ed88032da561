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
	if code, _ := get("/riverui/"); code != 200 {
		t.Errorf("GET /riverui/: %d", code)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := client.PostForm(base+"/login", url.Values{"token": {"s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusSeeOther || len(res.Cookies()) != 1 {
		t.Errorf("sign-in with FLEETPACE_ADMIN_TOKEN: %d, cookies %v", res.StatusCode, res.Cookies())
	}
	if strings.Contains(stderr(), "beyond loopback") {
		t.Errorf("a warning on loopback:\n%s", stderr())
	}
}

// Listening beyond loopback without a token warns, naming the risk; with a
// token it does not. A bad address exits 2.
func TestDashboardExposureWarning(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	_, stderr := startDashboard(t, nil, "--database-url", dbURL, "dashboard", "--http-addr", "0.0.0.0:0")
	if !regexp.MustCompile(`beyond loopback, without an admin token: anyone who can reach it sees every platform, source URL`).MatchString(stderr()) {
		t.Errorf("no warning when listening on 0.0.0.0 without a token:\n%s", stderr())
	}
	_, stderr2 := startDashboard(t, nil, "--database-url", dbURL, "dashboard", "--http-addr", "0.0.0.0:0", "--admin-token", "x")
	if strings.Contains(stderr2(), "beyond loopback") {
		t.Errorf("a warning although a token is set:\n%s", stderr2())
	}
	if r := run(t, "", "--database-url", dbURL, "dashboard", "--http-addr", "nonsense"); r.code != 2 || !strings.Contains(r.stderr, "--http-addr") {
		t.Errorf("bad --http-addr: %s", r)
	}
}
