// Package buildinfo says which fleetpace a binary is: its version, the VCS
// revision it was built from, and the Go toolchain, for `fleetpace version`
// and the fetcher's User-Agent.
//
// The version comes from the Go build information (the module version of a
// `go install …@v1.2.3` build, or the pseudo-version Go derives from the
// repository's tags) unless it was stamped at link time, which release and
// image builds do:
//
//	go build -ldflags "-X github.com/fleetpace/fleetpace/internal/buildinfo.version=v1.2.3" ./cmd/fleetpace
//
// The revision can be stamped the same way (…/buildinfo.revision=…) for
// builds made outside a git checkout, where Go records no VCS settings.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// modulePath is fleetpace's module path, looked up in the build information.
const modulePath = "github.com/fleetpace/fleetpace"

// Set at link time with -X; empty means "from the build information".
var (
	version  string
	revision string
)

// Info is what a binary knows about its own build.
type Info struct {
	// Version is the stamped or module version, "dev" when unknown (a
	// `go run` or a build outside any module version).
	Version string
	// Revision is the full VCS revision, "" when unknown.
	Revision string
	// Modified reports uncommitted changes in the working tree at build time.
	Modified bool
	// GoVersion is the toolchain that built the binary ("go1.26.8").
	GoVersion string
}

// Read returns the running binary's build information.
func Read() Info {
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi, version, revision)
}

// fromBuildInfo is Read with its inputs given: bi may be nil, stamped
// values win over recorded ones.
func fromBuildInfo(bi *debug.BuildInfo, stampedVersion, stampedRevision string) Info {
	info := Info{Version: stampedVersion, Revision: stampedRevision, GoVersion: runtime.Version()}
	if bi == nil {
		if info.Version == "" {
			info.Version = "dev"
		}
		return info
	}
	if bi.GoVersion != "" {
		info.GoVersion = bi.GoVersion
	}
	if info.Version == "" {
		info.Version = moduleVersion(bi)
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if info.Revision == "" {
				info.Revision = s.Value
			}
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// moduleVersion is fleetpace's module version in bi: the main module's when
// fleetpace is the program, the dependency's when it is a library of another
// program. "(devel)" and an empty version read "dev". Go's pseudo-versions
// for modified trees end in "+dirty"; that is said by Modified instead.
func moduleVersion(bi *debug.BuildInfo) string {
	v := ""
	if bi.Main.Path == modulePath {
		v = bi.Main.Version
	} else {
		for _, d := range bi.Deps {
			if d.Path == modulePath {
				v = d.Version
				if d.Replace != nil && d.Replace.Version != "" {
					v = d.Replace.Version
				}
			}
		}
	}
	v = strings.TrimSuffix(v, "+dirty")
	if v == "" || v == "(devel)" {
		return "dev"
	}
	return v
}

// Version is the running binary's version ("v1.2.3", a pseudo-version, or
// "dev").
func Version() string { return Read().Version }

// Revision is the VCS revision the running binary was built from, "" when
// unknown.
func Revision() string { return Read().Revision }

// Modified reports whether the working tree had uncommitted changes when the
// running binary was built.
func Modified() bool { return Read().Modified }

// GoVersion is the Go toolchain that built the running binary.
func GoVersion() string { return Read().GoVersion }

// String is one line for humans:
// "v1.2.3 (rev 91c5532, modified) go1.26.8 linux/amd64". The revision part
// is left out when unknown.
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	if i.Revision != "" {
		rev := i.Revision
		if len(rev) > 7 {
			rev = rev[:7]
		}
		b.WriteString(" (rev " + rev)
		if i.Modified {
			b.WriteString(", modified")
		}
		b.WriteString(")")
	}
	b.WriteString(" " + i.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH)
	return b.String()
}
