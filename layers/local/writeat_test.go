//go:build linux

package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestShortWriteIsAnError: a write that fills the disk stores what fits and
// reports ENOSPC with that count; it never reports a short count as success
// (pwrite(2) returns the short count first, and the retry gives the reason).
func TestShortWriteIsAnError(t *testing.T) {
	mounttest.NeedRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=256k"); err != nil {
		t.Fatalf("mounting a small tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	l, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f, _, err := l.Create(ctx, "f", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	p := make([]byte, 1<<20)
	for i := range p {
		p[i] = byte(i)
	}
	n, err := f.WriteAt(ctx, p, 0)
	if !errors.Is(err, syscall.ENOSPC) || n <= 0 || n >= len(p) {
		t.Fatalf("write of 1 MiB on a 256 KiB disk: %d, %v; want a count between 0 and 1 MiB and ENOSPC", n, err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil || len(got) != n || string(got) != string(p[:n]) {
		t.Fatalf("the lower holds %d bytes (%v), the write reported %d", len(got), err, n)
	}
	if n, err := f.WriteAt(ctx, p[:10], int64(len(got))); n != 0 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write on a full disk: %d, %v; want 0, ENOSPC", n, err)
	}
}
