// Package workers runs `fleetpace worker` processes for the demo and the
// benchmarks that measure a real fleet: each logs to a file of its own,
// runs in its own process group (a Ctrl-C reaches only the parent, which
// stops them in order) and dies with the parent if the parent is killed.
package workers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config configures a fleet.
type Config struct {
	// Executable is the fleetpace binary. Required.
	Executable string
	// Args are every process's arguments ("worker", flags…). Required.
	Args []string
	// ArgsEach, if set, returns more arguments for process i (0 to N-1),
	// appended to Args: what differs between the processes.
	ArgsEach func(i int) []string
	// N is how many processes. Default 1.
	N int
	// Dir receives one log file per process (worker-1.log, …). Required.
	Dir string
	// Env is added to the parent's environment, from which every
	// FLEETPACE_* variable and DATABASE_URL are removed first: a variable
	// left in the shell cannot change what Args say (FLEETPACE_HTTP_ADDR,
	// FLEETPACE_CONCURRENCY, …), nor a stray DATABASE_URL win over
	// --database-url.
	Env []string
	// Grace is how long Stop waits after SIGTERM before killing a process.
	// Default 15 s.
	Grace time.Duration
}

// Fleet is the running processes.
type Fleet struct {
	procs []*proc
	grace time.Duration
	once  sync.Once
	err   error
}

type proc struct {
	n    int
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	err  error         // set before done is closed
}

// Start starts cfg.N processes.
func Start(cfg Config) (*Fleet, error) {
	switch {
	case cfg.Executable == "":
		return nil, errors.New("workers: Config.Executable is required")
	case len(cfg.Args) == 0:
		return nil, errors.New("workers: Config.Args is required")
	case cfg.Dir == "":
		return nil, errors.New("workers: Config.Dir is required")
	}
	n := max(cfg.N, 1)
	f := &Fleet{grace: cfg.Grace}
	if f.grace <= 0 {
		f.grace = 15 * time.Second
	}
	for i := range n {
		logPath := filepath.Join(cfg.Dir, fmt.Sprintf("worker-%d.log", i+1))
		logFile, err := os.Create(logPath)
		if err != nil {
			_ = f.Stop(context.Background())
			return nil, fmt.Errorf("workers: log: %w", err)
		}
		args := slices.Clone(cfg.Args)
		if cfg.ArgsEach != nil {
			args = append(args, cfg.ArgsEach(i)...)
		}
		cmd := exec.Command(cfg.Executable, args...)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.Env = append(Environ(), cfg.Env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logFile.Close()
			_ = f.Stop(context.Background())
			return nil, fmt.Errorf("workers: start worker %d (%s): %w", i+1, cfg.Executable, err)
		}
		p := &proc{n: i + 1, cmd: cmd, log: logPath, done: make(chan struct{})}
		go func() {
			p.err = cmd.Wait()
			logFile.Close()
			close(p.done)
		}()
		f.procs = append(f.procs, p)
	}
	return f, nil
}

// Environ is the parent's environment without DATABASE_URL and the
// FLEETPACE_* variables: what a process started from Args alone gets.
func Environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLEETPACE_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	return env
}

// Exited returns an error naming the first process that has exited, with
// the tail of its log, or nil while all run.
func (f *Fleet) Exited() error {
	for _, p := range f.procs {
		select {
		case <-p.done:
			return fmt.Errorf("workers: worker %d exited early (%v):\n%s", p.n, p.err, Tail(p.log, 20))
		default:
		}
	}
	return nil
}

// Stop sends SIGTERM to every process, waits for them to exit, and kills
// any still running when ctx ends or the grace period passes; it returns
// which were killed or failed. Safe to call more than once.
func (f *Fleet) Stop(ctx context.Context) error {
	f.once.Do(func() {
		for _, p := range f.procs {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		grace := time.NewTimer(f.grace)
		defer grace.Stop()
		var errs []error
		for _, p := range f.procs {
			select {
			case <-p.done:
			case <-ctx.Done():
				_ = p.cmd.Process.Kill()
				<-p.done
				errs = append(errs, fmt.Errorf("workers: worker %d killed: %w", p.n, ctx.Err()))
				continue
			case <-grace.C:
				_ = p.cmd.Process.Kill()
				<-p.done
				errs = append(errs, fmt.Errorf("workers: worker %d did not stop within %s; killed", p.n, f.grace))
				continue
			}
			var ee *exec.ExitError
			if p.err != nil && !errors.As(p.err, &ee) {
				errs = append(errs, fmt.Errorf("workers: worker %d: %w", p.n, p.err))
			} else if p.err != nil {
				errs = append(errs, fmt.Errorf("workers: worker %d exited with %v:\n%s", p.n, p.err, Tail(p.log, 10)))
			}
		}
		f.err = errors.Join(errs...)
	})
	return f.err
}

// Pids returns the processes' ids, in order.
func (f *Fleet) Pids() []int {
	out := make([]int, len(f.procs))
	for i, p := range f.procs {
		out[i] = p.cmd.Process.Pid
	}
	return out
}

// Logs returns the processes' log files, in order.
func (f *Fleet) Logs() []string {
	out := make([]string, len(f.procs))
	for i, p := range f.procs {
		out[i] = p.log
	}
	return out
}

// listeningRE finds the address in the log line a worker's HTTP server
// writes when it listens.
var listeningRE = regexp.MustCompile(`msg="http server listening" addr=(\S+)`)

// Listening waits up to timeout for process i's log to name the address
// its HTTP server listens on (started with --http-addr 127.0.0.1:0), and
// returns it; an error if a process exits first or the time runs out.
func (f *Fleet) Listening(i int, timeout time.Duration) (string, error) {
	log := f.procs[i].log
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := f.Exited(); err != nil {
			return "", err
		}
		if b, err := os.ReadFile(log); err == nil {
			if m := listeningRE.FindSubmatch(b); m != nil {
				return string(m[1]), nil
			}
		}
		time.Sleep(50 * time.Millisecond) // polling the log file, not deciding anything
	}
	return "", fmt.Errorf("workers: worker %d never said where it listens:\n%s", f.procs[i].n, Tail(log, 20))
}

// Tail returns the last n lines of a file.
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
