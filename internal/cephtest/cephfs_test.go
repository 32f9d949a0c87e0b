package cephtest_test

import (
	"testing"

	"cairnfs.dev/cairn/internal/cephtest"
	"cairnfs.dev/cairn/internal/dfstest"
	"cairnfs.dev/cairn/internal/fsx"
)

func TestMain(m *testing.M) { cephtest.Main(m) }

// TestModel runs the data and namespace models on null, crypt, zstd, union
// and shard stacks (dfstest.Model) over directories of the CephFS file
// system, each through a ceph-fuse client of its own. renameat2's flags are
// left out: ceph-fuse 16.2 answers EINVAL to any (through cairn as on the
// ceph-fuse mount itself; RENAME_NOREPLACE onto an existing name gets
// EEXIST from the kernel before ceph-fuse is asked). So are directories'
// link counts: CephFS counts a directory's subdirectories lazily, and after
// one is renamed out of it the count lags for up to 5 s (on the ceph-fuse
// mount itself; shard, which caches the count it adds up from its buckets,
// keeps such a stale count until a subdirectory of it changes again:
// docs/distributed.md).
func TestModel(t *testing.T) {
	cephtest.Need(t)
	dfstest.Model(t, func(t *testing.T) string { return cephtest.Dir(t) }, fsx.TreeConfig{NoRenameFlags: true, NoDirNlink: true})
}

// TestClaimAcrossClients: a second `cairn mount` of a crypt or zstd stack
// through another ceph-fuse client (as from another machine) is refused,
// unless both are -shared (dfstest.ClaimAcrossClients): the lock of a
// regular file of the lower root reaches the MDS.
func TestClaimAcrossClients(t *testing.T) {
	dfstest.ClaimAcrossClients(t, cephtest.Mount(t), cephtest.Mount(t))
}

// TestClaimExclusiveAcrossClients: a second `cairn mount` of a union,
// shard, chains or replica stack through another ceph-fuse client is
// refused, with -shared too, and hand-over works
// (dfstest.ClaimExclusiveAcrossClients).
func TestClaimExclusiveAcrossClients(t *testing.T) {
	dfstest.ClaimExclusiveAcrossClients(t, cephtest.Mount(t), cephtest.Mount(t))
}

// TestCloseToOpen: two ceph-fuse clients of the file system (mounted with
// the Shared options), each with a
// cairn stack over the same directory mounted with -shared, write and read
// in turns (close, then open on the other side) and never see wrong bytes,
// stale sizes or EIO: null, crypt and zstd.
func TestCloseToOpen(t *testing.T) {
	dfstest.Stacks(t, cephtest.Mount(t, cephtest.Shared...), cephtest.Mount(t, cephtest.Shared...))
}

// TestCloseToOpenRaw is the same on the two ceph-fuse mounts themselves:
// what ceph-fuse gives with the Shared options.
func TestCloseToOpenRaw(t *testing.T) {
	dfstest.Raw(t, cephtest.Mount(t, cephtest.Shared...), cephtest.Mount(t, cephtest.Shared...))
}

// TestSharedDirs: directories that one machine renames, or removes and
// makes again, are seen as they are now by the other, with -shared.
func TestSharedDirs(t *testing.T) {
	dfstest.SharedDirs(t, cephtest.Mount(t, cephtest.Shared...), cephtest.Mount(t, cephtest.Shared...))
}

func TestOneWriterPerFile(t *testing.T) {
	dfstest.OneWriterPerFile(t, cephtest.Mount(t, cephtest.Shared...), cephtest.Mount(t, cephtest.Shared...))
}
