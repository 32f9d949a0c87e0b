package fusefs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"cairn/internal/mounttest"
	"cairn/layer"
	"cairn/layers/codec"
	"cairn/layers/local"
	"cairn/layers/mux"
	"cairn/layers/null"
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
	want, err := os.ReadFile(lower)
	if err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, mounted); st.Size != int64(len(want)) {
		t.Errorf("%s: size %d, the lower file has %d", mounted, st.Size, len(want))
	}
	if got := mustRead(t, mounted); got != string(want) {
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
