// Package pgembed runs a private PostgreSQL cluster from the server binaries
// installed on the machine: in a temporary directory (tests, demo) or in a
// persistent data directory (the CLI's default when no database URL is given).
//
// The cluster listens on a free loopback port and a private socket directory,
// trusts local connections for the "postgres" superuser, and is started and
// stopped with pg_ctl. When the calling process is root, initdb and the server
// run as an unprivileged user (default "postgres"), because PostgreSQL refuses
// to run as root. A temporary cluster has a watchdog process that stops its
// server when the process that started it dies without Close (a panic, a
// test binary killed by its timeout, SIGKILL).
package pgembed

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrBinariesNotFound is returned when no PostgreSQL server binaries can be
// found. Its message carries an install hint.
var ErrBinariesNotFound = errors.New("pgembed: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH, " +
	"via `pg_config --bindir`, or under /usr/lib/postgresql/*/bin; install them, e.g. `apt-get install postgresql` " +
	"(Debian/Ubuntu), `dnf install postgresql-server` (Fedora) or `brew install postgresql` (macOS), " +
	"or pass --database-url to use an existing server")

// ErrInvalidDataDir is returned when the data directory given is not one
// (a file, say).
var ErrInvalidDataDir = errors.New("pgembed: the data directory is not a directory")

// ErrPortInUse is returned when the cluster must listen on a given port
// (Config.Port, or the port a shared cluster remembers) and another process
// has it.
var ErrPortInUse = errors.New("pgembed: port in use")

// Config configures a cluster. The zero value starts a temporary cluster.
type Config struct {
	// BinDir is the directory holding initdb, pg_ctl and postgres.
	// Default: discovered by FindBinDir.
	BinDir string

	// DataDir is where the cluster lives. If it already holds a cluster, the
	// cluster is reused. Default: a new temporary directory, removed by Close.
	DataDir string

	// Port is the TCP port on 127.0.0.1. Default: a free port picked at start.
	Port int

	// RunAsUser is the unprivileged user that runs initdb and the server when
	// the calling process is root. Default: "postgres". Ignored when not root.
	RunAsUser string

	// Settings are extra server settings written to the cluster's
	// configuration (name → value, e.g. "max_connections": "50").
	Settings map[string]string

	// Durable keeps fsync and full_page_writes on. Default false for
	// temporary clusters (fast, for tests); the CLI sets it for persistent ones.
	Durable bool

	// InitCache is a directory where the first start keeps a freshly
	// initialized data directory, per server binaries, and later starts
	// copy it instead of running initdb again (1.7 s of a test package's
	// start on a 2-core machine; a copy takes a tenth of that). Test
	// binaries that start many clusters share one. Default: initdb every
	// time.
	InitCache string

	// Logger receives progress messages. Default: discard.
	Logger *slog.Logger
}

// Cluster is a running (or stopped) embedded PostgreSQL cluster.
type Cluster struct {
	cfg     Config
	binDir  string
	dataDir string // the PGDATA directory
	sockDir string
	logFile string
	root    string // the directory given as DataDir (or the temporary one)
	temp    string // temporary root to remove on Close, if any
	port    int
	cred    *syscall.Credential
	// watchdog stops a temporary cluster's server when this process dies
	// without Close (see startWatchdog); nil for a persistent cluster.
	watchdog *watchdog
}

// FindBinDir returns a directory holding initdb, pg_ctl and postgres, looked
// up on PATH, then via `pg_config --bindir`, then under
// /usr/lib/postgresql/*/bin (highest version first).
func FindBinDir() (string, error) {
	var candidates []string
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
		candidates = append(candidates, filepath.Dir(p))
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	globbed, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(globbed, func(i, j int) bool { return versionOf(globbed[i]) > versionOf(globbed[j]) })
	candidates = append(candidates, globbed...)
	for _, dir := range candidates {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", ErrBinariesNotFound
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// Start initializes the cluster if its data directory is empty, starts the
// server (or reuses the one already running on the data directory) and waits
// until it accepts connections.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	c, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	return c.launch(ctx, c.init)
}

// launch fills the data directory of a cluster prepare made (fill: initdb,
// or a base backup) and starts its server; on failure it removes the
// temporary directory prepare made, if any.
func (c *Cluster) launch(ctx context.Context, fill func(context.Context) error) (*Cluster, error) {
	if err := fill(ctx); err != nil {
		c.removeTemp()
		return nil, err
	}
	if err := c.startServer(ctx); err != nil {
		c.removeTemp()
		return nil, err
	}
	if c.temp != "" {
		w, err := c.startWatchdog()
		if err != nil {
			_ = c.Kill(context.WithoutCancel(ctx))
			c.removeTemp()
			return nil, err
		}
		c.watchdog = w
	}
	return c, nil
}

// Attach returns the Cluster of a persistent data directory whose server is
// already running (the port is read from postmaster.pid). It starts nothing;
// ErrNotRunning means no server runs there.
func Attach(cfg Config) (*Cluster, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("pgembed: Attach needs a DataDir")
	}
	c, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	port, err := c.runningPort()
	if err != nil {
		return nil, err
	}
	c.port = port
	return c, nil
}

// ErrNotRunning is returned by Attach when no server runs on the data directory.
var ErrNotRunning = errors.New("pgembed: no server running")

func prepare(cfg Config) (*Cluster, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RunAsUser == "" {
		cfg.RunAsUser = "postgres"
	}
	binDir := cfg.BinDir
	if binDir == "" {
		var err error
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if !hasServerBinaries(binDir) {
		return nil, fmt.Errorf("%w (looked in BinDir %q)", ErrBinariesNotFound, binDir)
	}

	c := &Cluster{cfg: cfg, binDir: binDir, port: cfg.Port}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(cfg.RunAsUser)
		if err != nil {
			return nil, fmt.Errorf("pgembed: running as root needs an unprivileged user to run PostgreSQL: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}

	root := cfg.DataDir
	if root == "" {
		tmp, err := os.MkdirTemp("", "fleetpace-pg-")
		if err != nil {
			return nil, fmt.Errorf("pgembed: temp dir: %w", err)
		}
		c.temp, root = tmp, tmp
	} else if err := checkDir(root); err != nil {
		return nil, err
	} else if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("pgembed: data dir: %w", err)
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("pgembed: data dir: %w", err)
	}
	c.root = root
	c.dataDir = filepath.Join(root, "pgdata")
	c.sockDir = filepath.Join(root, "sock")
	c.logFile = filepath.Join(root, "postgres.log")
	return c, nil
}

func (c *Cluster) init(ctx context.Context) error {
	for _, dir := range []string{c.sockDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("pgembed: %w", err)
		}
	}
	if err := c.chown(c.root); err != nil {
		return err
	}
	if err := c.chown(c.sockDir); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); err == nil {
		return nil // already initialized
	}
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if err := c.chown(c.dataDir); err != nil {
		return err
	}
	c.cfg.Logger.Info("initializing embedded PostgreSQL cluster", "dir", c.dataDir)
	if c.cfg.InitCache != "" {
		return c.initFromCache(ctx)
	}
	return c.initdb(ctx, c.dataDir)
}

// initdbArgs are initdb's options after -D.
var initdbArgs = []string{"-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions"}

// initdb initializes a data directory in dir (which exists, owned by the
// server's user) and makes it read fleetpace.conf.
func (c *Cluster) initdb(ctx context.Context, dir string) error {
	out, err := c.command(ctx, "initdb", append([]string{"-D", dir}, initdbArgs...)...).CombinedOutput()
	if err != nil {
		if c.cred != nil && bytes.Contains(out, []byte("Permission denied")) {
			return fmt.Errorf("pgembed: initdb as user %q cannot use %s (every parent directory must be searchable by that user; choose another data dir): %w\n%s",
				c.cfg.RunAsUser, dir, err, out)
		}
		return fmt.Errorf("pgembed: initdb: %w\n%s", err, out)
	}
	conf, err := os.OpenFile(filepath.Join(dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	defer conf.Close()
	_, err = conf.WriteString("\ninclude_if_exists = 'fleetpace.conf'\n")
	return err
}

// writeConf writes the settings that may change from one start to the next.
func (c *Cluster) writeConf() error {
	settings := map[string]string{
		"port":                    strconv.Itoa(c.port),
		"listen_addresses":        "'127.0.0.1'",
		"unix_socket_directories": quoteConf(c.sockDir),
		"max_connections":         "200",
		"logging_collector":       "off",
	}
	if !c.cfg.Durable {
		settings["fsync"] = "off"
		settings["full_page_writes"] = "off"
		settings["synchronous_commit"] = "off"
	}
	for k, v := range c.cfg.Settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# written by fleetpace (internal/pgembed) at every start\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, settings[k])
	}
	path := filepath.Join(c.dataDir, "fleetpace.conf")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	return c.chown(path)
}

func quoteConf(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (c *Cluster) startServer(ctx context.Context) error {
	if port, err := c.runningPort(); err == nil {
		c.port = port
		return c.waitReady(ctx)
	}
	fixedPort := c.port != 0
	if fixedPort && !portFree(c.port) {
		return fmt.Errorf("%w: 127.0.0.1:%d, where the cluster in %s listens, is taken by another process", ErrPortInUse, c.port, c.root)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if !fixedPort {
			p, err := freePort()
			if err != nil {
				return err
			}
			c.port = p
		}
		if err := c.writeConf(); err != nil {
			return err
		}
		if f, err := os.OpenFile(c.logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
			f.Close()
			_ = c.chown(c.logFile)
		}
		c.cfg.Logger.Debug("starting embedded PostgreSQL", "port", c.port)
		out, err := c.command(ctx, "pg_ctl", "-D", c.dataDir, "-l", c.logFile, "-w", "-t", "60", "start").CombinedOutput()
		if err == nil {
			return c.waitReady(ctx)
		}
		lastErr = fmt.Errorf("pgembed: pg_ctl start: %w\n%s%s", err, out, c.logTail())
		if fixedPort || !strings.Contains(c.logTail(), "could not") {
			break
		}
	}
	return lastErr
}

func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// runningPort reports the port of the server running on the data directory,
// from postmaster.pid, or an error if none runs.
func (c *Cluster) runningPort() (int, error) {
	f, err := os.Open(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("%w on %s", ErrNotRunning, c.dataDir)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) < 4 {
		return 0, fmt.Errorf("pgembed: postmaster.pid incomplete")
	}
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || syscall.Kill(pid, 0) != nil && !errors.Is(syscall.Kill(pid, 0), syscall.EPERM) {
		return 0, fmt.Errorf("%w on %s (stale postmaster.pid)", ErrNotRunning, c.dataDir)
	}
	port, err := strconv.Atoi(strings.TrimSpace(lines[3]))
	if err != nil {
		return 0, fmt.Errorf("pgembed: postmaster.pid port: %w", err)
	}
	return port, nil
}

func (c *Cluster) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgembed: server did not accept connections: %w\n%s", err, c.logTail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URL returns a connection URL for database dbname.
func (c *Cluster) URL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, dbname)
}

// Port returns the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// DataDir returns the PGDATA directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// Stop stops the server (fast shutdown) and keeps its data; Restart starts it
// again on the same port.
func (c *Cluster) Stop(ctx context.Context) error {
	out, err := c.command(ctx, "pg_ctl", "-D", c.dataDir, "-m", "fast", "-w", "-t", "60", "stop").CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("Is server running?")) {
		return fmt.Errorf("pgembed: pg_ctl stop: %w\n%s", err, out)
	}
	return nil
}

// Restart starts a stopped server again, on the same port.
func (c *Cluster) Restart(ctx context.Context) error {
	return c.startServer(ctx)
}

// Close stops the server and, for a temporary cluster, removes its directory.
func (c *Cluster) Close(ctx context.Context) error {
	err := c.Stop(ctx)
	if c.watchdog != nil {
		c.watchdog.release()
		c.watchdog = nil
	}
	c.removeTemp()
	return err
}

func (c *Cluster) removeTemp() {
	if c.temp != "" {
		os.RemoveAll(c.temp)
	}
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	// Own process group: a Ctrl-C aimed at us must not kill the server
	// before we stop it cleanly.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if c.cred != nil {
		cmd.SysProcAttr.Credential = c.cred
		cmd.Dir = "/"
	}
	return cmd
}

func (c *Cluster) chown(path string) error {
	if c.cred == nil {
		return nil
	}
	if err := os.Chown(path, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
		return fmt.Errorf("pgembed: chown %s: %w", path, err)
	}
	return nil
}

// checkDir refuses a data directory that exists and is not a directory, or
// that cannot be one (a parent is a file).
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && !fi.IsDir():
		return fmt.Errorf("%w: %s is a file", ErrInvalidDataDir, dir)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%w: a parent of %s is a file", ErrInvalidDataDir, dir)
	}
	return nil
}

// portFree reports whether nothing listens on 127.0.0.1:port.
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgembed: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
