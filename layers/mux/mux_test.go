package mux_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/mux"
	"cairnfs.dev/cairn/registry"
)

func newMux(t *testing.T, names []string) (*mux.FS, []string) {
	t.Helper()
	dirs := []string{t.TempDir(), t.TempDir()}
	var lowers []layer.FS
	for _, d := range dirs {
		l, err := local.New(d)
		if err != nil {
			t.Fatal(err)
		}
		lowers = append(lowers, l)
	}
	m, err := mux.New(lowers, names)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(m) })
	return m, dirs
}

func TestNames(t *testing.T) {
	ctx := context.Background()
	m, _ := newMux(t, nil)
	ents, err := m.ReadDir(ctx, "", false)
	if err != nil || len(ents) != 2 || ents[0].Name != "0" || ents[1].Name != "1" || ents[0].Mode != syscall.S_IFDIR {
		t.Fatalf("default names: %+v %v", ents, err)
	}
	if _, err := mux.New([]layer.FS{m.Lowers()[0]}, []string{"a", "b"}); err != syscall.EINVAL {
		t.Fatalf("two names for one lower: %v, want EINVAL", err)
	}
	if len(m.Lowers()) != 2 || m.Changes() != layer.ChangesPlacement {
		t.Fatalf("lowers %d, changes %v", len(m.Lowers()), m.Changes())
	}
	typ, ok := registry.Lookup("mux")
	if !ok || typ.MinLowers != 1 || typ.MaxLowers != -1 || typ.Changes != layer.ChangesPlacement {
		t.Fatalf("registered type: %+v", typ)
	}
}

// TestRouting: each path goes to the lower its first name says, with the
// rest of the path; the root is mux's own and read-only.
func TestRouting(t *testing.T) {
	ctx := context.Background()
	m, dirs := newMux(t, []string{"left", "right"})
	root, err := m.Getattr(ctx, "")
	if err != nil || root.Mode != syscall.S_IFDIR|0o555 || root.Nlink != 4 {
		t.Fatalf("root: %+v %v", root, err)
	}
	ents, err := m.ReadDir(ctx, "", true)
	if err != nil || len(ents) != 2 || ents[1].Name != "right" || ents[1].Attr == nil || ents[1].Ino == 0 {
		t.Fatalf("root with attributes: %+v %v", ents, err)
	}
	if err := layer.WriteFile(ctx, m, "left/a", []byte("L"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Mkdir(ctx, "right/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := layer.WriteFile(ctx, m, "right/d/b", []byte("R"), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{filepath.Join(dirs[0], "a"): "L", filepath.Join(dirs[1], "d/b"): "R"} {
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			t.Fatalf("lower %s: %q %v", p, b, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dirs[1], "a")); !os.IsNotExist(err) {
		t.Fatalf("left/a reached the right lower: %v", err)
	}
	if got, err := layer.ReadFile(ctx, m, "right/d/b"); err != nil || string(got) != "R" {
		t.Fatalf("read right/d/b: %q %v", got, err)
	}
	// Within a lower, everything goes through.
	if _, err := m.Symlink(ctx, "b", "right/d/s"); err != nil {
		t.Fatal(err)
	}
	if tg, err := m.Readlink(ctx, "right/d/s"); err != nil || tg != "b" {
		t.Fatalf("readlink: %q %v", tg, err)
	}
	if _, err := m.Link(ctx, "right/d/b", "right/h"); err != nil {
		t.Fatal(err)
	}
	if err := m.Rename(ctx, "right/h", "right/i", 0); err != nil {
		t.Fatal(err)
	}
	if a, err := m.Getattr(ctx, "right/i"); err != nil || a.Nlink != 2 || a.Size != 1 {
		t.Fatalf("right/i: %+v %v", a, err)
	}
	if err := m.Setxattr(ctx, "left/a", "user.k", []byte("v"), 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := m.Getxattr(ctx, "left/a", "user.k", buf); err != nil || string(buf[:n]) != "v" {
		t.Fatalf("getxattr: %q %v", buf[:n], err)
	}
	if err := m.Unlink(ctx, "right/i"); err != nil {
		t.Fatal(err)
	}
	if err := m.Rmdir(ctx, "right/d"); err != unix.ENOTEMPTY {
		t.Fatalf("rmdir of a full directory: %v", err)
	}
	st, err := m.Statfs(ctx, "")
	var blocks uint64
	for _, d := range dirs {
		var sf unix.Statfs_t
		if unix.Statfs(d, &sf) != nil {
			t.Fatal(err)
		}
		blocks += sf.Blocks
	}
	if err != nil || st.Blocks != blocks {
		t.Fatalf("statfs of the root: %+v %v, want the lowers' summed (%d blocks)", st, err, blocks)
	}
	if err := m.SyncDir(ctx, ""); err != nil {
		t.Fatal(err)
	}

	// What mux refuses.
	for _, c := range []struct {
		what string
		err  error
		want syscall.Errno
	}{
		{"getattr of an unknown lower", errOf(m.Getattr(ctx, "middle")), syscall.ENOENT},
		{"open in an unknown lower", errOf(m.Open(ctx, "middle/a", os.O_RDONLY)), syscall.ENOENT},
		{"create in the root", errOf3(m.Create(ctx, "x", os.O_RDWR, 0o644)), syscall.EPERM},
		{"mkdir of a lower's name", errOf(m.Mkdir(ctx, "left", 0o755)), syscall.EPERM},
		{"unlink of a lower", m.Unlink(ctx, "left"), syscall.EPERM},
		{"rmdir of a lower", m.Rmdir(ctx, "right"), syscall.EPERM},
		{"rename of a lower", m.Rename(ctx, "left", "other", 0), syscall.EPERM},
		{"rename across lowers", m.Rename(ctx, "left/a", "right/a", 0), syscall.EXDEV},
		{"link across lowers", errOf(m.Link(ctx, "left/a", "right/a")), syscall.EXDEV},
		{"setattr of the root", errOf(m.Setattr(ctx, "", &layer.SetAttr{Valid: layer.SetMode, Mode: 0o777})), syscall.EPERM},
		{"getxattr in an unknown lower", errOf(m.Getxattr(ctx, "middle/a", "user.k", buf)), layer.ENOATTR},
		{"setxattr on the root", m.Setxattr(ctx, "", "user.k", nil, 0), syscall.EPERM},
	} {
		if c.err != c.want {
			t.Errorf("%s: %v, want %v", c.what, c.err, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dirs[0], "a")); err != nil {
		t.Fatalf("a refused rename moved the file: %v", err)
	}
}

func errOf[T any](_ T, err error) error { return err }

func errOf3[T, U any](_ T, _ U, err error) error { return err }

// TestTmpfile: an unnamed file is made in its directory's lower, tagged as
// that lower's, and links into the same lower only; the root takes none.
func TestTmpfile(t *testing.T) {
	ctx := context.Background()
	m, dirs := newMux(t, nil)
	if _, _, err := m.Tmpfile(ctx, "", unix.O_RDWR, 0o600); err != syscall.EPERM {
		t.Fatalf("tmpfile in mux's root: %v, want EPERM", err)
	}
	f, a, err := m.Tmpfile(ctx, "1", unix.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	if a.Nlink != 0 || a.Branch == 0 {
		t.Fatalf("tmpfile attributes: nlink %d, branch %d", a.Nlink, a.Branch)
	}
	if _, err := f.WriteAt(ctx, []byte("t"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.LinkFile(ctx, f, "0/x"); err != syscall.EXDEV {
		t.Fatalf("link into the other lower: %v, want EXDEV", err)
	}
	la, err := m.LinkFile(ctx, f, "1/x")
	if err != nil || la.Ino != a.Ino || la.Branch != a.Branch || la.Nlink != 1 {
		t.Fatalf("link: %+v %v (tmpfile %+v)", la, err, a)
	}
	if b, err := os.ReadFile(filepath.Join(dirs[1], "x")); err != nil || string(b) != "t" {
		t.Fatalf("lower 1 x: %q %v", b, err)
	}
	if fl, err := m.GetFlags(ctx, "1/x"); err != nil {
		t.Fatalf("flags: %#x %v", fl, err)
	}
}
