//go:build linux && !race

package conformance

const raceEnabled = false
