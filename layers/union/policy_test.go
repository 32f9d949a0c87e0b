//go:build linux

package union_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/layers/union"
)

// smallFS mounts a tmpfs of size MiB on a new directory.
func smallFS(t *testing.T, mib int) string {
	d := t.TempDir()
	if err := syscall.Mount("cairn-union-test", d, "tmpfs", 0, "size="+strconv.Itoa(mib)+"m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(d, syscall.MNT_DETACH) })
	return d
}

func mountRW2(t *testing.T, a, b string, minFree uint64, o union.Options) *mounttest.Mounted {
	u, err := union.New([]fanout.Branch{
		{FS: localFS(t, a), Mode: fanout.RW, MinFree: minFree},
		{FS: localFS(t, b), Mode: fanout.RW, MinFree: minFree},
	}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(u) })
	return mounttest.Mount(t, u)
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// TestUnionMinFreeSpace: with ff, new files go to the first branch until
// it has less than minfreespace left, then to the second.
func TestUnionMinFreeSpace(t *testing.T) {
	a, b := smallFS(t, 16), smallFS(t, 16)
	m := mountRW2(t, a, b, 8<<20, union.Options{})
	if err := os.WriteFile(m.Path("one"), make([]byte, 10<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("two"), []byte("2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(a, "one")) || !exists(filepath.Join(b, "two")) || exists(filepath.Join(a, "two")) {
		t.Fatal("ff with minfreespace: one should be on the first branch, two on the second")
	}
	// mfs puts a file where there is most room.
	c, d := smallFS(t, 16), smallFS(t, 32)
	m2 := mountRW2(t, c, d, 0, union.Options{Policy: fanout.Policies["mfs"]})
	if err := os.WriteFile(m2.Path("x"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if exists(filepath.Join(c, "x")) || !exists(filepath.Join(d, "x")) {
		t.Fatal("mfs did not choose the branch with most free space")
	}
}

// TestUnionMoveOnENOSPC: a file that fills its branch moves, with its
// bytes, to the branch with room, and the write goes on there.
func TestUnionMoveOnENOSPC(t *testing.T) {
	a, b := smallFS(t, 16), smallFS(t, 16)
	m := mountRW2(t, a, b, 0, union.Options{MoveOnENOSPC: true})
	if err := os.WriteFile(m.Path("filler"), make([]byte, 12<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("moving on "), 800<<10) // 8 MB: more than the first branch has left
	f, err := os.Create(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(want); off += 1 << 20 {
		if _, err := f.Write(want[off:min(off+1<<20, len(want))]); err != nil {
			t.Fatalf("write at %d: %v", off, err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(m.Path("f"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(want))
	}
	if exists(filepath.Join(a, "f")) || !exists(filepath.Join(b, "f")) {
		t.Fatal("the file did not move to the second branch")
	}
	// Without the option, ENOSPC reaches the writer.
	c, d := smallFS(t, 16), smallFS(t, 16)
	m2 := mountRW2(t, c, d, 0, union.Options{})
	os.WriteFile(m2.Path("filler"), make([]byte, 12<<20), 0o644)
	if err := os.WriteFile(m2.Path("f"), want, 0o644); err == nil {
		t.Fatal("a write past the branch's space succeeded without moveonenospc")
	}
}

// TestUnionBranchTurnsReadOnly: a RW branch remounted read-only under the
// mount gives EROFS for a new file and a log line naming the branch; reads
// go on.
func TestUnionBranchTurnsReadOnly(t *testing.T) {
	a, lo := smallFS(t, 16), t.TempDir()
	write(t, filepath.Join(lo, "f"), "lower\n")
	m := mountUnion(t, a, lo)
	if err := syscall.Mount("", a, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Mount("", a, "", syscall.MS_REMOUNT, "")
	if err := os.WriteFile(m.Path("new"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("create on a read-only RW branch: %v, want EROFS", err)
	}
	if err := os.WriteFile(m.Path("f"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("copy-up to a read-only RW branch: %v, want EROFS", err)
	}
	if got := read(t, m.Path("f")); got != "lower\n" {
		t.Fatalf("read: %q", got)
	}
}

// TestUnionRemoveEverywhere: on writable branches, a removed name goes
// from every branch (as mergerfs removes it), with no whiteout left; a
// directory on both goes from both.
func TestUnionRemoveEverywhere(t *testing.T) {
	a, b := smallFS(t, 16), smallFS(t, 16)
	for _, d := range []string{a, b} {
		write(t, filepath.Join(d, "f"), "f")
		write(t, filepath.Join(d, "dir", "x"), "x")
	}
	m := mountRW2(t, a, b, 0, union.Options{})
	if err := os.Remove(m.Path("f")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(m.Path("dir")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{a, b} {
		for _, n := range []string{"f", "dir"} {
			if exists(filepath.Join(d, n)) {
				t.Errorf("%s is left in branch %s", n, d)
			}
		}
	}
	if _, err := os.Stat(m.Path("f")); !os.IsNotExist(err) {
		t.Fatalf("f after its removal: %v", err)
	}
}

// TestUnionCopyUpFullDisk: a copy-up to a full upper branch gives ENOSPC,
// leaves no part of the copy behind, and the file still reads as the
// original.
func TestUnionCopyUpFullDisk(t *testing.T) {
	up, lo := smallFS(t, 16), t.TempDir()
	want := bytes.Repeat([]byte("lower "), 1<<20) // 6 MiB
	if err := os.WriteFile(filepath.Join(lo, "big"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(up, "filler"), make([]byte, 12<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	m := mountUnion(t, up, lo)
	f, err := os.OpenFile(m.Path("big"), os.O_WRONLY|os.O_APPEND, 0)
	if err == nil {
		f.Close()
		t.Fatal("a copy-up larger than the upper's free space succeeded")
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("copy-up to a full branch: %v, want ENOSPC", err)
	}
	if got, err := os.ReadFile(m.Path("big")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the file after a failed copy-up: %d bytes, %v", len(got), err)
	}
	left, _ := os.ReadDir(up)
	if len(left) != 1 {
		t.Fatalf("the upper branch holds %v after a failed copy-up", left)
	}
}
