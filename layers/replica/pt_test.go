//go:build linux

package replica_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/replica"
)

// TestReplicaReadsPassedThrough: through a mount, the reads of read-only
// files do not reach the layer (the kernel reads the replica's file).
func TestReplicaReadsPassedThrough(t *testing.T) {
	dirs := lowers(t, 2)
	for _, d := range dirs {
		os.WriteFile(filepath.Join(d, "f"), bytes.Repeat([]byte{'a'}, 1<<20), 0o644)
	}
	var counted []*mounttest.IOCounter
	var ls []layer.FS
	for _, d := range dirs {
		c := mounttest.CountIO(localFS(t, d))
		counted = append(counted, c)
		ls = append(ls, c)
	}
	r := build(t, replica.Options{Policy: replica.RoundRobin}, ls...)
	for _, c := range counted {
		c.Reads.Store(0) // the first mount's comparison of the trees
	}
	m := mounttest.Mount(t, r)
	for range 4 {
		if b, err := os.ReadFile(m.Path("f")); err != nil || len(b) != 1<<20 {
			t.Fatalf("read: %d bytes, %v", len(b), err)
		}
	}
	for i, c := range counted {
		if n := c.Reads.Load(); n != 0 {
			t.Errorf("replica %d served %d reads through the layer: not passed through", i+1, n)
		}
	}
}
