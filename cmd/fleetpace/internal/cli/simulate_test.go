package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimulateHerd(t *testing.T) {
	t.Parallel()
	chart := filepath.Join(t.TempDir(), "herd.svg")
	r := run(t, "", "simulate", "herd", "--pollers", "2000", "--scenario", "saturation", "--modes",
		"deterministic/retry,both-jitter/fail-fast", "--json", "--chart", chart)
	if r.code != 0 {
		t.Fatalf("simulate herd: %s", r)
	}
	var out struct {
		Pollers int `json:"pollers"`
		Modes   []struct {
			Mode    string `json:"mode"`
			Drained bool   `json:"drained"`
		} `json:"modes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("JSON: %v\n%s", err, r.stdout)
	}
	if out.Pollers != 2000 || len(out.Modes) != 2 || !strings.Contains(out.Modes[1].Mode, "fleetpace") {
		t.Errorf("unexpected JSON: %+v", out)
	}
	if b, err := os.ReadFile(chart); err != nil || !strings.Contains(string(b), "<svg") {
		t.Errorf("chart: %v", err)
	}
}

func TestSimulateBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"herd", "--pollers", "0"}, 2, "--pollers"},
		{[]string{"herd", "--slowdown", "NaN"}, 2, "--slowdown"},
		{[]string{"herd", "--slowdown", "+Inf", "--scenario", "saturation"}, 2, "--slowdown"},
		{[]string{"herd", "--scenario", "flood"}, 2, "flood"},
		{[]string{"herd", "--modes", "jittery/retry"}, 2, "jittery/retry"},
		{[]string{"herd", "--hold", "368", "--scenario", "saturation"}, 2, "Hold"},
		{[]string{"herd", "--at", "-1s", "--scenario", "saturation"}, 2, "--at"},
		{[]string{"herd", "--pollers", "100", "--chart", filepath.Join(dir, "missing", "x.png")}, 1, "--chart"},
		{[]string{"drill", "--pollers", "0"}, 2, "--pollers"},
		{[]string{"drill", "--poll-jitter", "1.5"}, 2, "JitterRatio"},
	} {
		r := run(t, "", append([]string{"simulate"}, c.args...)...)
		if r.code != c.code || !strings.Contains(r.stderr, c.want) {
			t.Errorf("simulate %v: want exit %d naming %q, got %s", c.args, c.code, c.want, r)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a failed chart left files: %v", entries)
	}
}
