package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestREADMEListsEveryFlag keeps the README's configuration reference true:
// every flag of every command must appear in it.
func TestREADMEListsEveryFlag(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	a := &app{stdout: os.Stdout, stderr: os.Stderr}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "completion" || c.Name() == "help" {
			return
		}
		if c.HasParent() && !strings.Contains(text, c.Name()) {
			t.Errorf("command %q is not in the README", c.CommandPath())
		}
		check := func(f *pflag.Flag) {
			if f.Name == "help" || f.Hidden {
				return
			}
			if !strings.Contains(text, "--"+f.Name) {
				t.Errorf("%s: flag --%s is not in the README's configuration reference", c.CommandPath(), f.Name)
			}
		}
		c.LocalFlags().VisitAll(check)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(a.rootCmd())
}
