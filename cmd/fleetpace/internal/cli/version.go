package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/fleetpace/fleetpace/internal/buildinfo"
)

// versionLine is what `fleetpace version` and `fleetpace --version` print:
// "fleetpace v1.2.3 (rev 91c5532, modified) go1.26.8 linux/amd64".
func versionLine() string { return "fleetpace " + buildinfo.Read().String() }

// addVersion registers `fleetpace version` and the root's --version flag.
func (a *app) addVersion(root *cobra.Command) {
	root.Version = buildinfo.Read().String()
	root.SetVersionTemplate("fleetpace {{.Version}}\n")
	root.Flags().BoolP("version", "v", false, "print the version and exit (same as the version command)")
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print fleetpace's version, the VCS revision it was built from and the Go toolchain",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(a.stdout, versionLine())
			return err
		},
	})
}
