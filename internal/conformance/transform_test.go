//go:build linux

package conformance_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/codec"
)

// TestTransformChain: a file written through the kernel into a chain of
// two transforms (zstd, then crypt's content) is stored in the lower under
// its own name, encrypted in crypt's format; decrypted by crypt's content
// alone it is a file of the codec format, which the zstd layer over that
// reads back as written. The transforms keep their formats whether they
// are a layer or a link of a chain; crypt's journal stays out of sight.
func TestTransformChain(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	l := lower(t, d)
	mid := layer.NewTransformed(l, cryptContent(t, l))
	z, err := codec.NewEngine(mid, "zstd", codec.Options{Level: 1})
	if err != nil {
		t.Fatal(err)
	}
	top := layer.NewTransformed(mid, z)
	t.Cleanup(func() { layer.CloseStack(top) })
	m := mounttest.Mount(t, top)

	want := []byte(strings.Repeat("a chain of transforms, one file at a time. ", 5000))
	if err := os.Mkdir(m.Path("dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("dir", "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	// A rewrite in place inside a block: crypt journals it.
	f, err := os.OpenFile(m.Path("dir", "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("CHAIN"), 70000); err != nil {
		t.Fatal(err)
	}
	copy(want[70000:], "CHAIN")
	// While the file is open its journal is in the lower, not in the mount.
	if _, err := os.Stat(filepath.Join(d, ".cairn-journal")); err != nil {
		t.Fatalf("no journal of the rewrite in the lower: %v", err)
	}
	ents, err := os.ReadDir(m.Dir)
	if err != nil || len(ents) != 1 || ents[0].Name() != "dir" {
		t.Fatalf("root lists %v (%v), want only dir", ents, err)
	}
	if _, err := os.Stat(m.Path(".cairn-journal")); !os.IsNotExist(err) {
		t.Fatalf("the journal is seen through the mount: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(m.Path("dir", "f")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back through the mount: %d bytes, %v", len(got), err)
	}
	if st, err := os.Stat(m.Path("dir", "f")); err != nil || st.Size() != int64(len(want)) {
		t.Fatalf("stat: %v %v", st, err)
	}
	stored, err := os.ReadFile(filepath.Join(d, "dir", "f"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(stored, []byte("cairnc")) || bytes.Contains(stored, []byte("chain of transforms")) {
		t.Fatalf("the lower file is not crypt's: % x", stored[:16])
	}
	enc, err := layer.ReadFile(ctx, mid, "dir/f")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(enc, []byte("CZF")) || len(enc) >= len(want)/4 {
		t.Fatalf("decrypted, the file is not the codec's (%d bytes): % x", len(enc), enc[:8])
	}
	m.Unmount()
	zl, err := codec.New(mid, "zstd", codec.Options{Level: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := layer.ReadFile(ctx, zl, "dir/f"); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read by the zstd layer over crypt's content: %d bytes, %v", len(got), err)
	}
}
