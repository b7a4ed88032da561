package pgembed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// watchdogScript waits for its standard input to end, then stops the
// server at once ($0 is pg_ctl, $1 the data directory). Its input is a
// pipe whose only writer is the process that started the cluster: the
// kernel closes it when that process exits however it ends (a panic, a
// test binary killed by its timeout, SIGKILL), which runs no Go cleanup.
// A throwaway cluster left running holds its port, memory and a CPU's
// share of checkpoints until someone finds it.
const watchdogScript = `read -r _; exec "$0" -D "$1" -m immediate -w -t 30 stop >/dev/null 2>&1`

// watchdog is the process that stops a temporary cluster's server when
// the process that started it dies without Close.
type watchdog struct {
	cmd  *exec.Cmd
	pipe *os.File // the write end; closing it stops the server
}

// startWatchdog starts c's watchdog, as the user that runs the server
// (pg_ctl refuses root), in a process group of its own (a Ctrl-C aimed at
// this process reaches it only through the pipe, once this process has
// ended).
func (c *Cluster) startWatchdog() (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pgembed: watchdog: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, filepath.Join(c.binDir, "pg_ctl"), c.dataDir)
	cmd.Stdin = r
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if c.cred != nil {
		cmd.SysProcAttr.Credential = c.cred
		cmd.Dir = "/"
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("pgembed: watchdog: %w", err)
	}
	return &watchdog{cmd: cmd, pipe: w}, nil
}

// release ends the watchdog after Close stopped the server: its pg_ctl
// finds no server and exits.
func (w *watchdog) release() {
	w.pipe.Close()
	_ = w.cmd.Wait()
}
