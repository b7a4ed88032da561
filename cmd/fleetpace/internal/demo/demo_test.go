package demo_test

import (
	"bufio"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/browser"
	"github.com/fleetpace/fleetpace/internal/syncbuf"
	"github.com/fleetpace/fleetpace/internal/testbin"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

// binary is the fleetpace command built for these tests.
var binary string

func TestMain(m *testing.M) { testbin.Main(m, &binary) }

// setup returns a directory for the demo's --tmp-dir and --chart, searchable
// by the postgres user (the embedded cluster runs as it when we are root).
func setup(t *testing.T) string {
	t.Helper()
	return testdb.SearchableDir(t, "fleetpace-demo-test-")
}

func demoCmd(dir string, args ...string) (*exec.Cmd, *syncbuf.Buffer) {
	all := append([]string{"demo", "--tmp-dir", dir, "--chart", filepath.Join(dir, "chart.svg")}, args...)
	cmd := exec.Command(binary, all...)
	cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://nobody@127.0.0.1:1/ignored")
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	return cmd, out
}

// assertNothingLeft fails if a process still mentions dir on its command
// line (the cluster's postgres runs on dir/…/pg, the workers get
// --data-dir dir/…/pg) or if the demo's temporary directory still exists.
func assertNothingLeft(t *testing.T, dir string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmdline := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmdline, dir) {
			t.Errorf("process left running: %s: %s", filepath.Dir(p), cmdline)
		}
	}
	left, _ := filepath.Glob(filepath.Join(dir, "fleetpace-demo-*"))
	if len(left) > 0 {
		t.Errorf("temporary directories left behind: %v", left)
	}
	// pgembed's own temporary clusters are not used by the demo; nothing
	// else may appear in dir but the chart.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != "chart.svg" {
			t.Errorf("unexpected file left in the demo's --tmp-dir: %s", e.Name())
		}
	}
}

// parallelDemo skips a test that runs the demo under -short (real worker
// processes for seconds), runs it beside the other one, and returns the
// directory setup made for it.
func parallelDemo(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: runs the demo: real worker processes for seconds")
	}
	t.Parallel()
	return setup(t)
}

// TestDemo runs the demo as a newcomer would, briefly: it exits 0 (no
// ceiling exceeded), shows every platform's effect, writes a valid SVG chart
// and leaves no process or temporary directory behind.
func TestDemo(t *testing.T) {
	dir := parallelDemo(t)
	cmd, out := demoCmd(dir, "--duration", "15s", "--workers", "2")
	err := cmd.Run()
	t.Logf("output:\n%s", out)
	if err != nil {
		t.Fatalf("demo failed: %v", err)
	}
	text := out.String()
	for _, want := range []string{"demo: OK", "steady", "throttled", "cooldown", "chart: "} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// Progress is printed as plain lines when stdout is not a terminal.
	if !strings.Contains(text, "req/s (ceiling 20/s)") || strings.Contains(text, "\x1b[") {
		t.Errorf("expected plain progress lines without ANSI escapes")
	}
	// The throttled platform's 429s and the cooldown platform's cooldown show
	// in the summary table; the burst is printed.
	rows := 0
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) != 14 {
			continue
		}
		switch f[0] {
		case "steady":
			rows++
			if f[1] != "20/s" || f[2] != "1" || f[3] != "21" {
				t.Errorf("steady: ceiling, burst, limit = %q; want 20/s, 1, 21", f[1:4])
			}
		case "throttled":
			rows++
			if f[7] == "0" || f[10] == "×1" {
				t.Errorf("throttled platform shows no shared backoff: %q", line)
			}
		case "cooldown":
			rows++
			if f[11] == "no" {
				t.Errorf("cooldown platform never cooled down: %q", line)
			}
		}
	}
	if rows != 3 {
		t.Errorf("the summary table has %d platform rows, want 3", rows)
	}
	// It explains itself: a line per platform, the limit and checked columns.
	for _, want := range []string{"steady:    the destination accepts everything", "throttled: the destination allows only 5/s",
		"cooldown:  at +", "limit in 1 s = ceiling + burst", "checked = sources fetched at least once"} {
		if !strings.Contains(text, want) {
			t.Errorf("the summary lacks %q", want)
		}
	}

	chart := filepath.Join(dir, "chart.svg")
	if !strings.Contains(text, "chart: "+chart) {
		t.Errorf("chart path %s not printed", chart)
	}
	assertSVG(t, chart)
	assertNothingLeft(t, dir)

	// In a browser: nothing overlaps, no line crosses a label, whole-number
	// ticks, the verdict in the title, the ceilings and the destination's
	// limit labelled.
	c, err := browser.ReadChart(browser.New(t, 1000, 1200), "file://"+chart)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range c.Problems {
		t.Errorf("chart: %s", p)
	}
	all := strings.Join(c.Texts, "\n")
	if len(c.Texts) == 0 || !strings.Contains(c.Texts[0], "OK, no platform above its ceiling + burst") {
		t.Errorf("the chart's title is not the verdict: %q", c.Texts[:min(1, len(c.Texts))])
	}
	for _, want := range []string{"ceiling 20/s (+ burst 1: at most 21 in any 1 s)", "ceiling 12/s", "ceiling 8/s",
		"the destination's own limit, 5/s", "the fleet cooling the platform down", "seconds since the workers started"} {
		if !strings.Contains(all, want) {
			t.Errorf("the chart lacks the label %q:\n%s", want, all)
		}
	}
}

// The chart check fails a chart with both faults it looks for: legend
// entries on top of each other, ticks "0.00" and "25.00".
func TestChartCheckFailsABadChart(t *testing.T) {
	old, err := filepath.Abs("testdata/chart-overlapping-legend.svg")
	if err != nil {
		t.Fatal(err)
	}
	c, err := browser.ReadChart(browser.New(t, 1000, 800), "file://"+old)
	if err != nil {
		t.Fatal(err)
	}
	var overlap, ticks bool
	for _, p := range c.Problems {
		overlap = overlap || strings.HasPrefix(p, "texts overlap")
		ticks = ticks || strings.Contains(p, "is not a whole number")
	}
	if !overlap || !ticks {
		t.Fatalf("the bad chart passes the check: %q", c.Problems)
	}
	t.Logf("the bad chart's problems: %q", c.Problems)
}

func assertSVG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("chart: %v", err)
	}
	defer f.Close()
	dec := xml.NewDecoder(bufio.NewReader(f))
	root := ""
	elements := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			elements++
		}
	}
	if root != "svg" || elements < 20 {
		t.Fatalf("chart: root element %q with %d elements; want an svg drawing", root, elements)
	}
}

// TestDemoInterrupt sends SIGINT to a running demo: it exits promptly with a
// failure code and stops and removes everything it started.
func TestDemoInterrupt(t *testing.T) {
	dir := parallelDemo(t)
	cmd, out := demoCmd(dir, "--duration", "60s", "--workers", "2")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// Wait for the workers to run (the first progress lines), then Ctrl-C.
	deadline := time.Now().Add(45 * time.Second)
	for !strings.Contains(out.String(), "req/s") {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("demo never showed progress:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	sent := time.Now()
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("exit after SIGINT: %v; want exit code 1", err)
		}
		t.Logf("exited %s after SIGINT", time.Since(sent).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("demo still running 30 s after SIGINT:\n%s", out)
	}
	t.Logf("output:\n%s", out)
	if !strings.Contains(out.String(), "interrupted") {
		t.Errorf("output does not say the demo was interrupted")
	}
	assertNothingLeft(t, dir)
}
