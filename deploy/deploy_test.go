package deploy

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/testbin"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

const installedBinary = "/usr/local/bin/fleetpace"

// binary is fleetpace built for these tests: as deploy/build-image builds
// it, version testVersion; under -short, as the other packages' tests
// build it (a static build of every package is most of a fresh clone's
// short run, and only the image's tests, skipped there, need it).
var binary string

const (
	buildinfoPkg = "github.com/fleetpace/fleetpace/internal/buildinfo"
	testVersion  = "v0.0.0-deploytest"
)

// TestMain builds fleetpace as deploy/build-image builds it (static,
// -trimpath, stripped, version stamped), so the image test's run of that
// script finds every package compiled and only links.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		testbin.Main(testdb.M(m), &binary)
		return
	}
	testbin.MainWith(testdb.M(m), &binary, testbin.Options{
		Env:  []string{"CGO_ENABLED=0"},
		Args: []string{"-trimpath", "-ldflags", "-s -w -X " + buildinfoPkg + ".version=" + testVersion},
	})
}

// unit is a parsed systemd unit file: section → key → values (a key may
// repeat).
type unit map[string]map[string][]string

func (u unit) get(section, key string) string {
	vs := u[section][key]
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// parseUnit reads the INI dialect of systemd unit files: [Section] headers,
// Key=Value lines, # and ; comments, backslash continuation lines. Anything
// else is an error naming the line.
func parseUnit(path string) (unit, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	lineNo := 0
	var pending string
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if pending != "" {
			line = pending + " " + line
			pending = ""
		}
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			pending = strings.TrimSuffix(line, "\\")
			continue
		}
		if strings.HasPrefix(line, "[") {
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("%s:%d: bad section header %q", path, lineNo, line)
			}
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%s:%d: not a Key=Value line inside a section: %q", path, lineNo, line)
		}
		k = strings.TrimSpace(k)
		u[section][k] = append(u[section][k], strings.Join(strings.Fields(v), " "))
	}
	if pending != "" {
		return nil, fmt.Errorf("%s: continuation at end of file", path)
	}
	return u, sc.Err()
}

func setup(t *testing.T, name string) unit {
	t.Helper()
	u, err := parseUnit(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// hardening are the options every fleetpace service must carry.
var hardening = map[string]string{
	"NoNewPrivileges": "yes",
	"ProtectSystem":   "strict",
	"ProtectHome":     "yes",
	"PrivateTmp":      "yes",
}

func checkCommon(t *testing.T, u unit, subcommand string) {
	t.Helper()
	if u.get("Unit", "Description") == "" {
		t.Error("[Unit] Description is missing")
	}
	for k, want := range hardening {
		if got := u.get("Service", k); got != want {
			t.Errorf("[Service] %s = %q, want %q", k, got, want)
		}
	}
	if u.get("Service", "User") == "" && u.get("Service", "DynamicUser") != "yes" {
		t.Error("[Service] runs as root: set User= or DynamicUser=yes")
	}
	if u.get("Service", "EnvironmentFile") == "" {
		t.Error("[Service] EnvironmentFile (DATABASE_URL) is missing")
	}
	exec := u.get("Service", "ExecStart")
	if !strings.HasPrefix(exec, installedBinary+" "+subcommand) {
		t.Errorf("[Service] ExecStart = %q, want %s %s …", exec, installedBinary, subcommand)
	}
}

// execFlags returns the --flags of ExecStart and their values ("" for
// booleans).
func execFlags(exec string) map[string]string {
	out := map[string]string{}
	f := strings.Fields(exec)
	for i := 0; i < len(f); i++ {
		if !strings.HasPrefix(f[i], "-") {
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(f[i], "-"), "=")
		if !hasVal && i+1 < len(f) && !strings.HasPrefix(f[i+1], "-") {
			val = f[i+1]
			i++
		}
		out[name] = val
	}
	return out
}

// TestWorkerService checks the worker unit: SIGTERM with a stop timeout
// longer than the worker's soft stop plus its 10 s hard stop, restart on
// failure after a delay, hardening, and a writable store directory.
func TestWorkerService(t *testing.T) {
	u := setup(t, "fleetpace-worker.service")
	checkCommon(t, u, "worker")
	if got := u.get("Service", "KillSignal"); got != "" && got != "SIGTERM" {
		t.Errorf("KillSignal = %q, want SIGTERM (the worker's graceful stop)", got)
	}
	if got := u.get("Service", "Restart"); got != "on-failure" {
		t.Errorf("Restart = %q, want on-failure", got)
	}
	if d := mustDuration(t, u.get("Service", "RestartSec")); d < time.Second {
		t.Errorf("RestartSec = %s, want a delay of at least 1 s", d)
	}
	flags := execFlags(u.get("Service", "ExecStart"))
	soft := mustDuration(t, flagDefault(help(t, []string{"worker"}), "soft-stop"))
	if v, ok := flags["soft-stop"]; ok {
		soft = mustDuration(t, v)
	}
	stop := mustDuration(t, u.get("Service", "TimeoutStopSec"))
	if stop <= soft+hardStop {
		t.Errorf("TimeoutStopSec = %s must exceed --soft-stop %s plus the %s hard stop", stop, soft, hardStop)
	}
	if store, ok := flags["store-dir"]; ok {
		writable := false
		for _, p := range strings.Fields(strings.Join(u["Service"]["ReadWritePaths"], " ")) {
			p = strings.TrimPrefix(p, "-")
			if store == p || strings.HasPrefix(store, strings.TrimSuffix(p, "/")+"/") {
				writable = true
			}
		}
		if !writable {
			t.Errorf("--store-dir %s is not under any ReadWritePaths (ProtectSystem=strict makes it read-only)", store)
		}
	}
	if got := u.get("Install", "WantedBy"); got != "multi-user.target" {
		t.Errorf("[Install] WantedBy = %q, want multi-user.target", got)
	}
}

// TestScanUnits checks the scan service (oneshot) and its timer.
func TestScanUnits(t *testing.T) {
	s := setup(t, "fleetpace-scan.service")
	checkCommon(t, s, "scan")
	if got := s.get("Service", "Type"); got != "oneshot" {
		t.Errorf("scan service Type = %q, want oneshot", got)
	}
	tm := setup(t, "fleetpace-scan.timer")
	if tm.get("Timer", "OnUnitActiveSec") == "" && tm.get("Timer", "OnCalendar") == "" {
		t.Error("timer has neither OnUnitActiveSec nor OnCalendar")
	}
	if got := tm.get("Timer", "Unit"); got != "" && got != "fleetpace-scan.service" {
		t.Errorf("timer Unit = %q, want fleetpace-scan.service", got)
	}
	if got := tm.get("Install", "WantedBy"); got != "timers.target" {
		t.Errorf("timer [Install] WantedBy = %q, want timers.target", got)
	}
}

// TestExecStartFlagsExist runs `fleetpace <cmd> --help` and checks that every
// flag the units pass exists, so the units cannot drift from the CLI.
func TestExecStartFlagsExist(t *testing.T) {
	for _, name := range []string{"fleetpace-worker.service", "fleetpace-scan.service"} {
		u := setup(t, name)
		exec := u.get("Service", "ExecStart")
		f := strings.Fields(exec)
		if len(f) < 2 {
			t.Fatalf("%s: ExecStart %q", name, exec)
		}
		help, err := runHelp(f[1])
		if err != nil {
			t.Fatalf("%s: fleetpace %s --help: %v", name, f[1], err)
		}
		for flag := range execFlags(exec) {
			re := regexp.MustCompile(`(?m)(^|\s)--` + regexp.QuoteMeta(flag) + `\b`)
			if !re.MatchString(help) {
				t.Errorf("%s: fleetpace %s has no flag --%s", name, f[1], flag)
			}
		}
	}
}

func runHelp(sub string) (string, error) {
	out, err := exec.Command(binary, sub, "--help").CombinedOutput()
	return string(out), err
}

// TestSystemdAnalyzeVerify runs `systemd-analyze verify` on the units (with
// ExecStart pointing at a real fleetpace binary) and fails on any complaint,
// including the warnings it prints while still exiting 0 (unknown keys,
// unparsable values).
func TestSystemdAnalyzeVerify(t *testing.T) {
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	dir := t.TempDir()
	names := []string{"fleetpace-worker.service", "fleetpace-scan.service", "fleetpace-scan.timer"}
	var paths []string
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, n)
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), installedBinary, binary)), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	cmd := exec.Command(tool, append([]string{"verify", "--man=no"}, paths...)...)
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	if s == "" {
		t.Fatalf("missing duration")
	}
	// systemd accepts a bare number of seconds, and Go-style units.
	if regexp.MustCompile(`^\d+$`).MatchString(s) {
		s += "s"
	}
	s = strings.ReplaceAll(strings.ReplaceAll(s, "min", "m"), " ", "")
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %q: %v", s, err)
	}
	return d
}

// Every unit file a unit or the deploy README names is shipped here.
func TestNamedUnitsAreShipped(t *testing.T) {
	t.Parallel()
	named := regexp.MustCompile(`fleetpace-[a-z@-]+\.(service|timer)`)
	files, err := filepath.Glob("*")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, ".service") && !strings.HasSuffix(f, ".timer") && f != "README.md" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range named.FindAllString(string(b), -1) {
			if _, err := os.Stat(name); err != nil {
				t.Errorf("%s names %s, which deploy/ does not ship", f, name)
			}
		}
	}
}

// The deploy README and docs/scaling.md give the pacer's pool the same
// share of a worker's connections, the one worker.splitConns gives it.
func TestPacerPoolShareAgrees(t *testing.T) {
	t.Parallel()
	const share = "the pacer's pool (half of the rest, 1 to 4"
	for _, f := range []string{"README.md", "../docs/scaling.md"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(strings.Fields(string(b)), " "), share) {
			t.Errorf("%s does not say %q", f, share)
		}
	}
}
