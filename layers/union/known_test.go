//go:build linux

package union_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/layers/union"
)

// lookups counts a branch's Getattr calls, by path.
type lookups struct {
	layer.Base
	mu sync.Mutex
	n  map[string]int
}

func (l *lookups) Getattr(ctx context.Context, p string) (layer.Attr, error) {
	l.mu.Lock()
	l.n[p]++
	l.mu.Unlock()
	return l.Base.Getattr(ctx, p)
}

func (l *lookups) count(p string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[p]
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	sort.Strings(n)
	return n
}

// TestUnionKnownNames: a missing name costs one lookup per branch at most,
// the create that follows included, and a name looked up once is not
// looked up again until the union changes something; what the union knows
// follows every change made through the mount (creates of every kind,
// renames onto the name, removals, whiteouts, copy-ups).
func TestUnionKnownNames(t *testing.T) {
	up, lo := t.TempDir(), t.TempDir()
	write(t, filepath.Join(lo, "d", "x"), "lower x\n")
	write(t, filepath.Join(lo, "d", "y"), "lower y\n")
	cu := &lookups{Base: layer.Base{Lower: localFS(t, up)}, n: map[string]int{}}
	cl := &lookups{Base: layer.Base{Lower: localFS(t, lo)}, n: map[string]int{}}
	u, err := union.New([]fanout.Branch{{FS: cu, Mode: fanout.RW}, {FS: cl, Mode: fanout.RO}}, union.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(u) })
	m := mounttest.Mount(t, u)

	// A missing name, then its create.
	if _, err := os.Stat(m.Path("d", "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat of a missing name: %v", err)
	}
	f, err := os.OpenFile(m.Path("d", "new"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Once each for the missing name, and the upper once more for the
	// new file, made there (the frontend remembers its file handle).
	if a, b := cu.count("d/new"), cl.count("d/new"); a > 2 || b > 1 {
		t.Errorf("a missing name and its create asked the upper branch %d times and the lower %d, want at most 2 and 1", a, b)
	}

	// A name looked up once: getxattr (which the kernel never caches)
	// asks no branch for it again.
	if _, err := os.Stat(m.Path("d", "x")); err != nil {
		t.Fatal(err)
	}
	a0, b0 := cu.count("d/x"), cl.count("d/x")
	for i := 0; i < 3; i++ {
		if _, err := unix.Lgetxattr(m.Path("d", "x"), "user.none", nil); !errors.Is(err, layer.ENOATTR) {
			t.Fatalf("getxattr: %v, want ENODATA", err)
		}
	}
	if a, b := cu.count("d/x")-a0, cl.count("d/x")-b0; a != 0 || b != 0 {
		t.Errorf("getxattr of a name known asked the upper branch %d times and the lower %d, want none", a, b)
	}

	// Every way of making a name known missing, through the mount, shows
	// it at once; every way of removing one hides it.
	mk := map[string]func(p string) error{
		"create":  func(p string) error { return os.WriteFile(p, []byte("new\n"), 0o644) },
		"mkdir":   func(p string) error { return os.Mkdir(p, 0o755) },
		"symlink": func(p string) error { return os.Symlink("x", p) },
		"mknod":   func(p string) error { return unix.Mknod(p, unix.S_IFIFO|0o644, 0) },
		"link":    func(p string) error { return os.Link(m.Path("d", "new"), p) },
		"rename": func(p string) error {
			if err := os.WriteFile(m.Path("d", "src"), nil, 0o644); err != nil {
				return err
			}
			return os.Rename(m.Path("d", "src"), p)
		},
	}
	for how, fn := range mk {
		p := m.Path("d", how)
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: before: %v", how, err)
		}
		if err := fn(p); err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: the new name: %v", how, err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatalf("%s: remove: %v", how, err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: after its removal: %v", how, err)
		}
	}
	// A lower name: removed (a whiteout), made again, copied up, renamed
	// away (a whiteout in one step).
	if err := os.Remove(m.Path("d", "x")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.Path("d", "x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a removed lower name: %v", err)
	}
	write(t, m.Path("d", "x"), "upper x\n")
	if got := read(t, m.Path("d", "x")); got != "upper x\n" {
		t.Fatalf("a lower name made again: %q", got)
	}
	if err := os.WriteFile(m.Path("d", "y"), []byte("copied y\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(up, "d", "y")); got != "copied y\n" {
		t.Fatalf("the copy-up of y: %q", got)
	}
	if err := os.Rename(m.Path("d", "y"), m.Path("z")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.Path("d", "y")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a renamed lower name: %v", err)
	}
	if got := read(t, m.Path("z")); got != "copied y\n" {
		t.Fatalf("the renamed copy: %q", got)
	}
	if got, want := names(t, m.Path("d")), []string{"new", "x"}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("listing: %v, want %v", got, want)
	}
	if err := os.RemoveAll(m.Path("d")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(m.Path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := names(t, m.Path("d")); len(got) != 0 {
		t.Fatalf("a directory made again over a removed one lists %v", got)
	}
	if _, err := os.Stat(m.Path("d", "new")); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("a name of the removed directory: %v", err)
	}
}

// TestUnionListingsKept: the kernel keeps a union's directory listings
// (layer.Exclusive) and the attributes it was given; every change through
// the mount shows in the next listing and stat: creates, removals of upper
// and lower names (whiteouts), renames between directories, a directory
// removed and made again, a copy-up.
func TestUnionListingsKept(t *testing.T) {
	up, lo := t.TempDir(), t.TempDir()
	write(t, filepath.Join(lo, "a", "x"), "x\n")
	write(t, filepath.Join(lo, "a", "y"), "y\n")
	write(t, filepath.Join(lo, "b", "z"), "z\n")
	m := mountUnion(t, up, lo)
	list := func(dir string, want ...string) {
		t.Helper()
		for i := 0; i < 2; i++ { // the second listing is the kernel's
			got := names(t, m.Path(dir))
			sort.Strings(want)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("%s lists %v, want %v", dir, got, want)
			}
		}
	}
	list("a", "x", "y")
	list("b", "z")
	write(t, m.Path("a", "new"), "new\n")
	list("a", "new", "x", "y")
	if err := os.Remove(m.Path("a", "x")); err != nil {
		t.Fatal(err)
	}
	list("a", "new", "y")
	if err := os.Rename(m.Path("a", "y"), m.Path("b", "y")); err != nil {
		t.Fatal(err)
	}
	list("a", "new")
	list("b", "y", "z")
	fi, err := os.Stat(m.Path("b", "z"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("b", "z"), []byte("longer z\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi2, err := os.Stat(m.Path("b", "z")); err != nil || fi2.Size() != 9 || !os.SameFile(fi, fi2) {
		t.Fatalf("z after its copy-up: %v, %v (same file: %v)", fi2, err, err == nil && os.SameFile(fi, fi2))
	}
	if err := os.RemoveAll(m.Path("a")); err != nil {
		t.Fatal(err)
	}
	list("", "b")
	if err := os.Mkdir(m.Path("a"), 0o755); err != nil {
		t.Fatal(err)
	}
	list("", "a", "b")
	list("a")
	if err := os.Chmod(m.Path("b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(m.Path("b")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("b after chmod: %v, %v", fi, err)
	}
}

// TestUnionShared: with shared = true (mergerfs's use, branches also
// written outside the union) a name made, removed or changed directly in a
// branch shows through the mount within the kernel's timeouts (1 s), and
// the union is not layer.Exclusive.
func TestUnionShared(t *testing.T) {
	up, lo := t.TempDir(), t.TempDir()
	write(t, filepath.Join(lo, "a", "x"), "x\n")
	u, err := union.New([]fanout.Branch{{FS: localFS(t, up), Mode: fanout.RW}, {FS: localFS(t, lo), Mode: fanout.RW}}, union.Options{Shared: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(u) })
	if layer.IsExclusive(u) {
		t.Fatal("a shared union says it is exclusive")
	}
	m := mounttest.Mount(t, u)
	// Learn everything first: the listing, a present and a missing name.
	if got := strings.Join(names(t, m.Path("a")), ","); got != "x" {
		t.Fatalf("a lists %s", got)
	}
	if _, err := os.Stat(m.Path("a", "y")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a/y before: %v", err)
	}
	if _, err := os.Stat(m.Path("b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("b before: %v", err)
	}
	// Change the branches behind the union's back.
	write(t, filepath.Join(lo, "a", "y"), "y\n")
	write(t, filepath.Join(up, "b", "z"), "z\n")
	write(t, filepath.Join(up, "a", "x"), "upper x\n")
	shows := func() error {
		if got := strings.Join(names(t, m.Path("a")), ","); got != "x,y" {
			return fmt.Errorf("a lists %s", got)
		}
		if b, err := os.ReadFile(m.Path("a", "x")); err != nil || string(b) != "upper x\n" {
			return fmt.Errorf("a/x reads %q, %v", b, err)
		}
		if b, err := os.ReadFile(m.Path("b", "z")); err != nil || string(b) != "z\n" {
			return fmt.Errorf("b/z reads %q, %v", b, err)
		}
		return nil
	}
	var last error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if last = shows(); last == nil {
			break
		}
	}
	if last != nil {
		t.Fatalf("changes made in the branches do not show: %v", last)
	}
	if err := os.Remove(filepath.Join(lo, "a", "y")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, last = os.Stat(m.Path("a", "y")); errors.Is(last, os.ErrNotExist) {
			return
		}
	}
	t.Fatalf("a/y removed from its branch still shows: %v", last)
}
