// Package null is the null layer (Wrapfs): it forwards every operation
// unchanged and exists so that the cost of stacking can be measured.
package null

import "cairnfs.dev/cairn/layer"

// FS is a null layer over one lower layer. It changes nothing, and keeps
// the writeback cache (layer.FSWriteback) when its lower does.
type FS struct {
	layer.Base
}

// New stacks a null layer over lower.
func New(lower layer.FS) *FS { return &FS{layer.Base{Lower: lower}} }
