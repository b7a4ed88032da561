// Package testproc runs a test binary again as child processes, for the
// tests of properties that only processes show (a ceiling shared by a
// fleet, a hold one process tells the others about). A child runs until the
// parent closes its standard input, then prints one result line and exits;
// the parent reads each child's result back.
//
// In the parent:
//
//	g := testproc.Start(t, testproc.Config{Run: "TestChild", N: 3, Env: env})
//	// … wait for what the children do to show …
//	var results []childResult
//	g.Stop(t, func(i int, line []byte) error { return json.Unmarshal(line, &results[i]) })
//
// In the test binary, a test named by Config.Run that does nothing unless
// testproc.IsChild():
//
//	func TestChild(t *testing.T) {
//		if !testproc.IsChild() {
//			return
//		}
//		… run until <-testproc.Stopped() …
//		testproc.Exit(result)
//	}
package testproc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/syncbuf"
)

// childEnv marks a child process; its value is the child's index.
const childEnv = "FLEETPACE_TESTPROC_CHILD"

const resultPrefix = "TESTPROC-RESULT "

// Config configures a group of children.
type Config struct {
	// Run is the name of the test function the children run (passed as
	// -test.run=^Run$). Required.
	Run string
	// N is how many children. Default 1.
	N int
	// Env is added to every child's environment.
	Env map[string]string
	// Timeout bounds the children's whole life: they are killed after it.
	// Default 3 minutes.
	Timeout time.Duration
}

// Group is the running children.
type Group struct {
	procs  []*proc
	cancel context.CancelFunc
}

type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *syncbuf.Buffer
}

// Start starts the children; they are killed when the test ends if Stop was
// not called.
func Start(t testing.TB, cfg Config) *Group {
	t.Helper()
	if cfg.N == 0 {
		cfg.N = 1
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	g := &Group{cancel: cancel}
	t.Cleanup(g.kill)
	for i := range cfg.N {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+cfg.Run+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(i))
		for k, v := range cfg.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out := &syncbuf.Buffer{}
		cmd.Stdout = out
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		g.procs = append(g.procs, &proc{cmd: cmd, stdin: stdin, out: out})
	}
	return g
}

// Stop closes every child's standard input, waits for them to exit and
// passes each one's result line to read (i is the child's index). A child
// that fails, or prints no result, fails the test with its output.
func (g *Group) Stop(t testing.TB, read func(i int, result []byte) error) {
	t.Helper()
	for _, p := range g.procs {
		_ = p.stdin.Close()
	}
	for i, p := range g.procs {
		err := p.cmd.Wait()
		out := p.out.Bytes()
		if err != nil {
			t.Fatalf("child %d: %v\n%s", i, err, out)
		}
		line, ok := findResult(out)
		if !ok {
			t.Fatalf("child %d printed no result:\n%s", i, out)
		}
		if err := read(i, line); err != nil {
			t.Fatalf("child %d: result: %v\n%s", i, err, line)
		}
	}
	g.cancel()
}

func (g *Group) kill() {
	g.cancel()
	for _, p := range g.procs {
		_ = p.stdin.Close()
		_ = p.cmd.Wait()
	}
}

func findResult(out []byte) ([]byte, bool) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		if line, ok := bytes.CutPrefix(sc.Bytes(), []byte(resultPrefix)); ok {
			return append([]byte(nil), line...), true
		}
	}
	return nil, false
}

// IsChild reports whether this process is a child started by Start.
func IsChild() bool { return os.Getenv(childEnv) != "" }

// Index is this child's index in its group (0 in the parent).
func Index() int {
	i, _ := strconv.Atoi(os.Getenv(childEnv))
	return i
}

// Stopped is closed when the parent stops this child (its standard input
// closes).
func Stopped() <-chan struct{} {
	stopOnce.Do(func() {
		stopped = make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			close(stopped)
		}()
	})
	return stopped
}

var (
	stopOnce sync.Once
	stopped  chan struct{}
)

// Exit prints result as the child's result line (JSON) and exits 0; a
// result that cannot be encoded exits 1.
func Exit(result any) {
	b, err := json.Marshal(result)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testproc: result:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stdout, "\n%s%s\n", resultPrefix, b)
	os.Exit(0)
}
