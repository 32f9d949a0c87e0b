//go:build linux

package fusefs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/mux"
	"cairnfs.dev/cairn/layers/null"
)

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func localLower(t *testing.T, dir string) layer.FS {
	t.Helper()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// checkSame checks that the mount's file p shows the lower file's size and
// bytes.
func checkSame(t *testing.T, mounted, lower string) {
	t.Helper()
	// A layer may still settle the lower file after the last close
	// returns (FUSE sends RELEASE asynchronously: codec rewrites its
	// header then), so compare once the lower file reads the same
	// before and after the mounted read.
	var got string
	var want []byte
	var size int64
	for try := 0; try < 50; try++ {
		before, err := os.ReadFile(lower)
		if err != nil {
			t.Fatal(err)
		}
		size = lstat(t, mounted).Size
		got = mustRead(t, mounted)
		after, err := os.ReadFile(lower)
		if err != nil {
			t.Fatal(err)
		}
		want = after
		if string(before) == string(after) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if size != int64(len(want)) {
		t.Errorf("%s: size %d, the lower file has %d", mounted, size, len(want))
	}
	if got != string(want) {
		t.Errorf("%s reads %q, the lower file holds %q", mounted, got, want)
	}
}

// A lower with another file system mounted inside it: a file of each with
// the same inode number must stay two files through the mount.
func TestFileSystemInsideLower(t *testing.T) {
	mounttest.Need(t)
	// Two tmpfs count inode numbers from the start each, so equal numbers
	// come quickly.
	outer := mounttest.Tmpfs(t, "")
	inner := mounttest.Tmpfs(t, filepath.Join(outer, "sub"))
	mustWrite(t, filepath.Join(outer, "a1"), "outer file a1\n")
	if err := os.Link(filepath.Join(outer, "a1"), filepath.Join(outer, "a1.link")); err != nil {
		t.Fatal(err)
	}
	ino := lstat(t, filepath.Join(outer, "a1")).Ino
	twin := ""
	for i := 0; i < 1000 && twin == ""; i++ {
		p := filepath.Join(inner, fmt.Sprintf("b%d", i))
		mustWrite(t, p, fmt.Sprintf("inner file number %d, longer than a1\n", i))
		if lstat(t, p).Ino == ino {
			twin = filepath.Base(p)
		}
	}
	if twin == "" {
		t.Fatalf("no file of the inner tmpfs got inode number %d", ino)
	}

	m := mounttest.Mount(t, null.New(localLower(t, outer)))
	// The inner file first: before the fix its node took the number, and
	// a1 then read b's bytes.
	checkSame(t, m.Path("sub", twin), filepath.Join(inner, twin))
	checkSame(t, m.Path("a1"), filepath.Join(outer, "a1"))
	checkSame(t, m.Path("sub", twin), filepath.Join(inner, twin))
	a, b, l := lstat(t, m.Path("a1")), lstat(t, m.Path("sub", twin)), lstat(t, m.Path("a1.link"))
	if a.Ino == b.Ino {
		t.Errorf("a1 and sub/%s share st_ino %d", twin, a.Ino)
	}
	if a.Ino != l.Ino || a.Nlink != 2 {
		t.Errorf("hard links: a1 st_ino %d nlink %d, a1.link st_ino %d", a.Ino, a.Nlink, l.Ino)
	}
	// The root's own file system keeps the lower's inode numbers.
	if a.Ino != ino {
		t.Errorf("a1: st_ino %d, the lower's is %d", a.Ino, ino)
	}
	// A rename keeps st_ino, on either file system.
	if err := os.Rename(m.Path("sub", twin), m.Path("sub", "renamed")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.Path("a1.link"), m.Path("a1.moved")); err != nil {
		t.Fatal(err)
	}
	if r := lstat(t, m.Path("sub", "renamed")); r.Ino != b.Ino {
		t.Errorf("sub/%s had st_ino %d, renamed it has %d", twin, b.Ino, r.Ino)
	}
	if r := lstat(t, m.Path("a1.moved")); r.Ino != a.Ino {
		t.Errorf("a1.link had st_ino %d, renamed it has %d", a.Ino, r.Ino)
	}
	twin = "renamed"
	// Another user reads the same bytes.
	out, err := mounttest.User{Uid: 65534, Gid: 65534}.Sh(t, m.Dir, "cat a1 sub/renamed")
	if want := mustRead(t, filepath.Join(outer, "a1")) + mustRead(t, filepath.Join(inner, twin)); err != nil || out != want {
		t.Errorf("uid 65534 reads %q (%v), want %q", out, err, want)
	}
	// Writes land in the right file too.
	mustWrite(t, m.Path("a1"), "new a1")
	if got := mustRead(t, filepath.Join(outer, "a1")); got != "new a1" {
		t.Errorf("outer a1 holds %q", got)
	}
	checkSame(t, m.Path("sub", twin), filepath.Join(inner, twin))
}

// mux over two file systems whose files have equal inode numbers.
func TestMuxOverTwoFileSystems(t *testing.T) {
	mounttest.Need(t)
	d0, d1 := mounttest.Tmpfs(t, ""), mounttest.Tmpfs(t, "")
	mustWrite(t, filepath.Join(d0, "f"), "left\n")
	mustWrite(t, filepath.Join(d1, "f"), "the right one\n")
	if lstat(t, filepath.Join(d0, "f")).Ino != lstat(t, filepath.Join(d1, "f")).Ino {
		t.Fatal("the two tmpfs gave their first files different inode numbers; the test needs equal ones")
	}
	mx, err := mux.New([]layer.FS{localLower(t, d0), localLower(t, d1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, mx)
	checkSame(t, m.Path("1", "f"), filepath.Join(d1, "f"))
	checkSame(t, m.Path("0", "f"), filepath.Join(d0, "f"))
	if lstat(t, m.Path("0", "f")).Ino == lstat(t, m.Path("1", "f")).Ino {
		t.Error("0/f and 1/f share st_ino")
	}
	if lstat(t, m.Path("0")).Ino == lstat(t, m.Path("1")).Ino {
		t.Error("the lowers' roots share st_ino")
	}
}

// mux over one directory twice, once through a layer that changes data:
// the same lower file is two different files of the stack.
func TestMuxBranchesOfOneFileSystem(t *testing.T) {
	mounttest.Need(t)
	d := t.TempDir()
	cp, err := codec.New(localLower(t, d), "copy", codec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mx, err := mux.New([]layer.FS{localLower(t, d), cp}, []string{"raw", "plain"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cp.Close() })
	m := mounttest.Mount(t, mx)
	mustWrite(t, m.Path("plain", "f"), "plain text\n")
	if got := mustRead(t, m.Path("plain", "f")); got != "plain text\n" {
		t.Fatalf("plain/f reads %q", got)
	}
	checkSame(t, m.Path("raw", "f"), filepath.Join(d, "f"))
	if got := mustRead(t, m.Path("plain", "f")); got != "plain text\n" {
		t.Errorf("plain/f reads %q after raw/f", got)
	}
	if lstat(t, m.Path("raw", "f")).Ino == lstat(t, m.Path("plain", "f")).Ino {
		t.Error("raw/f and plain/f share st_ino")
	}
}

// A layer that keeps state per open file (codec: the index) must key it
// by the whole identity too: over a lower with a file system inside it,
// two files with equal inode numbers stay two files.
func TestFileSystemInsideCodecLower(t *testing.T) {
	mounttest.Need(t)
	outer := mounttest.Tmpfs(t, "")
	inner := mounttest.Tmpfs(t, filepath.Join(outer, "sub"))
	zs, err := codec.New(localLower(t, outer), "zstd", codec.Options{Level: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { zs.Close() })
	m := mounttest.Mount(t, zs)
	mustWrite(t, m.Path("a1"), "outer file a1\n")
	ino := lstat(t, filepath.Join(outer, "a1")).Ino
	twin, want := "", ""
	for i := 0; i < 1000 && twin == ""; i++ {
		name := fmt.Sprintf("b%d", i)
		content := fmt.Sprintf("inner file number %d, longer than a1\n", i)
		mustWrite(t, m.Path("sub", name), content)
		if lstat(t, filepath.Join(inner, name)).Ino == ino {
			twin, want = name, content
		}
	}
	if twin == "" {
		t.Fatalf("no file of the inner tmpfs got inode number %d", ino)
	}
	f, err := os.Open(m.Path("sub", twin))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := mustRead(t, m.Path("a1")); got != "outer file a1\n" {
		t.Errorf("a1 reads %q while sub/%s is open", got, twin)
	}
	if got := mustRead(t, m.Path("sub", twin)); got != want {
		t.Errorf("sub/%s reads %q, want %q", twin, got, want)
	}
}

// mux wraps its lowers' open files (to tag their attributes): the wrapper
// must not lose what the lower file says, such as CapKeepCache.
func TestMuxForwardsKeepCache(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(dir+"/f", make([]byte, 8192), 0o644)
	d := &keepLayer{Base: layer.Base{Lower: localLower(t, dir)}, keep: true}
	mx, err := mux.New([]layer.FS{d}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, mx)
	for i := 0; i < 3; i++ {
		if b, err := os.ReadFile(m.Path("0", "f")); err != nil || len(b) != 8192 {
			t.Fatalf("read: %d %v", len(b), err)
		}
	}
	if n := d.reads.Load(); n > 2 {
		t.Errorf("%d reads reached the layer for 3 opens of a CapKeepCache file under mux", n)
	}
}

// A lower that frees an inode number and gives it to a new file (ext4 does)
// behind the mount's back, while the kernel still knows the old file: the
// new file is another object, with another generation (layer.Attr.Gen, the
// lower's birth time). A file handle of the old file must then be stale, as
// it is on ext4, not open the new file.
func TestReusedInodeNumberIsAnotherFile(t *testing.T) {
	mounttest.Need(t)
	lower := t.TempDir()
	m := mounttest.Mount(t, null.New(localLower(t, lower)))
	// Other programs creating files on the same file system may take the
	// freed number first: try again until the lower gives it to one of ours.
	var (
		h      unix.FileHandle
		oldIno uint64
		reused string
	)
	for try := 0; try < 50 && reused == ""; try++ {
		old := fmt.Sprintf("old%d", try)
		if err := os.WriteFile(filepath.Join(lower, old), []byte("old file"), 0o644); err != nil {
			t.Fatal(err)
		}
		oldIno = lstat(t, m.Path(old)).Ino
		var err error
		h, _, err = unix.NameToHandleAt(unix.AT_FDCWD, m.Path(old), 0)
		if err != nil {
			t.Fatalf("name_to_handle_at through the mount: %v", err)
		}
		// Behind the mount: remove the file and make new ones until one gets its number.
		os.Remove(filepath.Join(lower, old))
		for i := 0; i < 20 && reused == ""; i++ {
			p := filepath.Join(lower, fmt.Sprintf("new%d-%d", try, i))
			if err := os.WriteFile(p, []byte("the new file"), 0o644); err != nil {
				t.Fatal(err)
			}
			if lstat(t, p).Ino == oldIno {
				reused = filepath.Base(p)
			}
		}
	}
	if reused == "" {
		t.Fatalf("the lower (%s) never reused a freed inode number in 50 tries", lower)
	}
	if got := lstat(t, m.Path(reused)).Ino; got != oldIno {
		t.Fatalf("%s: st_ino %d through the mount, the lower's is %d", reused, got, oldIno)
	}
	mfd, err := unix.Open(m.Dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	fd, err := unix.OpenByHandleAt(mfd, h, unix.O_RDONLY)
	if err == nil {
		b := make([]byte, 64)
		n, _ := unix.Read(fd, b)
		unix.Close(fd)
		t.Fatalf("the old file's handle opens the new file %s (reads %q); ext4 answers ESTALE", reused, b[:max(n, 0)])
	}
	// ext4 says ESTALE; through FUSE the kernel still holds the old node,
	// whose path is gone: ENOENT.
	if err != unix.ESTALE && err != unix.ENOENT {
		t.Fatalf("open_by_handle_at of the old file: %v, want ESTALE or ENOENT", err)
	}
	// the new file reads its own bytes
	checkSame(t, m.Path(reused), filepath.Join(lower, reused))
}
