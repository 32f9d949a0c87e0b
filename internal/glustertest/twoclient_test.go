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

// TestClaimExclusiveAcrossClients: a second `cairn mount` of a union,
// shard, chains or replica stack from another GlusterFS client of the
// volume is refused, with -shared too, and hand-over works
// (dfstest.ClaimExclusiveAcrossClients): the lock of a regular file of
// each lower reaches the brick.
func TestClaimExclusiveAcrossClients(t *testing.T) {
	dfstest.ClaimExclusiveAcrossClients(t, glustertest.Mount(t, "one"), glustertest.Mount(t, "one"))
}
