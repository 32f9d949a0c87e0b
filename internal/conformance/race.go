//go:build linux && race

package conformance

// The race detector slows the model runs several times: they run fewer
// operations under it.
const raceEnabled = true
