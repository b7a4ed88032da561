package cli_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// TestVersionStamped builds fleetpace with the version and revision stamped
// at link time, as release and image builds do, and runs `version`,
// `--version` and `-v`; the stamp is also the fetcher's User-Agent.
func TestVersionStamped(t *testing.T) {
	t.Parallel()
	const pkg = "github.com/fleetpace/fleetpace/internal/buildinfo"
	bin := filepath.Join(t.TempDir(), "fleetpace")
	ldflags := "-X " + pkg + ".version=v1.2.3-test -X " + pkg + ".revision=0123456789abcdef0123456789abcdef01234567"
	if out, err := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, "github.com/fleetpace/fleetpace/cmd/fleetpace").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	want := regexp.MustCompile(`^fleetpace v1\.2\.3-test \(rev 0123456(, modified)?\) ` +
		regexp.QuoteMeta(runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH) + "\n$")
	for _, args := range [][]string{{"version"}, {"--version"}, {"-v"}} {
		out, err := exec.Command(bin, args...).Output()
		if err != nil || !want.Match(out) {
			t.Errorf("fleetpace %v: %v: %q, want %s", args, err, out, want)
		}
	}
	help, err := exec.Command(bin, "worker", "--help").Output()
	if err != nil || !strings.Contains(string(help), `"fleetpace/v1.2.3-test (+https://github.com/fleetpace/fleetpace)"`) {
		t.Errorf("User-Agent default does not carry the stamped version: %v\n%s", err, help)
	}
}

// TestVersionUnstamped: a plain build still answers, with the module
// version from the build information or "dev".
func TestVersionUnstamped(t *testing.T) {
	t.Parallel()
	r := run(t, "", "version")
	want := regexp.MustCompile(`^fleetpace (dev|v\S+)( \(rev [0-9a-f]{7}(, modified)?\))? go\S+ ` + runtime.GOOS + "/" + runtime.GOARCH + "\n$")
	if r.code != 0 || !want.MatchString(r.stdout) {
		t.Fatalf("%s\nwant %s", r, want)
	}
	if r := run(t, "", "version", "extra"); r.code != 2 {
		t.Fatalf("version takes no arguments: %s", r)
	}
}
