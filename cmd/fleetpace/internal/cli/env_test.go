package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// envCommands are the commands whose own flags have FLEETPACE_ variables
// (the README's configuration reference says so); every other command has
// only the global flags' variables.
var envCommands = []string{"worker", "drain", "scan", "dashboard"}

// cleanEnv is this process's environment without DATABASE_URL and any
// FLEETPACE_ variable, plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "FLEETPACE_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// noCluster is a --data-dir under a regular file: a command that falls back
// to the embedded cluster (because a variable was not read) fails at once
// instead of starting a cluster.
func noCluster(t *testing.T) []string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--data-dir", filepath.Join(f, "no-cluster")}
}

// envCommand is the fleetpace binary with args and the variables of env (on
// top of cleanEnv); it dies with the test process.
func envCommand(ctx context.Context, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = cleanEnv(env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// runEnv runs envCommand to its end.
func runEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := envCommand(ctx, env, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); cmd.ProcessState == nil {
		t.Fatalf("run %v: %v", args, err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.String(), stderr: stderr.String()}
}

// TestEnvBadValue: a bad value in the environment exits 2 naming the
// variable and the value (a database URL's password redacted) before
// anything is done; a flag given on the command line is not read from the
// environment at all.
func TestEnvBadValue(t *testing.T) {
	t.Parallel()
	const badURL = "postgres://fleet:hunter2@db.example:notaport/fleetpace"
	tests := []struct {
		env  string
		args []string
		want []string // in stderr
	}{
		// Rejected by the flag's own parser.
		{"FLEETPACE_CONCURRENCY=ten", []string{"worker"}, []string{`FLEETPACE_CONCURRENCY="ten"`, "--concurrency"}},
		{"FLEETPACE_NO_SCAN=yes", []string{"worker"}, []string{`FLEETPACE_NO_SCAN="yes"`, "--no-scan"}},
		{"FLEETPACE_SOFT_STOP=10", []string{"worker"}, []string{`FLEETPACE_SOFT_STOP="10"`, "--soft-stop"}},
		{"FLEETPACE_MAX_DURATION=forever", []string{"drain"}, []string{`FLEETPACE_MAX_DURATION="forever"`}},
		{"FLEETPACE_LIMIT=many", []string{"scan"}, []string{`FLEETPACE_LIMIT="many"`}},
		{"FLEETPACE_CONNECT_TIMEOUT=soon", []string{"platforms", "list"}, []string{`FLEETPACE_CONNECT_TIMEOUT="soon"`}},
		// Rejected by the checks that run later, which name the flag.
		{"FLEETPACE_CONCURRENCY=0", []string{"worker"}, []string{"--concurrency", `FLEETPACE_CONCURRENCY="0"`}},
		{"FLEETPACE_LIMIT=0", []string{"scan"}, []string{"--limit", `FLEETPACE_LIMIT="0"`}},
		{"FLEETPACE_LOG_LEVEL=loud", []string{"platforms", "list"}, []string{"--log-level", `FLEETPACE_LOG_LEVEL="loud"`}},
		{"FLEETPACE_LOG_FORMAT=xml", []string{"status"}, []string{"--log-format", `FLEETPACE_LOG_FORMAT="xml"`}},
		{"DATABASE_URL=" + badURL, []string{"status"}, []string{"set by DATABASE_URL", "invalid port"}},
		{"FLEETPACE_DATABASE_URL=" + badURL, []string{"worker"}, []string{"set by FLEETPACE_DATABASE_URL", "invalid port"}},
	}
	guard := noCluster(t)
	for _, tt := range tests {
		r := runEnv(t, []string{tt.env}, append(tt.args, guard...)...)
		if r.code != 2 {
			t.Errorf("%s fleetpace %v: want exit 2: %s", tt.env, tt.args, r)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s fleetpace %v: stderr does not name %q: %s", tt.env, tt.args, w, r)
			}
		}
		if strings.Contains(r.stdout+r.stderr, "hunter2") {
			t.Errorf("%s: password printed: %s", tt.env, r)
		}
	}

	// The command line wins: the variable is not even read.
	r := runEnv(t, []string{"FLEETPACE_CONCURRENCY=ten"}, append(guard, "worker", "--concurrency", "0")...)
	if r.code != 2 || !strings.Contains(r.stderr, "--concurrency: must") || strings.Contains(r.stderr, "FLEETPACE_") {
		t.Errorf("flag and variable: want the flag's error only: %s", r)
	}
	// Per-invocation commands read no variable of their own flags.
	r = runEnv(t, []string{"FLEETPACE_JSON=maybe", "FLEETPACE_RATE=oops"}, "--database-url", "postgres://nobody@127.0.0.1:1/x", "schema", "print")
	if r.code != 0 {
		t.Errorf("unrelated FLEETPACE_ variables broke a command: %s", r)
	}
}

// TestEnvDatabaseURL: FLEETPACE_DATABASE_URL and DATABASE_URL both work;
// flag > FLEETPACE_DATABASE_URL > DATABASE_URL.
func TestEnvDatabaseURL(t *testing.T) {
	t.Parallel()
	good := testdb.URL(t)
	const down = "postgres://nobody@127.0.0.1:1/down?sslmode=disable" // nothing listens on port 1
	tests := []struct {
		name string
		env  []string
		args []string
		code int
	}{
		{"DATABASE_URL alone", []string{"DATABASE_URL=" + good}, nil, 0},
		{"FLEETPACE_DATABASE_URL alone", []string{"FLEETPACE_DATABASE_URL=" + good}, nil, 0},
		{"FLEETPACE_DATABASE_URL beats DATABASE_URL", []string{"FLEETPACE_DATABASE_URL=" + good, "DATABASE_URL=" + down}, nil, 0},
		{"FLEETPACE_DATABASE_URL beats DATABASE_URL (down)", []string{"FLEETPACE_DATABASE_URL=" + down, "DATABASE_URL=" + good}, nil, 1},
		{"flag beats both", []string{"FLEETPACE_DATABASE_URL=" + down, "DATABASE_URL=" + down}, []string{"--database-url", good}, 0},
	}
	for _, tt := range tests {
		r := runEnv(t, tt.env, append(tt.args, append(noCluster(t), "--connect-timeout", "1s", "platforms", "list")...)...)
		if r.code != tt.code {
			t.Errorf("%s: want exit %d: %s", tt.name, tt.code, r)
		}
	}
	// The data directory too: a forgotten --data-dir no longer means a second cluster.
	dir := t.TempDir() + "/from-env"
	if r := runEnv(t, []string{"FLEETPACE_DATA_DIR=" + dir}, "embedded", "status"); r.code != 0 || !strings.Contains(r.stdout, dir) {
		t.Errorf("FLEETPACE_DATA_DIR: %s", r)
	}
}

// TestEnvWorker starts a real worker configured from the environment, as a
// container would be, and checks that the variables apply and that a flag
// beats its variable: the HTTP server answers on the flag's address, not on
// FLEETPACE_HTTP_ADDR's.
func TestEnvWorker(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	envAddr, flagAddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := envCommand(ctx, []string{
		"FLEETPACE_DATABASE_URL=" + url,
		"FLEETPACE_HTTP_ADDR=" + envAddr,
		"FLEETPACE_CONCURRENCY=3",
		"FLEETPACE_LOG_FORMAT=json",
		"FLEETPACE_STARTUP_JITTER=0",
		"FLEETPACE_NO_SCAN=true",
		"FLEETPACE_SOFT_STOP=1s",
	}, append(noCluster(t), "worker", "--http-addr", flagAddr)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	// The worker logs in JSON (FLEETPACE_LOG_FORMAT) that it started with
	// concurrency 3 (FLEETPACE_CONCURRENCY) and without a startup jitter
	// sleep (FLEETPACE_STARTUP_JITTER=0).
	type logLine struct {
		Msg         string `json:"msg"`
		Concurrency int    `json:"concurrency"`
	}
	started := make(chan logLine, 1)
	var logged bytes.Buffer // read once stderr is done
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logged.WriteString(sc.Text() + "\n")
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) == nil && (l.Msg == "startup jitter" || l.Msg == "worker started") {
				select {
				case started <- l:
				default:
				}
			}
		}
	}()
	select {
	case l := <-started:
		if l.Msg != "worker started" || l.Concurrency != 3 {
			t.Fatalf("first JSON line %+v, want worker started with concurrency 3", l)
		}
	case <-stderrDone:
		t.Fatalf("worker exited before starting:\n%s", logged.String())
	case <-ctx.Done():
		t.Fatalf("worker did not start")
	}

	resp, err := http.Get("http://" + flagAddr + "/healthz")
	if err != nil {
		t.Fatalf("--http-addr %s: %v", flagAddr, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz on --http-addr: %s", resp.Status)
	}
	if c, err := net.DialTimeout("tcp", envAddr, time.Second); err == nil {
		c.Close()
		t.Fatalf("something listens on FLEETPACE_HTTP_ADDR %s although --http-addr was given", envAddr)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-stderrDone
	if err := cmd.Wait(); err != nil {
		t.Fatalf("worker exit: %v\n%s", err, logged.String())
	}
}

// freeAddr returns an address on 127.0.0.1 that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(testdb.FreePort(t)))
}

// TestEnvHelpNamesVariables walks every command's --help: each global flag
// and each flag of the service commands names its variable, and no flag of
// another command does.
func TestEnvHelpNamesVariables(t *testing.T) {
	t.Parallel()
	flagName := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)`)
	// sections returns the flag lines of a help text by section title.
	sections := func(help string) map[string][]string {
		out := map[string][]string{}
		section := ""
		for _, line := range strings.Split(help, "\n") {
			switch {
			case line == "":
				section = ""
			case !strings.HasPrefix(line, " "):
				section = strings.TrimSuffix(line, ":")
			case section != "":
				out[section] = append(out[section], line)
			}
		}
		return out
	}
	wantVar := func(flag string) string {
		v := "FLEETPACE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
		if flag == "database-url" {
			v += " or DATABASE_URL"
		}
		return "[env " + v + "]"
	}
	globals := map[string]bool{}
	checked := 0
	var walk func(path []string)
	walk = func(path []string) {
		r := runEnv(t, nil, append(path, "--help")...)
		if r.code != 0 {
			t.Fatalf("fleetpace %v --help: %s", path, r)
		}
		for _, hidden := range []string{"test-guard-exempt", "bench-local-pacer"} {
			if strings.Contains(r.stdout, hidden) {
				t.Errorf("fleetpace %v --help shows the hidden --%s", path, hidden)
			}
		}
		s := sections(r.stdout)
		service := len(path) == 0 || slices.Contains(envCommands, strings.Join(path, " "))
		check := func(line string, want bool) {
			m := flagName.FindStringSubmatch(line)
			if m == nil || m[1] == "help" || m[1] == "version" {
				return
			}
			checked++
			has := strings.Contains(line, "[env ")
			switch {
			case want && !strings.Contains(line, wantVar(m[1])):
				t.Errorf("fleetpace %v --help: --%s does not name %s: %q", path, m[1], wantVar(m[1]), line)
			case !want && has:
				t.Errorf("fleetpace %v --help: --%s of a per-invocation command names a variable: %q", path, m[1], line)
			}
			if len(path) == 0 {
				globals[m[1]] = true
			}
		}
		for _, line := range s["Flags"] {
			check(line, service)
		}
		for _, line := range s["Global Flags"] {
			m := flagName.FindStringSubmatch(line)
			check(line, m != nil && globals[m[1]])
		}
		for _, line := range s["Available Commands"] {
			name := strings.Fields(line)[0]
			if name != "help" && name != "completion" {
				walk(append(slices.Clip(path), name))
			}
		}
	}
	walk(nil)
	for _, g := range []string{"database-url", "data-dir", "log-level", "log-format", "connect-timeout", "quiet"} {
		if !globals[g] {
			t.Errorf("global flag --%s not found in fleetpace --help", g)
		}
	}
	if checked < 60 {
		t.Fatalf("only %d flag lines checked: help format changed?", checked)
	}
	t.Logf("%d flag lines checked", checked)
}
