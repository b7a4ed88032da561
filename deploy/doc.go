// Package deploy holds fleetpace's systemd units (a service for `fleetpace
// worker`, a service and timer for `fleetpace scan`) and the tests that check
// them: they parse as unit files with the keys fleetpace relies on, and pass
// `systemd-analyze verify` where that tool exists. There is no Go code to
// import; see README.md in this directory.
package deploy
