//go:build linux

package pack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/local"
)

// newStack stacks pack (and zstd over it, if withCodec) over lower.
func newStack(t *testing.T, lower string, withCodec bool, o Options) (layer.FS, *FS) {
	t.Helper()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	var top layer.FS = p
	if withCodec {
		c, err := codec.New(p, "zstd", codec.Options{Level: 3, FastTails: true, FoldDelay: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		top = c
	}
	if err := layer.ClaimStack(context.Background(), top); err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			layer.CloseStack(top)
		}
	})
	_ = closed
	return top, p
}

// lowerRef reads the ref of a lower file (ok false: none).
func lowerRef(t *testing.T, path string) (ref, bool) {
	t.Helper()
	r, ok, err := lowerRefErr(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return r, ok
}

func lowerRefNoFail(path string) (ref, bool) {
	r, ok, _ := lowerRefErr(path)
	return r, ok
}

func lowerRefErr(path string) (ref, bool, error) {
	b := make([]byte, 64)
	n, err := unix.Lgetxattr(path, XattrName, b)
	if err == unix.ENODATA {
		return ref{}, false, nil
	}
	if err != nil {
		return ref{}, false, err
	}
	r, err := decodeRef(b[:n])
	return r, err == nil, err
}

// waitPacked waits until the lower files at paths are packed.
func waitPacked(t *testing.T, paths ...string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for _, p := range paths {
		for {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				t.Fatal(err)
			}
			// (A truncation sets the size before it frees the blocks: a
			// stat in between sees size 0 and the old blocks.)
			if _, ok := lowerRef(t, p); ok && st.Size == 0 && st.Blocks == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not packed after 15 s (size %d, %d blocks)", p, st.Size, st.Blocks)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func smallFiles(r *rand.Rand, n int) map[string][]byte {
	files := map[string][]byte{}
	for i := range n {
		dir := []string{"", "a", "a/b"}[i%3]
		size := 1 + r.IntN(2500)
		b := make([]byte, size)
		for j := range b {
			b[j] = "abcdefgh \n"[r.IntN(10)]
		}
		files[filepath.Join(dir, fmt.Sprintf("f%02d", i))] = b
	}
	return files
}

func writeTree(t *testing.T, root string, files map[string][]byte) {
	t.Helper()
	for name, b := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755)
		if err := os.WriteFile(filepath.Join(root, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func checkTree(t *testing.T, root string, files map[string][]byte) {
	t.Helper()
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: read %d bytes back, want %d (%q...)", name, len(got), len(want), got[:min(len(got), 20)])
		}
		st, err := os.Stat(filepath.Join(root, name))
		if err != nil || st.Size() != int64(len(want)) {
			t.Fatalf("%s: stat size %d, %v, want %d", name, st.Size(), err, len(want))
		}
	}
}

// TestPackedAtRest: small files written through pack:DIR and zstd:pack:DIR
// are packed once left alone: the lower files are empty, carry a ref and
// take no block, each directory has a pack the mount does not list; they
// read back the same, with their sizes, then and after a remount.
func TestPackedAtRest(t *testing.T) {
	for _, withCodec := range []bool{false, true} {
		t.Run(map[bool]string{false: "pack", true: "zstd-pack"}[withCodec], func(t *testing.T) {
			lower := t.TempDir()
			top, _ := newStack(t, lower, withCodec, Options{Delay: 100 * time.Millisecond})
			m := mounttest.Mount(t, top)
			files := smallFiles(rand.New(rand.NewPCG(1, 2)), 30)
			big := make([]byte, 200<<10)
			rb := rand.New(rand.NewPCG(3, 4))
			for i := range big {
				big[i] = byte(rb.Uint32())
			}
			files["a/big"] = big
			files["empty"] = nil
			writeTree(t, m.Dir, files)
			m.WaitReleased(t)
			var small []string
			for name, b := range files {
				if len(b) > 0 && name != "a/big" {
					small = append(small, filepath.Join(lower, name))
				}
			}
			waitPacked(t, small...)
			for _, d := range []string{"", "a", "a/b"} {
				if _, err := os.Stat(filepath.Join(lower, d, packName(0))); err != nil {
					t.Fatalf("no pack in %q: %v", d, err)
				}
				ents, err := os.ReadDir(filepath.Join(m.Dir, d))
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range ents {
					if strings.HasPrefix(e.Name(), ".cairn-") {
						t.Fatalf("the mount lists %s in %q", e.Name(), d)
					}
				}
			}
			if _, ok := lowerRef(t, filepath.Join(lower, "a/big")); ok {
				t.Fatal("a big file was packed")
			}
			checkTree(t, m.Dir, files)
			var st unix.Stat_t
			unix.Stat(filepath.Join(m.Dir, "f00"), &st)
			if !withCodec && st.Blocks != (st.Size+511)/512 {
				t.Fatalf("a packed file says %d blocks for %d bytes", st.Blocks, st.Size)
			}
			m.Unmount()
			layer.CloseStack(top)
			top2, _ := newStack(t, lower, withCodec, Options{Delay: 100 * time.Millisecond})
			m2 := mounttest.Mount(t, top2)
			checkTree(t, m2.Dir, files)
		})
	}
}

// packedMount mounts pack:DIR with a short delay and files packed.
func packedMount(t *testing.T, o Options, files map[string][]byte) (string, *mounttest.Mounted, *FS) {
	t.Helper()
	lower := t.TempDir()
	if o.Delay == 0 {
		o.Delay = 50 * time.Millisecond
	}
	top, p := newStack(t, lower, false, o)
	m := mounttest.Mount(t, top)
	writeTree(t, m.Dir, files)
	m.WaitReleased(t)
	var paths []string
	for name, b := range files {
		if len(b) > 0 {
			paths = append(paths, filepath.Join(lower, name))
		}
	}
	waitPacked(t, paths...)
	return lower, m, p
}

func unpacked(t *testing.T, lowerPath string, size int) {
	t.Helper()
	if _, ok := lowerRef(t, lowerPath); ok {
		t.Fatalf("%s still carries a ref", lowerPath)
	}
	st, err := os.Stat(lowerPath)
	if err != nil || st.Size() != int64(size) {
		t.Fatalf("%s: lower size %v, want %d", lowerPath, err, size)
	}
}

// capNetRaw is a file capability (cap_net_raw=ep), version 2.
var capNetRaw = []byte{0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00}

// TestChangesOfPackedFiles: every change of a packed file's bytes or
// place gives the bytes ext4 would, and leaves it an ordinary file.
func TestChangesOfPackedFiles(t *testing.T) {
	files := map[string][]byte{}
	for i := range 12 {
		files[fmt.Sprintf("d/f%d", i)] = []byte(strings.Repeat(fmt.Sprintf("%d-line\n", i), 20+i))
	}
	os.MkdirAll(t.TempDir(), 0o755)
	lower, m, p := packedMount(t, Options{Delay: time.Hour}, nil)
	writeTree(t, m.Dir, files)
	m.WaitReleased(t)
	p.pass(true)
	for name := range files {
		waitPacked(t, filepath.Join(lower, name))
	}
	mp := func(n string) string { return filepath.Join(m.Dir, n) }
	lp := func(n string) string { return filepath.Join(lower, n) }
	want := func(n string, b []byte) {
		t.Helper()
		got, err := os.ReadFile(mp(n))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s: %q, %v; want %q", n, got, err, b)
		}
	}

	// Append.
	f, _ := os.OpenFile(mp("d/f0"), os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte("more"))
	f.Close()
	files["d/f0"] = append(files["d/f0"], "more"...)
	want("d/f0", files["d/f0"])
	unpacked(t, lp("d/f0"), len(files["d/f0"]))

	// Write in the middle, through O_RDWR, reading first.
	f, _ = os.OpenFile(mp("d/f1"), os.O_RDWR, 0)
	head := make([]byte, 4)
	f.ReadAt(head, 0)
	f.WriteAt([]byte("XY"), 3)
	f.Close()
	copy(files["d/f1"][3:], "XY")
	want("d/f1", files["d/f1"])
	unpacked(t, lp("d/f1"), len(files["d/f1"]))

	// truncate(2), shorter and to 0.
	os.Truncate(mp("d/f2"), 5)
	want("d/f2", files["d/f2"][:5])
	unpacked(t, lp("d/f2"), 5)
	os.Truncate(mp("d/f3"), 0)
	want("d/f3", nil)
	unpacked(t, lp("d/f3"), 0)

	// ftruncate to 0 through an open file, then a write.
	f, _ = os.OpenFile(mp("d/f11"), os.O_RDWR, 0)
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("abc"), 1)
	f.Close()
	files["d/f11"] = []byte("\x00abc")
	want("d/f11", files["d/f11"])
	unpacked(t, lp("d/f11"), 4)

	// O_TRUNC.
	os.WriteFile(mp("d/f4"), []byte("new"), 0o644)
	want("d/f4", []byte("new"))
	unpacked(t, lp("d/f4"), 3)

	// A hard link.
	if err := os.Link(mp("d/f5"), mp("d/f5-link")); err != nil {
		t.Fatal(err)
	}
	want("d/f5-link", files["d/f5"])
	unpacked(t, lp("d/f5"), len(files["d/f5"]))

	// Rename into another directory, and within one.
	os.Mkdir(mp("e"), 0o755)
	if err := os.Rename(mp("d/f6"), mp("e/f6")); err != nil {
		t.Fatal(err)
	}
	want("e/f6", files["d/f6"])
	unpacked(t, lp("e/f6"), len(files["d/f6"]))
	if err := os.Rename(mp("d/f7"), mp("d/f7b")); err != nil {
		t.Fatal(err)
	}
	want("d/f7b", files["d/f7"])
	if _, ok := lowerRef(t, lp("d/f7b")); !ok {
		t.Fatal("a rename within the directory unpacked the file")
	}
	// Rename of the directory: its packed files still read.
	if err := os.Rename(mp("d"), mp("d2")); err != nil {
		t.Fatal(err)
	}
	want("d2/f8", files["d/f8"])
	if err := os.Rename(mp("d2"), mp("d")); err != nil {
		t.Fatal(err)
	}

	// Unlink leaves dead bytes; rename over a packed file too.
	os.Remove(mp("d/f9"))
	os.Rename(mp("d/f10"), mp("d/f11"))
	want("d/f11", files["d/f10"])
	if _, ok := lowerRef(t, lp("d/f11")); !ok {
		t.Fatal("a packed file renamed over another is not packed any more")
	}

	// Open for reading while it is packed, then written by another
	// descriptor: the reader sees the new bytes after.
	r, err := os.Open(mp("d/f8"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(mp("d/f8"), []byte("replaced"), 0o644)
	got := make([]byte, 100)
	n, _ := r.ReadAt(got, 0)
	r.Close()
	if string(got[:n]) != "replaced" {
		t.Fatalf("a reader open across an O_TRUNC rewrite reads %q", got[:n])
	}

	// The layer's names.
	for _, op := range []func() error{
		func() error { return os.WriteFile(mp("d/"+packName(0)), nil, 0o644) },
		func() error { return os.Mkdir(mp(".cairn-pack.x"), 0o755) },
		func() error { return os.Symlink("x", mp("d/.cairn-pack.lock")) },
		func() error { return os.Rename(mp("d/f7b"), mp("d/.cairn-pack.9")) },
	} {
		if err := op(); !errors.Is(err, syscall.EPERM) {
			t.Fatalf("making a reserved name: %v, want EPERM", err)
		}
	}
	if _, err := os.Stat(mp("d/" + packName(0))); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("stat of a pack: %v", err)
	}
	if _, err := unix.Getxattr(mp("d/f7b"), XattrName, make([]byte, 64)); err != unix.ENODATA {
		t.Fatalf("the ref shows through the mount: %v", err)
	}
	if err := unix.Setxattr(mp("d/f7b"), XattrName, []byte("x"), 0); err != unix.EPERM {
		t.Fatalf("setting the ref through the mount: %v", err)
	}
	buf := make([]byte, 1024)
	n, _ = unix.Listxattr(mp("d/f7b"), buf)
	if strings.Contains(string(buf[:n]), XattrName) {
		t.Fatalf("listxattr shows %q", buf[:n])
	}

	// A file capability set on a packed file: unpacked first, kept after.
	if err := unix.Setxattr(mp("d/f7b"), "security.capability", capNetRaw, 0); err != nil {
		t.Fatal(err)
	}
	unpacked(t, lp("d/f7b"), len(files["d/f7"]))
	m.WaitReleased(t)
	p.pass(true)
	if _, ok := lowerRef(t, lp("d/f7b")); ok {
		t.Fatal("a file with a capability was packed")
	}
	if n, err := unix.Getxattr(lp("d/f7b"), "security.capability", make([]byte, 64)); err != nil || n != len(capNetRaw) {
		t.Fatalf("the capability is gone: %d, %v", n, err)
	}
	want("d/f7b", files["d/f7"])
	// A set-id bit set on a packed file unpacks it; a set-id file is not
	// packed.
	waitPacked(t, lp("d/f8"))
	if err := unix.Chmod(mp("d/f8"), 0o2755); err != nil {
		t.Fatal(err)
	}
	unpacked(t, lp("d/f8"), len("replaced"))
	want("d/f8", []byte("replaced"))
	os.WriteFile(mp("d/suid"), []byte("#!/bin/sh\n"), 0o755)
	if err := unix.Chmod(mp("d/suid"), 0o4755); err != nil { // (os.Chmod takes os.ModeSetuid, not 0o4000)
		t.Fatal(err)
	}
	m.WaitReleased(t)
	p.pass(true)
	if _, ok := lowerRef(t, lp("d/suid")); ok {
		st, _ := os.Stat(lp("d/suid"))
		t.Fatalf("a set-uid file was packed (%v)", st.Mode())
	}

	// rmdir of a directory that holds only packs.
	os.Mkdir(mp("g"), 0o755)
	os.WriteFile(mp("g/x"), []byte("x"), 0o644)
	m.WaitReleased(t)
	p.pass(true)
	waitPacked(t, lp("g/x"))
	os.Remove(mp("g/x"))
	if err := os.Remove(mp("g")); err != nil {
		t.Fatalf("rmdir of a directory with its pack only: %v", err)
	}
	// A rename over a directory that holds only its pack.
	os.Mkdir(mp("g"), 0o755)
	os.WriteFile(mp("g/x"), []byte("x"), 0o644)
	m.WaitReleased(t)
	p.pass(true)
	waitPacked(t, lp("g/x"))
	os.Remove(mp("g/x"))
	os.Mkdir(mp("h"), 0o755)
	if err := unix.Rename(mp("h"), mp("g")); err != nil { // (os.Rename refuses an existing directory itself)
		ents, _ := os.ReadDir(lp("g"))
		t.Fatalf("rename over a directory with its pack only: %v (lower %v)", err, ents)
	}
}

// TestCompaction: once most of a directory's packed bytes are dead, its
// live records move to a new pack and the old one goes.
func TestCompaction(t *testing.T) {
	files := map[string][]byte{}
	for i := range 20 {
		files[fmt.Sprintf("c/f%02d", i)] = bytes.Repeat([]byte{byte('a' + i)}, 1000+i)
	}
	lower, m, p := packedMount(t, Options{CompactMin: 4096}, files)
	for i := range 15 {
		os.Remove(filepath.Join(m.Dir, fmt.Sprintf("c/f%02d", i)))
		delete(files, fmt.Sprintf("c/f%02d", i))
	}
	// The background passes may have compacted already, after some of
	// the removals: once more, and every dead byte goes.
	p.pass(false)
	if _, _, err := p.compactDir(context.Background(), "c", true); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(lower, "c"))
	var packs []string
	for _, e := range ents {
		if _, ok := packNumber(e.Name()); ok {
			packs = append(packs, e.Name())
		}
	}
	if len(packs) != 1 || packs[0] == packName(0) {
		t.Fatalf("packs after compaction: %v", packs)
	}
	n, _ := packNumber(packs[0])
	st, err := os.Stat(filepath.Join(lower, "c", packs[0]))
	if err != nil || st.Size() > 5*(1020+recordHdr)+int64(len(packMagic)) {
		t.Fatalf("the new pack: %v, %d bytes", err, st.Size())
	}
	for name := range files {
		if r, _ := lowerRef(t, filepath.Join(lower, name)); r.pack != n {
			t.Fatalf("%s still refers to pack %d", name, r.pack)
		}
	}
	checkTree(t, m.Dir, files)
	// All removed: the pack goes.
	for name := range files {
		os.Remove(filepath.Join(m.Dir, name))
	}
	p.pass(true)
	if _, err := os.Stat(filepath.Join(lower, "c", packs[0])); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a pack without live records is still there: %v", err)
	}
}

// TestDamagedPack: a flipped byte in a pack gives EIO, not zeros, and fsck
// reports the file.
func TestDamagedPack(t *testing.T) {
	files := map[string][]byte{"f": bytes.Repeat([]byte("z"), 777), "g": []byte("fine")}
	lower, m, _ := packedMount(t, Options{}, files)
	r, _ := lowerRef(t, filepath.Join(lower, "f"))
	pf, err := os.OpenFile(filepath.Join(lower, packName(r.pack)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	pf.WriteAt([]byte{'y'}, r.off+100)
	pf.Close()
	if b, err := os.ReadFile(filepath.Join(m.Dir, "f")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a damaged packed file: %d bytes, %v; want EIO", len(b), err)
	}
	checkTree(t, m.Dir, map[string][]byte{"g": files["g"]})
	m.Unmount()

	l, _ := local.New(lower)
	p, _ := New(l, Options{})
	defer p.Close()
	var reports []layer.FileReport
	sum, err := p.Fsck(context.Background(), layer.Repair, func(int, int, string) {}, func(r layer.FileReport) { reports = append(reports, r) })
	if err != nil || sum.Bad != 1 || len(reports) != 1 || reports[0].Damaged != 1 || !strings.Contains(reports[0].Text, "f: damaged") {
		t.Fatalf("fsck: %+v, %v, %+v", sum, err, reports)
	}
	// A forced repair empties it and keeps what was left of its bytes.
	reports = nil
	sum, err = p.Fsck(context.Background(), layer.RepairForce, func(int, int, string) {}, func(r layer.FileReport) { reports = append(reports, r) })
	if err != nil || sum.Bad != 0 || !sum.Dropped || len(reports) != 1 || !reports[0].Dropped || !strings.Contains(reports[0].Text, "dropped") {
		t.Fatalf("fsck --repair --force: %+v, %v, %+v", sum, err, reports)
	}
	if b, err := layer.ReadFile(context.Background(), p, "f"); err != nil || len(b) != 0 {
		t.Fatalf("the dropped file reads %d bytes, %v", len(b), err)
	}
	kept, _ := filepath.Glob(filepath.Join(lower, LostFound, "f.*"))
	if len(kept) != 1 {
		t.Fatalf("lost+found holds %v", kept)
	}
	if b, _ := os.ReadFile(kept[0]); len(b) != 777 || bytes.Count(b, []byte("z")) != 776 {
		t.Fatalf("the copy kept: %q", b)
	}
}

// TestFsckUnreferenced: a pack no file refers to is reported, and removed
// by a repair.
func TestFsckUnreferenced(t *testing.T) {
	lower, m, _ := packedMount(t, Options{}, map[string][]byte{"f": []byte("hello")})
	m.Unmount()
	os.WriteFile(filepath.Join(lower, packName(7)), append(bytes.Clone(packMagic), record([]byte("old"), 1)...), 0o600)
	l, _ := local.New(lower)
	p, _ := New(l, Options{})
	defer p.Close()
	for _, mode := range []layer.CheckMode{layer.CheckOnly, layer.Repair, layer.CheckOnly} {
		var text string
		sum, err := p.Fsck(context.Background(), mode, func(int, int, string) {}, func(r layer.FileReport) { text += r.Text })
		t.Logf("%v: %s / %s", mode, text, sum.Line)
		switch mode {
		case layer.CheckOnly:
			_, err2 := os.Stat(filepath.Join(lower, packName(7)))
			if err != nil || (err2 == nil) != (sum.Bad == 1) {
				t.Fatalf("check: %+v, %v", sum, err)
			}
		case layer.Repair:
			if !strings.Contains(text, "removed unreferenced pack(s) "+packName(7)) || sum.Bad != 0 {
				t.Fatalf("repair: %+v %q", sum, text)
			}
		}
	}
	if b, err := layer.ReadFile(context.Background(), p, "f"); err != nil || string(b) != "hello" {
		t.Fatalf("after the repair: %q, %v", b, err)
	}
}

// TestOtherUser: the permission checks do not change because the bytes
// moved: a packed mode-0000 file is not another user's to read.
func TestOtherUser(t *testing.T) {
	mounttest.NeedRoot(t)
	files := map[string][]byte{"secret": []byte("top secret"), "open": []byte("for all")}
	_, m, _ := packedMount(t, Options{}, files)
	os.Chmod(filepath.Join(m.Dir, "secret"), 0)
	nobody := mounttest.User{Uid: 65534, Gid: 65534}
	if out, err := nobody.Sh(t, m.Dir, "cat secret"); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("another user read a mode-0000 packed file: %q, %v", out, err)
	}
	if out, err := nobody.Sh(t, m.Dir, "cat open"); err != nil || out != "for all" {
		t.Fatalf("another user cannot read a 0644 packed file: %q, %v", out, err)
	}
	if out, err := nobody.Sh(t, m.Dir, "echo x >> open"); err == nil {
		t.Fatalf("another user appended to a 0644 file: %q", out)
	}
}

// TestFsx runs the model over pack:DIR with files packed between its
// operations (while the model has a file closed).
func TestFsx(t *testing.T) {
	lower := t.TempDir()
	top, p := newStack(t, lower, false, Options{MaxSize: maxPacked, Delay: time.Hour})
	m := mounttest.Mount(t, top)
	packs := 0
	fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: 5000, MaxSize: 48 << 10, MaxLen: 8 << 10, Punch: true,
		Between: func(path string, r *rand.Rand) (string, error) {
			name, _ := filepath.Rel(m.Dir, path)
			for range 100 {
				p.pass(true)
				if _, ok := lowerRef(t, filepath.Join(lower, name)); ok {
					packs++
					return "packed", nil
				}
				var st unix.Stat_t
				if unix.Stat(filepath.Join(lower, name), &st) == nil && (st.Size == 0 || st.Size > maxPacked) {
					return "not packed (size)", nil
				}
				time.Sleep(2 * time.Millisecond)
			}
			return "not packed (still open)", nil
		}})
	if packs == 0 {
		t.Fatal("no file was packed between the model's operations")
	}
	t.Logf("%d files packed between operations", packs)
}

// TestFifoOpenHoldsNothing: an open of a FIFO that waits for a writer
// holds no lock of the layer: a rename of a directory and a packed file's
// open go on meanwhile.
func TestFifoOpenHoldsNothing(t *testing.T) {
	_, m, _ := packedMount(t, Options{}, map[string][]byte{"d/f": []byte("x")})
	if err := unix.Mkfifo(m.Path("fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() {
		f, err := os.Open(m.Path("fifo"))
		if err == nil {
			f.Close()
		}
		opened <- err
	}()
	time.Sleep(50 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		err := os.Rename(m.Path("d"), m.Path("e"))
		if err == nil {
			_, err = os.ReadFile(m.Path("e/f"))
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a rename waits for the open of a FIFO")
	}
	w, err := os.OpenFile(m.Path("fifo"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := <-opened; err != nil {
		t.Fatal(err)
	}
}

// TestPackUnderOpenFile: a file open through the layer (not passed
// through: a codec above holds its files so) is packed under its readers
// and writers, which read the same bytes before, during and after, and
// whose write unpacks it.
func TestPackUnderOpenFile(t *testing.T) {
	lower := t.TempDir()
	l, _ := local.New(lower)
	p, err := New(l, Options{Delay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	want := bytes.Repeat([]byte("0123456789"), 300)
	if err := layer.WriteFile(ctx, p, "f", want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := p.Open(ctx, "f", unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		defer close(errs)
		buf := make([]byte, 4000)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, _ := f.ReadAt(ctx, buf, 0)
			if !bytes.Equal(buf[:n], want) {
				errs <- fmt.Errorf("read %d bytes, not the file's", n)
				return
			}
		}
	}()
	time.Sleep(20 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		p.markDirty("")
		p.pass(true) // (false would wait for the reads to stop for delay)
		if _, ok := lowerRef(t, filepath.Join(lower, "f")); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a file open through the layer (no passthrough) was not packed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if a, err := f.Getattr(ctx); err != nil || a.Size != uint64(len(want)) {
		t.Fatalf("fgetattr of the packed file: %d, %v", a.Size, err)
	}
	if _, err := f.WriteAt(ctx, []byte("X"), 5); err != nil {
		t.Fatal(err)
	}
	want[5] = 'X'
	f.Release(ctx)
	unpacked(t, filepath.Join(lower, "f"), len(want))
	if b, _ := os.ReadFile(filepath.Join(lower, "f")); !bytes.Equal(b, want) {
		t.Fatal("the lower file after the write is not the file")
	}
}

// noXattr is a lower that keeps no user xattrs.
type noXattr struct{ layer.Base }

func (n *noXattr) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	return syscall.ENOTSUP
}

// TestNoXattrLower: over a lower that keeps no xattrs nothing is packed,
// and the files are as they were.
func TestNoXattrLower(t *testing.T) {
	lower := t.TempDir()
	l, _ := local.New(lower)
	p, err := New(&noXattr{layer.Base{Lower: l}}, Options{Delay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		if err := layer.WriteFile(ctx, p, name, []byte("small "+name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p.pass(true)
	if !p.off.Load() {
		t.Fatal("packing is still on over a lower without xattrs")
	}
	p.Close()
	for _, name := range []string{"a", "b"} {
		if b, err := os.ReadFile(filepath.Join(lower, name)); err != nil || string(b) != "small "+name {
			t.Fatalf("%s: %q, %v", name, b, err)
		}
	}
	if ents, _ := os.ReadDir(lower); len(ents) != 2 {
		t.Fatalf("the lower holds %v", ents)
	}
}

// TestReadingRule: a file with a ref and bytes of its own (a pack or an
// unpack cut by a crash) is its own bytes if they are the ref's, else the
// pack's copy, which is written again; fsck reports it and a repair
// finishes it.
func TestReadingRule(t *testing.T) {
	files := map[string][]byte{"same": []byte("the same bytes"), "torn": []byte("torn by a crash"), "fsck": []byte("fsck finishes it")}
	lower, m, p0 := packedMount(t, Options{Delay: time.Hour}, nil)
	writeTree(t, m.Dir, files)
	m.Unmount()
	p0.Close() // packs them
	for name := range files {
		waitPacked(t, filepath.Join(lower, name))
	}
	// A pack cut before the truncation: the file's bytes, and the ref.
	os.WriteFile(filepath.Join(lower, "same"), files["same"], 0o644)
	// An unpack cut after the size was set, before the bytes landed.
	for _, name := range []string{"torn", "fsck"} {
		os.Truncate(filepath.Join(lower, name), int64(len(files[name])))
	}
	l, _ := local.New(lower)
	p, _ := New(l, Options{Delay: time.Hour})
	defer p.Close()
	ctx := context.Background()
	var text string
	sum, err := p.Fsck(ctx, layer.CheckOnly, func(int, int, string) {}, func(r layer.FileReport) { text += r.Text })
	if err != nil || sum.Bad != 1 || strings.Count(text, "an unpack was cut by a crash") != 3 {
		t.Fatalf("fsck: %+v, %v: %s", sum, err, text)
	}
	for _, name := range []string{"same", "torn"} {
		if got, err := layer.ReadFile(ctx, p, name); err != nil || !bytes.Equal(got, files[name]) {
			t.Fatalf("%s: %q, %v", name, got, err)
		}
		unpacked(t, filepath.Join(lower, name), len(files[name]))
		if b, _ := os.ReadFile(filepath.Join(lower, name)); !bytes.Equal(b, files[name]) {
			t.Fatalf("lower %s: %q", name, b)
		}
	}
	text = ""
	if sum, err := p.Fsck(ctx, layer.Repair, func(int, int, string) {}, func(r layer.FileReport) { text += r.Text }); err != nil || sum.Bad != 0 || !strings.Contains(text, "fsck: finished an unpack cut by a crash") {
		t.Fatalf("fsck --repair: %+v, %v: %s", sum, err, text)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "fsck")); !bytes.Equal(b, files["fsck"]) {
		t.Fatalf("lower fsck after the repair: %q", b)
	}
	unpacked(t, filepath.Join(lower, "fsck"), len(files["fsck"]))
}

// TestConcurrent: workers each write, append to, read, remove and move
// small files of a directory of their own, and rename the directory back
// and forth, while files are packed 1 ms after they are left alone; every
// read gives the bytes last written.
func TestConcurrent(t *testing.T) {
	lower := t.TempDir()
	top, _ := newStack(t, lower, false, Options{Delay: time.Millisecond, CompactMin: 1024})
	m := mounttest.Mount(t, top)
	errs := make(chan error, 4)
	for w := range 4 {
		go func() {
			errs <- func() error {
				r := rand.New(rand.NewPCG(uint64(w), 9))
				dirs := [2]string{fmt.Sprintf("g%d", w), fmt.Sprintf("h%d", w)}
				cur := 0
				if err := os.MkdirAll(m.Path(dirs[0], "sub"), 0o755); err != nil {
					return err
				}
				model := map[string][]byte{}
				for op := range 400 {
					name := fmt.Sprintf("f%d", r.IntN(12))
					if r.IntN(2) == 0 {
						name = "sub/" + name
					}
					p := m.Path(dirs[cur], name)
					switch k := r.IntN(10); {
					case k < 3:
						b := bytes.Repeat([]byte{byte('a' + r.IntN(26))}, 1+r.IntN(3000))
						if err := os.WriteFile(p, b, 0o644); err != nil {
							return err
						}
						model[name] = b
					case k < 5:
						if _, ok := model[name]; !ok {
							continue
						}
						f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
						if err != nil {
							return err
						}
						f.Write([]byte("+"))
						f.Close()
						model[name] = append(model[name], '+')
					case k < 6:
						if _, ok := model[name]; ok {
							if err := os.Remove(p); err != nil {
								return err
							}
							delete(model, name)
						}
					case k < 7:
						if err := os.Rename(m.Path(dirs[cur]), m.Path(dirs[1-cur])); err != nil {
							return err
						}
						cur = 1 - cur
					case k < 8:
						// Between the directory and its subdirectory.
						other := "sub/" + name
						if strings.HasPrefix(name, "sub/") {
							other = strings.TrimPrefix(name, "sub/")
						}
						if b, ok := model[name]; ok {
							if err := os.Rename(p, m.Path(dirs[cur], other)); err != nil {
								return err
							}
							delete(model, name)
							model[other] = b
						}
					default:
						got, err := os.ReadFile(p)
						want, ok := model[name]
						if !ok {
							if !errors.Is(err, os.ErrNotExist) {
								return fmt.Errorf("op %d: %s should not exist: %v", op, name, err)
							}
							continue
						}
						if err != nil || !bytes.Equal(got, want) {
							return fmt.Errorf("op %d: %s: %d bytes, %v; want %d", op, name, len(got), err, len(want))
						}
					}
					if r.IntN(8) == 0 {
						time.Sleep(2 * time.Millisecond)
					}
				}
				time.Sleep(30 * time.Millisecond)
				for name, want := range model {
					if got, err := os.ReadFile(m.Path(dirs[cur], name)); err != nil || !bytes.Equal(got, want) {
						return fmt.Errorf("at the end: %s: %d bytes, %v; want %d", name, len(got), err, len(want))
					}
				}
				return nil
			}()
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	packed := 0
	filepath.WalkDir(lower, func(path string, d os.DirEntry, err error) error {
		if _, ok := lowerRefNoFail(path); ok {
			packed++
		}
		return nil
	})
	if packed == 0 {
		t.Fatal("nothing was packed")
	}
	t.Logf("%d files packed at the end", packed)
}

// TestPassthroughFileNotPacked: a small file open with kernel passthrough
// (its lower descriptor lent to the kernel) is not packed while open: the
// kernel reads the lower file itself. Closed, it is.
func TestPassthroughFileNotPacked(t *testing.T) {
	lower, m, p := packedMount(t, Options{Delay: time.Hour}, nil)
	os.WriteFile(m.Path("f"), []byte("passed through"), 0o644)
	m.WaitReleased(t)
	f, err := os.Open(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := os.ReadFile(filepath.Join(lower, "f"))
	st, _ := os.Stat(filepath.Join(lower, "f"))
	var pinned int
	p.mu.Lock()
	for _, n := range p.nodes {
		n.mu.Lock()
		pinned += n.pinned
		n.mu.Unlock()
	}
	p.mu.Unlock()
	if pinned != 1 {
		t.Fatalf("%d files pinned by passthrough (lower %q, %d bytes)", pinned, l, st.Size())
	}
	p.pass(true)
	if _, ok := lowerRef(t, filepath.Join(lower, "f")); ok {
		t.Fatal("a file passed through to the kernel was packed under it")
	}
	b := make([]byte, 100)
	if n, _ := f.ReadAt(b, 0); string(b[:n]) != "passed through" {
		t.Fatalf("read %q", b[:n])
	}
	f.Close()
	m.WaitReleased(t)
	p.pass(true)
	waitPacked(t, filepath.Join(lower, "f"))
}
