package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	t.Parallel()
	const rev = "91c5532f00d1e2a3b4c5d6e7f8091a2b3c4d5e6f"
	vcs := []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}
	main := func(v string, settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: modulePath, Version: v}, Settings: settings}
	}
	tests := []struct {
		name               string
		bi                 *debug.BuildInfo
		stampedV, stampedR string
		want               Info
	}{
		{"no build info", nil, "", "", Info{Version: "dev", GoVersion: runtime.Version()}},
		{"no build info, stamped", nil, "v1.2.3", "abc", Info{Version: "v1.2.3", Revision: "abc", GoVersion: runtime.Version()}},
		{"devel", main("(devel)"), "", "", Info{Version: "dev", GoVersion: "go1.26.8"}},
		{"empty", main(""), "", "", Info{Version: "dev", GoVersion: "go1.26.8"}},
		{"go install @version", main("v1.4.0"), "", "", Info{Version: "v1.4.0", GoVersion: "go1.26.8"}},
		{"pseudo-version of a modified tree", main("v0.0.0-20260520101010-91c5532f00d1+dirty", vcs...), "", "",
			Info{Version: "v0.0.0-20260520101010-91c5532f00d1", Revision: rev, Modified: true, GoVersion: "go1.26.8"}},
		{"stamp wins", main("v1.4.0", vcs...), "v1.2.3", "", Info{Version: "v1.2.3", Revision: rev, Modified: true, GoVersion: "go1.26.8"}},
		{"stamped revision wins", main("v1.4.0", vcs...), "", "deadbeef", Info{Version: "v1.4.0", Revision: "deadbeef", Modified: true, GoVersion: "go1.26.8"}},
		{"as a dependency", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/app", Version: "v9.9.9"},
			Deps: []*debug.Module{{Path: "example.com/other", Version: "v0.1.0"}, {Path: modulePath, Version: "v1.5.0"}}}, "", "",
			Info{Version: "v1.5.0", GoVersion: "go1.26.8"}},
		{"as a replaced dependency", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: modulePath, Version: "v1.5.0", Replace: &debug.Module{Path: "example.com/fork", Version: "v1.5.1"}}}}, "", "",
			Info{Version: "v1.5.1", GoVersion: "go1.26.8"}},
		{"not in the binary", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "example.com/app", Version: "v9.9.9"}}, "", "",
			Info{Version: "dev", GoVersion: "go1.26.8"}},
	}
	for _, tt := range tests {
		if got := fromBuildInfo(tt.bi, tt.stampedV, tt.stampedR); got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestString(t *testing.T) {
	t.Parallel()
	platform := runtime.GOOS + "/" + runtime.GOARCH
	tests := []struct {
		in   Info
		want string
	}{
		{Info{Version: "v1.2.3", Revision: "91c5532f00d1", Modified: true, GoVersion: "go1.26.8"}, "v1.2.3 (rev 91c5532, modified) go1.26.8 " + platform},
		{Info{Version: "v1.2.3", Revision: "91c5532f00d1", GoVersion: "go1.26.8"}, "v1.2.3 (rev 91c5532) go1.26.8 " + platform},
		{Info{Version: "dev", GoVersion: "go1.26.8"}, "dev go1.26.8 " + platform},
		{Info{Version: "dev", Revision: "abc", GoVersion: "go1.26.8"}, "dev (rev abc) go1.26.8 " + platform},
	}
	for _, tt := range tests {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("%+v: got %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestReadInTest: a test binary is not the fleetpace program, but Read still
// answers with the toolchain that built it and never an empty version.
func TestReadInTest(t *testing.T) {
	t.Parallel()
	i := Read()
	if i.Version == "" || i.GoVersion != runtime.Version() {
		t.Fatalf("Read() = %+v", i)
	}
}
