package glustertest_test

import (
	"testing"

	"cairnfs.dev/cairn/internal/dfstest"
	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/glustertest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

func TestMain(m *testing.M) { glustertest.Main(m) }

func localFS(t testing.TB, d string) layer.FS {
	t.Helper()
	l, err := local.New(d)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestModel runs the data and namespace models on null, crypt, zstd, union
// and shard stacks (dfstest.Model) over directories of the two-brick
// distribute volume: its files are spread over two bricks by name hash, so
// renames move names between bricks (DHT's link files), as on a real
// GlusterFS cluster. renameat2's flags are left out: GlusterFS's FUSE
// client has none (RENAME_NOREPLACE and RENAME_EXCHANGE get EINVAL, through
// cairn as on the GlusterFS mount itself).
func TestModel(t *testing.T) {
	dfstest.Model(t, func(t *testing.T) string { return glustertest.Dir(t, "two") }, fsx.TreeConfig{NoRenameFlags: true})
}
