package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Open files hold at most fds.max descriptors; a file whose descriptor was
// closed reads and writes the same inode after a reopen, after renames,
// and after an unlink through the layer; a file with a lock keeps its
// descriptor.
func TestOpenFilesAreBounded(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("reopening by handle needs CAP_DAC_READ_SEARCH; CI runs as root")
		}
		t.Skip("reopening by handle needs CAP_DAC_READ_SEARCH")
	}
	root := t.TempDir()
	fs, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if !fs.fds.handles {
		t.Fatal("the root daemon cannot reopen files by handle on this file system")
	}
	fs.fds.max = 8
	ctx := context.Background()
	before := openFds(t)
	const n = 40
	files := make([]layer.File, n)
	for i := range files {
		f, _, err := fs.Create(ctx, fmt.Sprintf("f%d", i), unix.O_RDWR|unix.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = f
		if _, err := f.WriteAt(ctx, []byte(fmt.Sprintf("file %d;", i)), 0); err != nil {
			t.Fatal(err)
		}
	}
	if held := openFds(t) - before; held > fs.fds.max {
		t.Fatalf("%d open files hold %d descriptors; the bound is %d", n, held, fs.fds.max)
	}
	// Renamed and unlinked behind closed descriptors, through the layer.
	if err := fs.Rename(ctx, "f0", "moved", 0); err != nil {
		t.Fatal(err)
	}
	if err := fs.Unlink(ctx, "f1"); err != nil {
		t.Fatal(err)
	}
	// f3 replaced by a rename: its inode has no name left.
	if err := fs.Rename(ctx, "f2", "f3", 0); err != nil {
		t.Fatal(err)
	}
	// A lock keeps the descriptor (it belongs to the open file description).
	if err := files[5].Setlk(ctx, 1, &layer.Lock{Type: unix.F_WRLCK, End: ^uint64(0)}, layer.LockFlock, false); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		for i, f := range files {
			// O_APPEND survives a reopen: the offset is ignored.
			if _, err := f.WriteAt(ctx, []byte(fmt.Sprintf("more %d;", i)), 0); err != nil {
				t.Fatalf("write to file %d: %v", i, err)
			}
		}
	}
	for i, f := range files {
		want := fmt.Sprintf("file %d;more %d;more %d;", i, i, i)
		buf := make([]byte, 100)
		m, err := f.ReadAt(ctx, buf, 0)
		if string(buf[:m]) != want {
			t.Errorf("file %d reads %q (%v), want %q", i, buf[:m], err, want)
		}
	}
	for i, name := range map[int]string{0: "moved", 2: "f3", 9: "f9"} {
		b, err := os.ReadFile(filepath.Join(root, name))
		if want := fmt.Sprintf("file %d;more %d;more %d;", i, i, i); err != nil || string(b) != want {
			t.Errorf("lower %s holds %q (%v), want %q", name, b, err, want)
		}
	}
	other := fs.Open
	g, err := other(ctx, "f5", unix.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Setlk(ctx, 2, &layer.Lock{Type: unix.F_WRLCK, End: ^uint64(0)}, layer.LockFlock, false); err != unix.EWOULDBLOCK {
		t.Errorf("a second flock on f5: %v, want EWOULDBLOCK (the first one's descriptor was closed)", err)
	}
	g.Release(ctx)
	// Pinned files: 5 (lock), 1 and 3 (no name left).
	if held := openFds(t) - before; held > fs.fds.max+3 {
		t.Errorf("%d descriptors held; the bound is %d plus 3 pinned", held, fs.fds.max)
	}
	for _, f := range files {
		if err := f.Release(ctx); err != nil {
			t.Error(err)
		}
	}
	if held := openFds(t) - before; held > 0 {
		t.Errorf("%d descriptors left after every release", held)
	}
}

// Removing a name that is not an inode's last, or a removal that fails,
// leaves the inode's open files under the bound: nothing stays pinned.
func TestRemovingNotLastNamePinsNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("reopening by handle needs CAP_DAC_READ_SEARCH; CI runs as root")
		}
		t.Skip("reopening by handle needs CAP_DAC_READ_SEARCH")
	}
	fs, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	fs.fds.max = 8
	ctx := context.Background()
	before := openFds(t)
	const n = 40
	files := make([]layer.File, n)
	for i := range files {
		f, _, err := fs.Create(ctx, fmt.Sprintf("f%d", i), unix.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = f
		if _, err := f.WriteAt(ctx, []byte(fmt.Sprintf("file %d", i)), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := fs.Link(ctx, fmt.Sprintf("f%d", i), fmt.Sprintf("g%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := fs.Create(ctx, "x", unix.O_RDWR, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range files {
		// A replacing rename that fails, then an unlink of one of two names.
		if err := fs.Rename(ctx, "x", fmt.Sprintf("f%d", i), layer.RenameNoreplace); err != unix.EEXIST {
			t.Fatalf("rename onto f%d with RENAME_NOREPLACE: %v, want EEXIST", i, err)
		}
		if err := fs.Unlink(ctx, fmt.Sprintf("f%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The bound, plus x's file (left open).
	if held := openFds(t) - before; held > fs.fds.max+1 {
		t.Errorf("%d descriptors held after removing names that were not the last; the bound is %d", held, fs.fds.max)
	}
	for i, f := range files {
		buf := make([]byte, 20)
		m, _ := f.ReadAt(ctx, buf, 0)
		if want := fmt.Sprintf("file %d", i); string(buf[:m]) != want {
			t.Errorf("file %d reads %q, want %q", i, buf[:m], want)
		}
		f.Release(ctx)
	}
}
