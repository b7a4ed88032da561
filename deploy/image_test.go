package deploy

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestImage builds the image with deploy/build-image and Debian's podman and
// checks it: the binary inside is static, the image runs it as the non-root
// user with the worker's defaults, and `fleetpace version` from the image's
// file system prints the version the script stamped. It runs the binary in
// a container when podman can start one here, and otherwise (some virtual
// machines refuse crun's rlimits or cgroup setup) from the image's exported
// file system, and says which.
//
// Without podman the test is skipped, unless CI is set: .ci/run installs
// podman.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the container image")
	}
	podman := ciTool(t, "podman", "podman is not installed (.ci/run installs it)", "podman not installed")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const version = "v0.0.0-imagetest"
	image := fmt.Sprintf("localhost/fleetpace-imagetest:%d", os.Getpid())

	// Build: the script's own go build (only a link: TestMain compiled the
	// same packages with the same flags) and podman build.
	build := exec.CommandContext(ctx, "./build-image")
	build.Env = append(os.Environ(), "ENGINE=podman", "IMAGE="+image, "VERSION="+version)
	var stdout, stderr bytes.Buffer
	build.Stdout, build.Stderr = &stdout, &stderr
	start := time.Now()
	if err := build.Run(); err != nil {
		t.Fatalf("deploy/build-image: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	t.Cleanup(func() { _ = exec.Command(podman, "rmi", "-f", image).Run() })
	t.Logf("deploy/build-image in %s:\n%s", time.Since(start).Round(time.Millisecond), stdout.String())
	if !regexp.MustCompile(`(?m)^id +\S+\n^size +\d+ bytes`).MatchString(stdout.String()) {
		t.Errorf("build-image does not print the image id and size:\n%s", stdout.String())
	}

	// The image's configuration.
	out, err := exec.CommandContext(ctx, podman, "image", "inspect", image).Output()
	if err != nil {
		t.Fatalf("podman image inspect: %v", err)
	}
	var inspect []struct {
		Size   int64
		Config struct {
			User         string
			Entrypoint   []string
			Cmd          []string
			Env          []string
			ExposedPorts map[string]any
			StopSignal   string
			Labels       map[string]string
		}
	}
	if err := json.Unmarshal(out, &inspect); err != nil || len(inspect) != 1 {
		t.Fatalf("podman image inspect: %v\n%s", err, out)
	}
	cfg := inspect[0].Config
	t.Logf("image size %d bytes (%.1f MiB)", inspect[0].Size, float64(inspect[0].Size)/(1<<20))
	if cfg.User != fmt.Sprintf("%d:%d", nonRootUID, nonRootUID) {
		t.Errorf("image user %q, want %d:%d (non-root)", cfg.User, nonRootUID, nonRootUID)
	}
	if strings.Join(cfg.Entrypoint, " ") != "/fleetpace" || strings.Join(cfg.Cmd, " ") != "worker" || cfg.StopSignal != "SIGTERM" {
		t.Errorf("entrypoint %q, cmd %q, stop signal %q; want /fleetpace, worker, SIGTERM", cfg.Entrypoint, cfg.Cmd, cfg.StopSignal)
	}
	port := workerPort(t)
	if _, ok := cfg.ExposedPorts[port+"/tcp"]; !ok || !slices.Contains(cfg.Env, "FLEETPACE_HTTP_ADDR=0.0.0.0:"+port) {
		t.Errorf("exposed %v, env %v: want %s/tcp and FLEETPACE_HTTP_ADDR=0.0.0.0:%s", cfg.ExposedPorts, cfg.Env, port, port)
	}
	if got := cfg.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("version label %q, want %q", got, version)
	}

	// The image's file system, exported from a container that never starts.
	root := t.TempDir()
	files := exportImage(ctx, t, podman, image, root)
	for _, want := range []string{"fleetpace", "etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt"} {
		if _, ok := files[want]; !ok {
			t.Errorf("/%s is not in the image (files: %v)", want, slices.Sorted(maps.Keys(files)))
		}
	}
	if len(files) > 8 {
		t.Errorf("the image holds more than the binary, CA certificates and passwd/group: %v", slices.Sorted(maps.Keys(files)))
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !regexp.MustCompile(fmt.Sprintf(`(?m)^\w+:x:%d:%d:`, nonRootUID, nonRootUID)).Match(passwd) {
		t.Errorf("/etc/passwd has no entry for %d:\n%s", nonRootUID, passwd)
	}
	bin := filepath.Join(root, "fleetpace")
	if problems := staticProblems(bin); len(problems) > 0 {
		t.Errorf("the image's binary is not static: %v", problems)
	}

	want := regexp.MustCompile(`^fleetpace ` + regexp.QuoteMeta(version) + ` \(rev [0-9a-f]{7}(, modified)?\) ` +
		regexp.QuoteMeta(runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) + "\n$")
	got, err := exec.CommandContext(ctx, bin, "version").Output()
	if err != nil || !want.Match(got) {
		t.Fatalf("fleetpace version from the image's file system: %v: %q, want %s", err, got, want)
	}

	// In a container, when this machine can start one. The limits are set
	// below the sandbox's own: crun cannot raise them where CAP_SYS_RESOURCE
	// is missing.
	run := exec.CommandContext(ctx, podman, "run", "--rm", "--network", "none",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", image, "version")
	var runErr bytes.Buffer
	run.Stderr = &runErr
	if out, err := run.Output(); err != nil {
		t.Logf("podman run cannot start a container on this machine (%v: %s); "+
			"checked the binary extracted from the image (podman export) instead", err, strings.TrimSpace(runErr.String()))
	} else if string(out) != string(got) {
		t.Errorf("podman run %s version: %q, want %q", image, out, got)
	} else {
		t.Logf("podman run %s version: %s", image, strings.TrimSpace(string(out)))
	}
}

// exportImage writes the file system of image under root (podman create +
// podman export: no container is started) and returns its regular files by
// path.
func exportImage(ctx context.Context, t *testing.T, podman, image, root string) map[string]int64 {
	t.Helper()
	id, err := exec.CommandContext(ctx, podman, "create", image).Output()
	if err != nil {
		t.Fatalf("podman create: %v", err)
	}
	ctr := strings.TrimSpace(string(id))
	defer func() { _ = exec.Command(podman, "rm", "-f", ctr).Run() }()
	export := exec.CommandContext(ctx, podman, "export", ctr)
	pipe, err := export.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := export.Start(); err != nil {
		t.Fatal(err)
	}
	files := map[string]int64{}
	tr := tar.NewReader(pipe)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("podman export: %v", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")
		files[name] = h.Size
		dst := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, tr); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := export.Wait(); err != nil {
		t.Fatalf("podman export: %v", err)
	}
	return files
}

// staticProblems says why path is not an ELF executable that runs alone
// (no program interpreter, no shared libraries); nil when it is one.
func staticProblems(path string) []string {
	f, err := elf.Open(path)
	if err != nil {
		return []string{err.Error()}
	}
	defer f.Close()
	var out []string
	if f.Type != elf.ET_EXEC {
		out = append(out, fmt.Sprintf("ELF type %s, want ET_EXEC", f.Type))
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			out = append(out, "has a "+p.Type.String()+" program header")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		out = append(out, fmt.Sprintf("needs %v", libs))
	}
	return out
}

// ciTool finds the program name on the PATH. Without it the test is
// skipped (skip says why), unless CI is set: .ci/run installs every tool
// the tests use, so there a missing one fails the test (ci says why).
func ciTool(t *testing.T, name, ci, skip string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(ci)
		}
		t.Skip(skip)
	}
	return path
}

// TestStaticProblems: the check tells a dynamically linked program (the
// shell of this machine) from a static one.
func TestStaticProblems(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	if p := staticProblems(sh); len(p) == 0 {
		t.Errorf("%s passes as static", sh)
	}
	if testing.Short() {
		return // binary is not built as the image's (TestMain)
	}
	if p := staticProblems(binary); len(p) > 0 {
		t.Errorf("the test binary, built as deploy/build-image builds it, is not static: %v", p)
	}
}
