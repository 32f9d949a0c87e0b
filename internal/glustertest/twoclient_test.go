package glustertest_test

import (
	"testing"

	"cairnfs.dev/cairn/internal/dfstest"
	"cairnfs.dev/cairn/internal/glustertest"
)

// TestClaimAcrossClients: a second `cairn mount` of a crypt or zstd stack
// from another GlusterFS client of the volume (as from another machine) is
// refused, unless both are -shared (dfstest.ClaimAcrossClients): the lock of
// a regular file of the lower root reaches the brick.
func TestClaimAcrossClients(t *testing.T) {
	dfstest.ClaimAcrossClients(t, glustertest.Mount(t, "one"), glustertest.Mount(t, "one"))
}
