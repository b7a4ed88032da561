// Package nginxrun runs a real nginx as a child process, for the tests and
// benchmarks that prove fleetpace against a real rate limiter: its own
// configuration, prefix directory, pid file and logs in a directory of the
// caller's, listening on a free loopback port, serving static files (with
// nginx's own ETag, Last-Modified and 304s) under locations limited by
// limit_req (limit_req_status 429), and logging every request as
// "$msec $status $uri". nginx runs in the foreground without a master
// process (one process: nothing is left behind), in a process group of its
// own, and is killed if the parent dies.
package nginxrun

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNotInstalled is returned by Binary and Start when no nginx is found.
var ErrNotInstalled = errors.New("nginxrun: nginx is not installed (Debian: apt-get install nginx)")

// ErrInvalidConfig is wrapped by every error of Config.Validate.
var ErrInvalidConfig = errors.New("nginxrun: invalid config")

// Location is one location block: a prefix with static files and, if Rate
// is set, a limit_req zone of its own.
type Location struct {
	// Prefix is the location's path prefix, starting and ending with "/"
	// (e.g. "/a/"). Required.
	Prefix string
	// Rate is the zone's rate in requests per second (limit_req_zone
	// rate=Nr/s). Default 0: no limit.
	Rate int
	// Burst is limit_req's burst, with nodelay. Default 0: none.
	Burst int
	// Files is how many static files the location serves: Prefix + "0",
	// Prefix + "1", …. Default 0.
	Files int
}

// Config configures a Server.
type Config struct {
	// Dir holds the configuration, the pid file, the logs (access.log,
	// error.log), the static files (html/) and nginx's temporary
	// directories. Required; it must exist.
	Dir string
	// Binary is the nginx executable. Default: Binary().
	Binary string
	// Locations are the served locations; every Prefix once.
	Locations []Location
	// StartTimeout bounds the wait until nginx answers. Default 10 s.
	StartTimeout time.Duration
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if c.Dir == "" {
		return fmt.Errorf("%w: Dir is required", ErrInvalidConfig)
	}
	seen := map[string]bool{}
	for i, l := range c.Locations {
		switch {
		case len(l.Prefix) < 2 || !strings.HasPrefix(l.Prefix, "/") || !strings.HasSuffix(l.Prefix, "/") ||
			strings.ContainsAny(l.Prefix, " ;{}'\"\\$") || strings.Contains(l.Prefix, ".."):
			return fmt.Errorf("%w: Locations[%d].Prefix must be a plain path between slashes, got %q", ErrInvalidConfig, i, l.Prefix)
		case seen[l.Prefix]:
			return fmt.Errorf("%w: Locations[%d].Prefix %q given twice", ErrInvalidConfig, i, l.Prefix)
		case l.Rate < 0 || l.Burst < 0 || l.Files < 0:
			return fmt.Errorf("%w: Locations[%d]: Rate, Burst and Files must be ≥ 0", ErrInvalidConfig, i)
		case l.Burst > 0 && l.Rate == 0:
			return fmt.Errorf("%w: Locations[%d].Burst needs a Rate", ErrInvalidConfig, i)
		}
		seen[l.Prefix] = true
	}
	return nil
}

// Binary finds nginx: on PATH, else /usr/sbin/nginx.
func Binary() (string, error) {
	if p, err := exec.LookPath("nginx"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx", nil
	}
	return "", ErrNotInstalled
}

// Server is a running nginx.
type Server struct {
	dir  string
	url  string
	cmd  *exec.Cmd
	done chan struct{} // closed when nginx has exited
	err  error         // Wait's result, set before done is closed
}

// Start writes the configuration and the files and starts nginx, retrying
// on another port if the one it picked was taken meanwhile. The caller must
// Stop it.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Binary == "" {
		b, err := Binary()
		if err != nil {
			return nil, err
		}
		cfg.Binary = b
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if err := writeFiles(cfg); err != nil {
		return nil, err
	}
	var last error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := start(ctx, cfg, port)
		if err == nil {
			return s, nil
		}
		last = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, last
}

func start(ctx context.Context, cfg Config, port int) (*Server, error) {
	conf := filepath.Join(cfg.Dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(configText(cfg, port)), 0o644); err != nil {
		return nil, fmt.Errorf("nginxrun: %w", err)
	}
	errLog := filepath.Join(cfg.Dir, "error.log")
	_ = os.Remove(errLog)
	s := &Server{dir: cfg.Dir, url: fmt.Sprintf("http://127.0.0.1:%d", port), done: make(chan struct{})}
	s.cmd = exec.Command(cfg.Binary, "-p", cfg.Dir, "-c", conf, "-e", errLog)
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(cfg.Dir, "nginx.out"))
	if err != nil {
		return nil, fmt.Errorf("nginxrun: %w", err)
	}
	s.cmd.Stdout, s.cmd.Stderr = out, out
	if err := s.cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("nginxrun: start %s: %w", cfg.Binary, err)
	}
	go func() {
		s.err = s.cmd.Wait()
		out.Close()
		close(s.done)
	}()
	deadline := time.Now().Add(cfg.StartTimeout)
	client := http.Client{Timeout: time.Second}
	for {
		select {
		case <-s.done:
			return nil, fmt.Errorf("nginxrun: nginx exited at start (%v): %s", s.err, s.logs())
		default:
		}
		resp, err := client.Get(s.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = s.Stop()
			return nil, fmt.Errorf("nginxrun: nginx does not answer on %s within %s (%v): %s", s.url, cfg.StartTimeout, cmp(ctx.Err(), err), s.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func cmp(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// logs is the tail of nginx's error log and output, for errors.
func (s *Server) logs() string {
	var b strings.Builder
	for _, f := range []string{"error.log", "nginx.out"} {
		data, _ := os.ReadFile(filepath.Join(s.dir, f))
		if len(data) > 2048 {
			data = data[len(data)-2048:]
		}
		b.Write(data)
	}
	return strings.TrimSpace(b.String())
}

// URL is the server's base URL, http://127.0.0.1:PORT.
func (s *Server) URL() string { return s.url }

// Stop ends nginx (SIGQUIT: finish the requests in flight; killed after
// 5 s) and waits for it. Safe to call more than once.
func (s *Server) Stop() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.done:
		return nil
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("nginxrun: nginx did not stop within 5 s; killed")
	}
}

// Entry is one line of the access log.
type Entry struct {
	Time   time.Time // $msec: when nginx logged the request (its answer), ms resolution
	Status int
	URI    string
}

// Entries reads the access log so far (the health checks are not logged).
func (s *Server) Entries() ([]Entry, error) {
	f, err := os.Open(filepath.Join(s.dir, "access.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nginxrun: %w", err)
	}
	defer f.Close()
	var out []Entry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		e, ok := parseLine(sc.Text())
		if ok {
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// parseLine reads "$msec $status $uri"; a line cut short (being written)
// is skipped.
func parseLine(line string) (Entry, bool) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return Entry{}, false
	}
	sec, frac, ok := strings.Cut(f[0], ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	ms, err2 := strconv.ParseInt(frac, 10, 64)
	status, err3 := strconv.Atoi(f[1])
	if !ok || len(frac) != 3 || err1 != nil || err2 != nil || err3 != nil {
		return Entry{}, false
	}
	return Entry{Time: time.UnixMilli(s*1000 + ms), Status: status, URI: f[2]}, true
}

// freePort picks a loopback port nobody listens on (it may be taken before
// nginx binds it: Start retries).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("nginxrun: pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writeFiles makes the directories and the static files.
func writeFiles(cfg Config) error {
	for _, d := range []string{"html", "tmp", "logs"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return fmt.Errorf("nginxrun: %w", err)
		}
	}
	for _, l := range cfg.Locations {
		dir := filepath.Join(cfg.Dir, "html", filepath.FromSlash(l.Prefix))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("nginxrun: %w", err)
		}
		for i := range l.Files {
			body := fmt.Sprintf("static file %d of %s\n", i, l.Prefix)
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(i)), []byte(body), 0o644); err != nil {
				return fmt.Errorf("nginxrun: %w", err)
			}
		}
	}
	return nil
}

// configText is nginx.conf: one process in the foreground, everything
// under Dir, one limit_req zone per limited location (keyed on the server
// name: one limit for all clients), refusals answered 429 and not logged
// to the error log.
func configText(cfg Config, port int) string {
	d := cfg.Dir
	var b strings.Builder
	fmt.Fprintf(&b, `daemon off;
master_process off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 1024; }
http {
    log_format fleetpace '$msec $status $uri';
    access_log %[1]s/access.log fleetpace;
    client_body_temp_path %[1]s/tmp/body;
    proxy_temp_path %[1]s/tmp/proxy;
    fastcgi_temp_path %[1]s/tmp/fastcgi;
    uwsgi_temp_path %[1]s/tmp/uwsgi;
    scgi_temp_path %[1]s/tmp/scgi;
    default_type text/plain;
    keepalive_requests 100000;
    limit_req_status 429;
    limit_req_log_level info;
`, d)
	for i, l := range cfg.Locations {
		if l.Rate > 0 {
			fmt.Fprintf(&b, "    limit_req_zone $server_name zone=z%d:1m rate=%dr/s;\n", i, l.Rate)
		}
	}
	fmt.Fprintf(&b, `    server {
        listen 127.0.0.1:%d;
        server_name fleetpace;
        root %s/html;
        location = /healthz { access_log off; return 200 "ok\n"; }
`, port, d)
	for i, l := range cfg.Locations {
		fmt.Fprintf(&b, "        location %s {", l.Prefix)
		if l.Rate > 0 {
			fmt.Fprintf(&b, " limit_req zone=z%d", i)
			if l.Burst > 0 {
				fmt.Fprintf(&b, " burst=%d nodelay", l.Burst)
			}
			b.WriteString(";")
		}
		b.WriteString(" }\n")
	}
	b.WriteString("    }\n}\n")
	return b.String()
}
