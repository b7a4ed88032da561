package cli

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleetpace/fleetpace/redact"
)

// Settings from the environment. A flag that a unit file or a container spec
// would set can be given as FLEETPACE_ + its name in upper snake case
// (--http-addr: FLEETPACE_HTTP_ADDR). Which flags have one:
//
//   - every global flag (the root's persistent flags), for every command;
//   - every flag of the commands a service runs: envCommands (the
//     dashboard's --admin-token is best given as FLEETPACE_ADMIN_TOKEN,
//     out of the process list).
//
// The flags of per-invocation commands (`sources add --url`, `platforms set
// --rate`, `status --json`, …) have none: a variable left in a shell or a
// container spec must not quietly change what an operator types.
//
// The command line wins; a variable applies only to a flag not given on it.
// Variables are read after parsing, through the flag's own Set, so a value
// means what it means on the command line, and a flag added to one of these
// commands later gets its variable without further code. A variable set to
// the empty string counts as set (FLEETPACE_HTTP_ADDR= turns the worker's
// HTTP server off).
const envPrefix = "FLEETPACE_"

// envCommands are the commands, by path below the root, whose own flags are
// read from the environment too.
var envCommands = []string{"worker", "drain", "scan", "dashboard"}

// envAliases are variables read for a flag after its FLEETPACE_ one, in
// order: the first variable that is set wins.
var envAliases = map[string][]string{
	"database-url": {"DATABASE_URL"},
}

// envVar is the FLEETPACE_ variable of a flag.
func envVar(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// envVars returns the variables read for flag f of cmd, first wins; nil when
// f has none.
func envVars(root, cmd *cobra.Command, f *pflag.Flag) []string {
	if f.Name == "help" || f.Name == "version" || f.Hidden {
		return nil // hidden flags are for tests: no variable may set them
	}
	global := root.PersistentFlags().Lookup(f.Name) == f
	own := slices.Contains(envCommands, strings.TrimPrefix(cmd.CommandPath(), root.Name()+" ")) &&
		cmd.LocalFlags().Lookup(f.Name) == f
	if !global && !own {
		return nil
	}
	return append([]string{envVar(f.Name)}, envAliases[f.Name]...)
}

// fromEnv records a flag value taken from the environment.
type fromEnv struct {
	variable, value string
}

// bindEnv gives the command tree under root its environment variables: it
// names each variable in the flag's help, and makes every command read the
// variables of its flags not given on the command line before it runs. Call
// it once the tree is complete.
func bindEnv(root *cobra.Command) {
	var (
		done bool
		used = map[string]fromEnv{} // flag name → where its value came from
	)
	apply := func(cmd *cobra.Command) error {
		if done || skipEnv(cmd) {
			return nil
		}
		done = true
		var err error
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if err != nil || f.Changed {
				return
			}
			for _, name := range envVars(root, cmd, f) {
				v, ok := os.LookupEnv(name)
				if !ok {
					continue
				}
				if serr := cmd.Flags().Set(f.Name, v); serr != nil {
					var ive *pflag.InvalidValueError
					if errors.As(serr, &ive) {
						serr = ive.Unwrap()
					}
					err = usagef("%s: not a valid value for --%s: %s", shown(name, f.Name, v), f.Name, redact.Text(serr.Error()))
					return
				}
				used[f.Name] = fromEnv{name, v}
				return
			}
		})
		return err
	}
	// explain adds, to a usage error about a flag whose value came from the
	// environment, which variable set it: the checks that run later (ranges,
	// combinations, URL syntax) name only the flag.
	explain := func(err error) error {
		if err == nil || exitCode(err) != ExitUsage {
			return err
		}
		msg := flagMessage(err) // library fields named by their flags
		var notes []string
		for flag, src := range used {
			switch {
			case flag == "database-url" && errors.Is(err, redact.ErrInvalidDatabaseURL):
				// The message shows the URL as far as it may be shown.
				notes = append(notes, fmt.Sprintf("--%s set by %s", flag, src.variable))
			case mentionsFlag(msg, flag):
				notes = append(notes, fmt.Sprintf("--%s set by %s", flag, shown(src.variable, flag, src.value)))
			}
		}
		if len(notes) == 0 {
			return err
		}
		slices.Sort(notes)
		// The notes first: whatever follows a database URL in a message is
		// not printed (redact.Text).
		return fmt.Errorf("%s: %w", strings.Join(notes, ", "), err)
	}

	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if vars := envVars(root, c, f); vars != nil && !strings.Contains(f.Usage, "[env ") {
				f.Usage += " [env " + strings.Join(vars, " or ") + "]"
			}
		})
		// cobra runs the nearest persistent pre-run only: wrap each, so the
		// environment is read before any of them looks at a flag.
		if c == root || c.PersistentPreRunE != nil || c.PersistentPreRun != nil {
			pre, preE := c.PersistentPreRun, c.PersistentPreRunE
			c.PersistentPreRun = nil
			c.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
				if err := apply(cmd); err != nil {
					return err
				}
				switch {
				case preE != nil:
					return explain(preE(cmd, args))
				case pre != nil:
					pre(cmd, args)
				}
				return nil
			}
		}
		if run := c.RunE; run != nil {
			c.RunE = func(cmd *cobra.Command, args []string) error { return explain(run(cmd, args)) }
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// skipEnv reports commands that never read the environment: help and shell
// completion must work whatever the environment holds.
func skipEnv(cmd *cobra.Command) bool {
	for c := cmd; c != nil; c = c.Parent() {
		switch c.Name() {
		case "help", "completion", cobra.ShellCompRequestCmd, cobra.ShellCompNoDescRequestCmd:
			return true
		}
	}
	return false
}

// mentionsFlag reports whether msg names --flag (not a longer flag that
// starts with the same name).
func mentionsFlag(msg, flag string) bool {
	return regexp.MustCompile(`--` + regexp.QuoteMeta(flag) + `\b(?:[^-]|$)`).MatchString(msg)
}

// secretFlags are the flags whose values are never printed, not even in
// the message about a bad one.
var secretFlags = map[string]bool{"admin-token": true}

// shown is how an environment variable setting a flag is named in a
// message: NAME="value", its secrets removed (redact.Text), or NAME alone
// for a secret flag.
func shown(variable, flag, value string) string {
	if secretFlags[flag] {
		return variable
	}
	return fmt.Sprintf("%s=%q", variable, redact.Text(value))
}
