package glustertest_test

import (
	"testing"

	"cairnfs.dev/cairn/internal/dfstest"
	"cairnfs.dev/cairn/internal/glustertest"
)

// TestCloseToOpen: two clients of one volume (mounted with the Shared
// options), each with a cairn stack over the same directory mounted with
// -shared, write and read in turns (close, then open on the other side) and
// never see wrong bytes, stale sizes or EIO: null, crypt and zstd.
func TestCloseToOpen(t *testing.T) {
	dfstest.Stacks(t, glustertest.Mount(t, "one", glustertest.Shared...), glustertest.Mount(t, "one", glustertest.Shared...))
}

// TestCloseToOpenRaw is the same on the GlusterFS mounts themselves: what
// GlusterFS's client gives with the Shared options (without
// --fopen-keep-cache=off it keeps stale pages of a file rewritten in place
// by another client across opens).
func TestCloseToOpenRaw(t *testing.T) {
	dfstest.Raw(t, glustertest.Mount(t, "one", glustertest.Shared...), glustertest.Mount(t, "one", glustertest.Shared...))
}

// TestSharedDirs: directories that one machine renames, or removes and
// makes again, are seen as they are now by the other, with -shared.
func TestSharedDirs(t *testing.T) {
	dfstest.SharedDirs(t, glustertest.Mount(t, "one", glustertest.Shared...), glustertest.Mount(t, "one", glustertest.Shared...))
}

func TestOneWriterPerFile(t *testing.T) {
	dfstest.OneWriterPerFile(t, glustertest.Mount(t, "one", glustertest.Shared...), glustertest.Mount(t, "one", glustertest.Shared...))
}
