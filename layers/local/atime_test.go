//go:build linux

package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// TestSetAtime: over a directory whose own mount has other atime options,
// SetAtime makes the layer's reads follow the ones it is given (through a
// private bind mount), as often as they change; everything else works as
// before, finding objects by identity too.
func TestSetAtime(t *testing.T) {
	mounttest.NeedRoot(t) // a private bind mount needs root
	ctx := context.Background()
	// A file system of the test's own, mounted relatime (tmpfs's default),
	// whatever the machine's temporary directory is mounted with.
	root := mounttest.Tmpfs(t, "")
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	if atimeOf(st.Flags).Mode != layer.Relatime {
		t.Fatalf("a new tmpfs at %s is not mounted relatime", root)
	}
	if err := os.MkdirAll(filepath.Join(root, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "d", "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	// read sets an atime later than the mtime and ctime (relatime then
	// leaves it), reads through the layer and says whether it changed.
	read := func() bool {
		t.Helper()
		future := time.Now().Add(time.Hour)
		if err := os.Chtimes(filepath.Join(root, "d", "f"), future, time.Now().Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		f, err := fs.Open(ctx, "d/f", unix.O_RDONLY)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Release(ctx)
		if n, err := f.ReadAt(ctx, make([]byte, 4), 0); n != 4 {
			t.Fatal(n, err)
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, "d", "f"), &st); err != nil {
			t.Fatal(err)
		}
		return st.Atim != unix.NsecToTimespec(future.UnixNano())
	}
	if read() {
		t.Fatal("relatime changed an atime later than mtime and ctime")
	}
	for _, c := range []struct {
		a    layer.Atime
		want bool
	}{{layer.Atime{Mode: layer.StrictAtime}, true}, {layer.Atime{Mode: layer.NoAtime}, false}, {layer.Atime{Mode: layer.StrictAtime, NoDir: true}, true}, {layer.Atime{}, false}} {
		if err := fs.SetAtime(c.a); err != nil {
			t.Fatal(err)
		}
		if got := read(); got != c.want {
			t.Errorf("%s: a read changed the atime: %v, want %v", c.a, got, c.want)
		}
	}
	if !fs.private {
		t.Fatal("no private bind mount was made")
	}
	for _, p := range []string{"d", "d/f"} {
		a, err := fs.Getattr(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		h, err := fs.Handle(ctx, p, a.ID())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := fs.Find(ctx, a.ID(), h); got != p || err != nil {
			t.Errorf("Find of %s: %q, %v", p, got, err)
		}
	}
}
