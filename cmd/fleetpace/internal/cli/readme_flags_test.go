package cli

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// readmeMissing returns the commands and flags of root's tree that the
// README text does not name, each matched as a whole: a command by its path
// opening a code span (`platforms set NAME`, `scan`), a flag as --name not
// followed by more of a name (--limit is not --limit-x).
func readmeMissing(text string, root *cobra.Command) []string {
	var missing []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "completion" || c.Name() == "help" {
			return
		}
		if c.HasParent() {
			path := strings.TrimPrefix(c.CommandPath(), root.Name()+" ")
			if !regexp.MustCompile("`" + regexp.QuoteMeta(path) + "[`\\s]").MatchString(text) {
				missing = append(missing, "command "+c.CommandPath())
			}
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name == "help" || f.Hidden {
				return
			}
			if !regexp.MustCompile(`(^|[^\w-])--` + regexp.QuoteMeta(f.Name) + `([^\w-]|$)`).MatchString(text) {
				missing = append(missing, c.CommandPath()+": flag --"+f.Name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return missing
}

// TestREADMEListsEveryFlag keeps the configuration reference
// (docs/configuration.md) true: every command and every flag of every
// command must appear in it.
func TestREADMEListsEveryFlag(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	a := &app{stdout: os.Stdout, stderr: os.Stderr}
	for _, m := range readmeMissing(string(readme), a.rootCmd()) {
		t.Errorf("%s is not in docs/configuration.md", m)
	}
}

// A name found only inside longer words does not count: "settings" does not
// name the command set, nor "--jsonl" the flag --json.
func TestREADMEMatchesWholeNames(t *testing.T) {
	t.Parallel()
	root := &cobra.Command{Use: "fleetpace"}
	parent := &cobra.Command{Use: "platforms"}
	set := &cobra.Command{Use: "set NAME", Run: func(*cobra.Command, []string) {}}
	set.Flags().Bool("json", false, "")
	parent.AddCommand(set)
	root.AddCommand(parent)

	if got := readmeMissing("`platforms settings` --jsonl, --json-x", root); strings.Join(got, "; ") != "command fleetpace platforms set; fleetpace platforms set: flag --json" {
		t.Errorf("missing = %q, want the command set and the flag --json", got)
	}
	if got := readmeMissing("| `platforms set NAME` | `--json` |", root); len(got) != 0 {
		t.Errorf("missing = %q, want nothing", got)
	}
}
