// Package deploy holds fleetpace's deployment files and the tests that check
// them: systemd units (a service for `fleetpace worker`, a service and timer
// for `fleetpace scan`), the script that builds the container image
// (../Containerfile), a Compose file and Kubernetes manifests. The tests
// parse every unit and YAML file and check the settings a fleet depends on
// against the fleetpace binary itself, run `systemd-analyze verify` where it
// exists, and build the image with podman. There is no Go code to import;
// see README.md in this directory.
package deploy
