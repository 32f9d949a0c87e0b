//go:build linux

package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// TestPathsLongerThanPathMax: a layer above may pass paths longer than the
// kernel takes in one call (a name-encrypting layer lengthens every
// component); they are opened a piece at a time, still beneath the root.
func TestPathsLongerThanPathMax(t *testing.T) {
	root := t.TempDir()
	fs, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	ctx := context.Background()
	var dir string
	for i := 0; len(dir) < 2*unix.PathMax; i++ {
		dir = layer.Join(dir, strings.Repeat(string(rune('a'+i%26)), 250))
		if _, err := fs.Mkdir(ctx, dir, 0o755); err != nil {
			t.Fatalf("mkdir at %d bytes: %v", len(dir), err)
		}
	}
	p := dir + "/f"
	if err := layer.WriteFile(ctx, fs, p, []byte("deep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := layer.ReadFile(ctx, fs, p); err != nil || string(b) != "deep" {
		t.Fatalf("read back %q, %v", b, err)
	}
	if err := fs.Rename(ctx, p, dir+"/g", 0); err != nil {
		t.Fatal(err)
	}
	if ents, err := fs.ReadDir(ctx, dir, false); err != nil || len(ents) != 1 || ents[0].Name != "g" {
		t.Fatalf("listing: %v %v", ents, err)
	}
	// It is where it should be in the real directory.
	rfd, _ := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	defer unix.Close(rfd)
	fd := rfd
	parts := strings.Split(dir, "/")
	for _, c := range parts {
		nfd, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if fd != rfd {
			unix.Close(fd)
		}
		fd = nfd
	}
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "g", &st, 0); err != nil || st.Size != 4 {
		t.Fatalf("in the real directory: %v, %d bytes", err, st.Size)
	}
	unix.Close(fd)
	// A symlink on the way is not followed, however long the path.
	os.Symlink("/", filepath.Join(root, "link"))
	if _, err := fs.Getattr(ctx, "link/"+dir[:len(dir)-300]+"/x"); err == nil {
		t.Fatal("resolved through a symlink")
	}
}
