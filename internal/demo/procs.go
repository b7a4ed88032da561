package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// workerSoftStop is the workers' --soft-stop: short, fetches are fast here.
const workerSoftStop = 2 * time.Second

// fleet is the running `fleetpace worker` processes.
type fleet struct {
	procs []*proc
	once  sync.Once
}

type proc struct {
	n    int
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	err  error         // set before done is closed
}

// workerArgs are the flags of every demo worker. --data-dir names the demo's
// directory (it is not used: --database-url wins), so every process the demo
// started can be found by it.
func workerArgs(dbURL, tmp string) []string {
	return []string{
		"worker",
		"--database-url", dbURL,
		"--data-dir", filepath.Join(tmp, "pg"),
		"--allow-private-networks",
		"--http-addr", "",
		"--startup-jitter", "500ms",
		"--poll-base", "500ms",
		"--poll-max", "2s",
		"--soft-stop", workerSoftStop.String(),
		"--rate-limited-after", rateLimitedAfter.String(),
		"--heartbeat", "2s",
		"--max-pacer-wait", "2s",
		"--log-level", "warn",
		"-q",
	}
}

// startWorkers starts cfg.Workers worker processes, each logging to a file in
// tmp. They run in their own process group (a Ctrl-C reaches only the demo,
// which stops them in order) and die with the demo if it is killed.
func startWorkers(cfg Config, dbURL, tmp string) (*fleet, error) {
	f := &fleet{}
	for i := range cfg.Workers {
		logPath := filepath.Join(tmp, fmt.Sprintf("worker-%d.log", i+1))
		logFile, err := os.Create(logPath)
		if err != nil {
			f.stop(context.Background(), io.Discard)
			return nil, fmt.Errorf("demo: worker log: %w", err)
		}
		cmd := exec.Command(cfg.Executable, workerArgs(dbURL, tmp)...)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.Env = append(os.Environ(), "DATABASE_URL=")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logFile.Close()
			f.stop(context.Background(), io.Discard)
			return nil, fmt.Errorf("demo: start worker %d (%s): %w", i+1, cfg.Executable, err)
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

// exited returns an error naming the first worker that has exited, with the
// tail of its log, or nil while all run.
func (f *fleet) exited() error {
	for _, p := range f.procs {
		select {
		case <-p.done:
			return fmt.Errorf("demo: worker %d exited early (%v):\n%s", p.n, p.err, tail(p.log, 20))
		default:
		}
	}
	return nil
}

// stop sends SIGTERM to every worker, waits for them to finish their soft
// stop, and kills any still running when ctx ends or a grace period passes.
// Safe to call more than once.
func (f *fleet) stop(ctx context.Context, out io.Writer) {
	f.once.Do(func() {
		for _, p := range f.procs {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		grace := time.NewTimer(workerSoftStop + 10*time.Second)
		defer grace.Stop()
		for _, p := range f.procs {
			select {
			case <-p.done:
				continue
			case <-ctx.Done():
			case <-grace.C:
			}
			fmt.Fprintf(out, "demo: worker %d did not stop in time; killing it\n", p.n)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		for _, p := range f.procs {
			var ee *exec.ExitError
			if p.err != nil && !errors.As(p.err, &ee) {
				fmt.Fprintf(out, "demo: worker %d: %v\n", p.n, p.err)
			}
		}
	})
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
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
