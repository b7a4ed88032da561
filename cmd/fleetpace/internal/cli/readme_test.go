package cli_test

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetpace/fleetpace/internal/testdb"
)

// documents are the user's documents whose sh blocks are run, in order:
// the README first (its tour creates what the others use).
var documents = []string{"README.md", "docs/operations.md", "docs/scaling.md", "docs/configuration.md"}

// readmeCommands returns the fleetpace command lines of the documents' sh
// blocks, without the program name.
func readmeCommands(t *testing.T) [][]string {
	t.Helper()
	var out [][]string
	for _, name := range documents {
		out = append(out, documentCommands(t, filepath.Join("../../../..", name))...)
	}
	return out
}

func documentCommands(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]string
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "```sh"):
			inBlock = true
			continue
		case strings.HasPrefix(line, "```"):
			inBlock = false
			continue
		}
		if !inBlock {
			continue
		}
		for _, prefix := range []string{"./fleetpace ", "fleetpace ", "go run ./cmd/fleetpace "} {
			if strings.HasPrefix(line, prefix) {
				out = append(out, strings.Fields(strings.TrimPrefix(line, prefix)))
			}
		}
	}
	return out
}

// TestREADMECommands runs every fleetpace command of the README, in order,
// against a test database: a README that drifts from the CLI fails. The
// long-running ones (worker, demo) are checked for their flags here; they
// run for real in the integration and demo tests.
func TestREADMECommands(t *testing.T) {
	t.Parallel()
	cmds := readmeCommands(t)
	if len(cmds) < 10 {
		t.Fatalf("found only %d fleetpace commands in the README", len(cmds))
	}
	url := testdb.URL(t)
	dir := t.TempDir()
	csv := "platform,url,interval\nfeeds,https://example.com/a.xml,1h\nfeeds,https://example.com/b.xml,\n"
	if err := os.WriteFile(filepath.Join(dir, "sources.csv"), []byte(csv), 0o600); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	ran := 0
	for _, args := range cmds {
		switch args[0] {
		case "worker", "demo", "dashboard":
			r := run(t, "", append(args, "--help")...)
			if r.code != 0 {
				t.Errorf("README command %v: %s", args, r)
			}
			continue
		case "embedded":
			args = append(args, "--data-dir", filepath.Join(dir, "embedded"))
		default:
			args = append([]string{"-q", "--database-url", url}, args...)
		}
		// Relative files in the README are relative to the working directory.
		for i, a := range args {
			if a == "sources.csv" {
				args[i] = filepath.Join(dir, a)
			}
		}
		r := run(t, "", args...)
		if r.code != 0 {
			t.Errorf("README command %v (from %s): %s", args, wd, r)
		}
		ran++
	}
	if ran < 8 {
		t.Fatalf("ran only %d README commands", ran)
	}
}
