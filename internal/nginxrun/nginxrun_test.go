package nginxrun

import (
	"context"
	"errors"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

// A real nginx: limit_req refuses with 429 beyond rate (+ burst), static
// files get nginx's ETag and a 304 for it, and the access log holds every
// request with its status.
func TestNginx(t *testing.T) {
	if _, err := Binary(); errors.Is(err, ErrNotInstalled) {
		t.Skip("nginx is not installed (apt-get install nginx; .ci/run installs it)")
	}
	dir := t.TempDir()
	s, err := Start(context.Background(), Config{Dir: dir, Locations: []Location{
		{Prefix: "/strict/", Rate: 2, Files: 1},
		{Prefix: "/burst/", Rate: 2, Burst: 3, Files: 1},
		{Prefix: "/free/", Files: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	get := func(path, etag string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, s.URL()+path, nil)
		if etag != "" {
			req.Header.Set("If-None-Match", etag)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("ETag")
	}
	// Six requests back to back, well inside one 500-ms spacing.
	count := map[string]map[int]int{}
	for _, p := range []string{"/strict/0", "/burst/0"} {
		count[p] = map[int]int{}
		for range 6 {
			code, _ := get(p, "")
			count[p][code]++
		}
	}
	if c := count["/strict/0"]; c[200] != 1 || c[429] != 5 {
		t.Errorf("rate 2/s without burst, 6 requests at once: %v, want 1 × 200 and 5 × 429", c)
	}
	if c := count["/burst/0"]; c[200] != 4 || c[429] != 2 {
		t.Errorf("rate 2/s with burst=3 nodelay, 6 requests at once: %v, want 4 × 200 and 2 × 429", c)
	}
	code, etag := get("/free/1", "")
	if code != 200 || etag == "" {
		t.Fatalf("static file: %d, ETag %q", code, etag)
	}
	if code, _ := get("/free/1", etag); code != http.StatusNotModified {
		t.Errorf("If-None-Match with its ETag: %d, want 304", code)
	}
	// nginx writes an access log line after the response went out: poll.
	var entries []Entry
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if entries, err = s.Entries(); err != nil {
			t.Fatal(err)
		}
		if len(entries) >= 14 || time.Now().After(deadline) {
			break
		}
	}
	byStatus := map[int]int{}
	for _, e := range entries {
		byStatus[e.Status]++
		if d := time.Since(e.Time); d < 0 || d > time.Minute {
			t.Errorf("entry %+v: time off by %s", e, d)
		}
	}
	if len(entries) != 14 || byStatus[200] != 6 || byStatus[429] != 7 || byStatus[304] != 1 || entries[len(entries)-1].URI != "/free/1" {
		t.Errorf("access log: %d entries %v (last %+v), want 14: 6 × 200, 7 × 429, 1 × 304", len(entries), byStatus, entries[len(entries)-1])
	}
	pid := s.cmd.Process.Pid
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("nginx (pid %d) still there after Stop: %v", pid, err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		{Dir: os.TempDir(), Locations: []Location{{Prefix: "a/"}}},
		{Dir: os.TempDir(), Locations: []Location{{Prefix: "/a;b/"}}},
		{Dir: os.TempDir(), Locations: []Location{{Prefix: "/a/"}, {Prefix: "/a/"}}},
		{Dir: os.TempDir(), Locations: []Location{{Prefix: "/a/", Burst: 2}}},
		{Dir: os.TempDir(), Locations: []Location{{Prefix: "/a/", Rate: -1}}},
	} {
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := parseLine("1796145412.78 200 /a/0"); err {
		t.Error("a cut $msec parsed")
	}
	if e, ok := parseLine("1796145412.787 429 /a/0"); !ok || e.Time.UnixMilli() != 1796145412787 || e.Status != 429 || e.URI != "/a/0" {
		t.Errorf("parsed %+v, %v", e, ok)
	}
}
