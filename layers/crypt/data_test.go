//go:build linux

package crypt

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// lowerFile returns the path of the only regular file of a crypt lower
// directory (but the layer's own).
func lowerFile(t *testing.T, dir string) string {
	t.Helper()
	var found []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && fi.Name()[0] != '.' && filepath.Base(filepath.Dir(p)) != journalDir {
			found = append(found, p)
		}
		return nil
	})
	if len(found) != 1 {
		t.Fatalf("lower files: %v", found)
	}
	return found[0]
}

func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestSparseFiles: a write far past the end and truncate -s 1T leave holes
// below, cost what they cost on ext4 (time and space), read as zeros, and
// SEEK_DATA/SEEK_HOLE find the data; a size past what the lower (or the
// format) can hold is EFBIG, as on ext4, and the file still reads.
func TestSparseFiles(t *testing.T) {
	dir, fs := stack(t)
	m := mounttest.Mount(t, fs)
	ext4 := t.TempDir()
	for _, root := range []string{ext4, m.Dir} {
		p := filepath.Join(root, "sparse")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := f.WriteAt([]byte("hello"), 2<<30); err != nil {
			t.Fatalf("%s: pwrite at 2 GiB: %v", root, err)
		}
		if err := f.Truncate(1 << 40); err != nil {
			t.Fatalf("%s: truncate to 1 TiB: %v", root, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s: the sparse writes took %v", root, d)
		}
		fi, _ := f.Stat()
		if fi.Size() != 1<<40 {
			t.Fatalf("%s: size %d", root, fi.Size())
		}
		got := make([]byte, 8192)
		for _, off := range []int64{0, 1 << 30, 2<<30 - 4096, 1<<40 - 8192} {
			if _, err := f.ReadAt(got, off); err != nil {
				t.Fatalf("%s: read at %d: %v", root, off, err)
			}
			want := make([]byte, len(got))
			if off == 2<<30-4096 {
				copy(want[4096:], "hello")
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s: read at %d: wrong bytes", root, off)
			}
		}
		// SEEK_DATA and SEEK_HOLE find what ext4 finds.
		d, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA)
		if err != nil || d != 2<<30 {
			t.Errorf("%s: SEEK_DATA from 0: %d %v", root, d, err)
		}
		if d, err = unix.Seek(int(f.Fd()), 2<<30+100, unix.SEEK_DATA); err != nil || d != 2<<30+100 {
			t.Errorf("%s: SEEK_DATA in the data: %d %v", root, d, err)
		}
		if h, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE); err != nil || h != 0 {
			t.Errorf("%s: SEEK_HOLE from 0: %d %v", root, h, err)
		}
		if h, err := unix.Seek(int(f.Fd()), 2<<30, unix.SEEK_HOLE); err != nil || h != 2<<30+4096 {
			t.Errorf("%s: SEEK_HOLE after the data: %d %v", root, h, err)
		}
		// Past what the lower file system holds (ext4: 16 TiB): EFBIG,
		// and nothing changes.
		_, werr := f.WriteAt([]byte("x"), 1<<62)
		terr := f.Truncate(1 << 62)
		if !errors.Is(werr, syscall.EFBIG) || !errors.Is(terr, syscall.EFBIG) {
			t.Errorf("%s: write and truncate at 2^62: %v, %v (want EFBIG)", root, werr, terr)
		}
		if fi, _ := f.Stat(); fi.Size() != 1<<40 {
			t.Errorf("%s: size %d after the failed calls", root, fi.Size())
		}
		if _, err := f.ReadAt(got, 1<<40-8192); err != nil {
			t.Errorf("%s: the end of the file after a failed write: %v", root, err)
		}
		f.Close()
	}
	if a := allocated(t, lowerFile(t, dir)); a > 1<<20 {
		t.Errorf("the lower file of a 1 TiB sparse file takes %d bytes", a)
	}
	// After a remount, the file reads the same (the holes are
	// authenticated by its last block).
	m.Unmount()
	m = mounttest.Mount(t, open(t, dir))
	b := make([]byte, 4096)
	f, err := os.Open(m.Path("sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(b, 1<<30); err != nil || !bytes.Equal(b, make([]byte, 4096)) {
		t.Fatalf("a hole after the remount: %v", err)
	}
}

// TestSizeLimit: a size past the format's largest file is EFBIG from the
// layer itself (whatever the lower could hold).
func TestSizeLimit(t *testing.T) {
	_, fs := stack(t)
	ctx := context.Background()
	f, _, err := fs.Create(ctx, "f", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	max := fs.t.c.maxPlain()
	if _, err := f.WriteAt(ctx, []byte("x"), max); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("write at the largest size: %v", err)
	}
	if _, err := f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(max) + 1}); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("truncate past the largest size: %v", err)
	}
	if c := fs.t.c; c.lowerSize(uint64(max)) > 1<<63-1 || c.lowerSize(uint64(max)) < 1<<62 {
		t.Errorf("largest size %d: lower %d", max, c.lowerSize(uint64(max)))
	}
}

// TestHolesAuthenticated: a zeroed block of a file without holes is EIO
// (the file's last block says it has none); in a file that may have holes
// it reads as zeros (docs/crypt.md); a sparse file's last-block mark cannot
// be changed below.
func TestHolesAuthenticated(t *testing.T) {
	dir, fs := stack(t)
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789abcdef"), 3*4096/16)
	if err := layer.WriteFile(ctx, fs, "dense", data, 0o644); err != nil {
		t.Fatal(err)
	}
	lp := lowerFile(t, dir)
	raw, _ := os.ReadFile(lp)
	cbs := fs.t.c.cbs
	zeroed := bytes.Clone(raw)
	clear(zeroed[headerSize : headerSize+cbs])
	os.WriteFile(lp, zeroed, 0o644)
	if _, err := layer.ReadFile(ctx, open(t, dir), "dense"); !IsCorrupt(err) {
		t.Fatalf("zeroed block of a file without holes: %v", err)
	}
	// Sparse: block 0 is a hole from the start.
	os.WriteFile(lp, raw, 0o644)
	fs2 := open(t, dir)
	f, err := fs2.Open(ctx, "dense", unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, []byte("far"), 10*4096); err != nil {
		t.Fatal(err)
	}
	f.Release(ctx)
	raw2, _ := os.ReadFile(lp)
	if string(raw2[len(headerMagic):len(headerMagic)+2]) != "\x00\x02" {
		t.Errorf("the header of a sparse file has version %x", raw2[6:8])
	}
	clear(raw2[headerSize : headerSize+cbs])
	os.WriteFile(lp, raw2, 0o644)
	got, err := layer.ReadFile(ctx, open(t, dir), "dense")
	want := append(append(bytes.Clone(data), make([]byte, 7*4096)...), "far"...)
	clear(want[:4096])
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("zeroed block of a sparse file: %v", err)
	}
	// The header's version is a hint: version 1 on a sparse file still
	// reads; the mark is the last block's.
	copy(raw2[len(headerMagic):], "\x00\x01")
	os.WriteFile(lp, raw2, 0o644)
	if _, err := layer.ReadFile(ctx, open(t, dir), "dense"); err != nil {
		t.Fatalf("sparse file with a version 1 header: %v", err)
	}
}

// TestPunchHole: FALLOC_FL_PUNCH_HOLE leaves holes below and zeros above.
func TestPunchHole(t *testing.T) {
	dir, fs := stack(t)
	m := mounttest.Mount(t, fs)
	data := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{1}).Read(data)
	p := m.Path("f")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := allocated(t, lowerFile(t, dir))
	if err := unix.Fallocate(int(f.Fd()), layer.FallocPunchHole|layer.FallocKeepSize, 1000, 600<<10); err != nil {
		t.Fatal(err)
	}
	clear(data[1000 : 1000+600<<10])
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after the punch: %v", err)
	}
	if after := allocated(t, lowerFile(t, dir)); after > before-500<<10 {
		t.Errorf("the punch freed %d bytes below", before-after)
	}
	if h, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_HOLE); err != nil || h != 4096 {
		t.Errorf("SEEK_HOLE after the punch: %d %v", h, err)
	}
}

// TestFullDisk: on a 16 MiB tmpfs, writes fail with ENOSPC when the disk
// is full, every file stays readable (no torn last block) with what was
// written before the failure, and what was fsync'ed reads back after a
// remount.
func TestFullDisk(t *testing.T) {
	mounttest.NeedRoot(t)
	tmp := t.TempDir()
	if err := unix.Mount("tmpfs", tmp, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(tmp, unix.MNT_DETACH) })
	lower := filepath.Join(tmp, "lower")
	os.Mkdir(lower, 0o755)
	l, err := openLocal(t, lower)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Init(context.Background(), l, InitParams{KDF: fastKDF}, testPass); err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, open(t, lower))
	r := rand.New(rand.NewPCG(7, 7))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	want := map[string][]byte{} // fsync'ed
	// check reads a file without error and compares its start with base
	// and the rest with more.
	check := func(name string, base, more []byte) []byte {
		t.Helper()
		got, err := os.ReadFile(m.Path(name))
		if err != nil {
			t.Fatalf("%s after ENOSPC: %v", name, err)
		}
		if len(got) < len(base) || !bytes.Equal(got[:len(base)], base) || !bytes.Equal(got[len(base):], more[:len(got)-len(base)]) {
			t.Fatalf("%s after ENOSPC: %d bytes, not the %d before and a part of what followed", name, len(got), len(base))
		}
		return got
	}
	a := random(10000)
	if err := os.WriteFile(m.Path("a"), a, 0o644); err != nil {
		t.Fatal(err)
	}
	want["a"] = a
	full := false
	for i := 0; !full; i++ {
		name := "fill" + string(rune('a'+i))
		data := random(1<<20 + 300)
		f, err := os.Create(m.Path(name))
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.Write(data)
		if err == nil {
			err = f.Sync()
		}
		f.Close()
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling: %v", err)
			}
			want[name] = check(name, nil, data)
			full = true
		} else {
			want[name] = data
		}
	}
	// On the full disk: an append (its old last block is rewritten), a
	// write far past the end, an in-place rewrite and a truncate that
	// leaves a hole.
	f, err := os.OpenFile(m.Path("a"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	more := random(2 << 20)
	if _, err := f.WriteAt(more, int64(len(a))); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append on a full disk: %v", err)
	}
	a = check("a", a, more)
	if _, err := f.WriteAt(more, 1<<30); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write at 1 GiB on a full disk: %v", err)
	}
	if fi, _ := f.Stat(); fi.Size() != int64(len(a)) {
		t.Fatalf("size %d after a failed write at 1 GiB (was %d)", fi.Size(), len(a))
	}
	check("a", a, nil)
	if _, err := f.WriteAt([]byte("in place"), 100); err != nil {
		t.Fatalf("in-place write on a full disk: %v", err)
	}
	copy(a[100:], "in place")
	if err := f.Truncate(1 << 40); err != nil {
		t.Fatalf("truncate to 1 TiB on a full disk: %v", err)
	}
	if err := f.Truncate(int64(len(a))); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want["a"] = check("a", a, nil)
	// After a remount, everything fsync'ed is there.
	m.Unmount()
	m = mounttest.Mount(t, open(t, lower))
	for name, data := range want {
		got, err := os.ReadFile(m.Path(name))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s after the remount: %d bytes, %v (want %d)", name, len(got), err, len(data))
		}
	}
}

// TestJournalRecovery: the states a killed daemon can leave in the middle
// of an in-place rewrite (a block half new, half old) or of an extension
// (the old last block rewritten, the new blocks cut short) are undone from
// the journal at the next open, to the content before the write; a write
// that completed is kept.
func TestJournalRecovery(t *testing.T) {
	ctx := context.Background()
	data := make([]byte, 3*4096+100)
	rand.NewChaCha8([32]byte{2}).Read(data)
	for _, tc := range []struct {
		name  string
		off   int64
		n     int
		state func(before, after []byte) []byte // the lower file after the "crash"
		keep  bool                              // the write completed: its data stays
	}{
		{"torn in-place rewrite", 4096, 4096, func(b, a []byte) []byte {
			torn := bytes.Clone(b)
			const cbs = 4096 + 40 // XChaCha20-Poly1305, the default
			copy(torn[headerSize+cbs:headerSize+cbs+2000], a[headerSize+cbs:])
			return torn
		}, false},
		{"cut extension", int64(len(data)), 20000, func(b, a []byte) []byte { return a[:len(a)-5000] }, false},
		{"complete write", 100, 9000, func(b, a []byte) []byte { return a }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, fs := stack(t)
			if err := layer.WriteFile(ctx, fs, "f", data, 0o644); err != nil {
				t.Fatal(err)
			}
			lp := lowerFile(t, dir)
			before, _ := os.ReadFile(lp)
			f, err := fs.Open(ctx, "f", unix.O_RDWR)
			if err != nil {
				t.Fatal(err)
			}
			p := bytes.Repeat([]byte{'N'}, tc.n)
			if _, err := f.WriteAt(ctx, p, tc.off); err != nil {
				t.Fatal(err)
			}
			after, _ := os.ReadFile(lp)
			// The daemon dies here: f is never released, its journal
			// stays; the lower file is left as the crash left it.
			if err := os.WriteFile(lp, tc.state(before, after), 0o644); err != nil {
				t.Fatal(err)
			}
			fs2 := open(t, dir)
			got, err := layer.ReadFile(ctx, fs2, "f")
			want := data
			if tc.keep {
				want = bytes.Clone(data)
				copy(want[tc.off:], p)
			}
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("after the crash: %d bytes, %v (want %d bytes)", len(got), err, len(want))
			}
			if ents, _ := os.ReadDir(filepath.Join(dir, journalDir)); len(ents) != 0 {
				t.Errorf("journal left after recovery: %v", ents)
			}
			// The journal directory is the layer's own: not listed.
			if ents, err := fs2.ReadDir(ctx, "", false); err != nil || len(ents) != 1 || ents[0].Name != "f" {
				t.Errorf("the root lists %v, %v", ents, err)
			}
		})
	}
}

// TestRewriteAsAnotherUser: a user who may write a file but not the root of
// the lower directory rewrites it in place and extends it (the journal is
// the layer's own, made as the daemon), and truncates it upwards.
func TestRewriteAsAnotherUser(t *testing.T) {
	mounttest.NeedRoot(t)
	dir, fs := stack(t)
	os.Chmod(dir, 0o755)
	m := mounttest.Mount(t, fs)
	data := bytes.Repeat([]byte("0123456789"), 1000)
	if err := os.WriteFile(m.Path("shared"), data, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(m.Path("shared"), 0o666)
	if err := os.WriteFile(m.Path("src"), []byte("XYZ"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := mounttest.User{Uid: 65534, Gid: 65534}.Sh(t, m.Dir,
		`printf abc | dd of=shared bs=1 seek=100 conv=notrunc status=none && printf tail >> shared && truncate -s 20000 shared && `+
			`python3 -c "import os; s = os.open('src', os.O_RDONLY); d = os.open('shared', os.O_WRONLY); os.copy_file_range(s, d, 3, 0, 200)"`)
	if err != nil {
		t.Fatalf("as uid 65534: %v\n%s", err, out)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, journalDir), &st); err != nil || st.Uid != 0 {
		t.Errorf("the journal directory: owner %d, %v (want the daemon's, root)", st.Uid, err)
	}
	copy(data[100:], "abc")
	copy(data[200:], "XYZ")
	data = append(data, "tail"...)
	data = append(data, make([]byte, 20000-len(data))...)
	if got, err := os.ReadFile(m.Path("shared")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("after the other user's writes: %d bytes, %v", len(got), err)
	}
}
