// Package version names the fleetpace build that is running: the module
// version from the binary's build information.
package version

import "runtime/debug"

// modulePath is fleetpace's module path.
const modulePath = "github.com/fleetpace/fleetpace"

// Module is fleetpace's module version ("v1.2.3"), or "dev" for a build
// without one (go run, go test, a checkout).
var Module = module()

func module() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	v := ""
	if info.Main.Path == modulePath {
		v = info.Main.Version
	} else {
		for _, d := range info.Deps {
			if d.Path == modulePath {
				v = d.Version
			}
		}
	}
	if v == "" || v == "(devel)" {
		return "dev"
	}
	return v
}
