package local

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// TestLockToEndOfFile: a lock to the end of the file, as the kernel says it
// (OFFSET_MAX) or as the layer API does (^uint64(0)), is a lock with
// l_len = 0 on the lower file, not EINVAL.
func TestLockToEndOfFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644)
	fs, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	ctx := context.Background()
	for _, end := range []uint64{math.MaxInt64, ^uint64(0)} {
		a, err := fs.Open(ctx, "f", os.O_RDWR)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := fs.Open(ctx, "f", os.O_RDWR)
		if err := a.Setlk(ctx, 1, &layer.Lock{Start: 0, End: end, Type: unix.F_WRLCK}, 0, false); err != nil {
			t.Fatalf("end %#x: %v", end, err)
		}
		got, err := b.Getlk(ctx, 2, &layer.Lock{Start: 1 << 40, End: 1<<40 + 1, Type: unix.F_RDLCK}, 0)
		if err != nil || got.Type != unix.F_WRLCK || got.Start != 0 || got.End != ^uint64(0) {
			t.Fatalf("end %#x: Getlk far beyond the start: %+v %v", end, got, err)
		}
		if err := b.Setlk(ctx, 2, &layer.Lock{Start: 1 << 50, End: end, Type: unix.F_RDLCK}, 0, false); err != syscall.EAGAIN {
			t.Fatalf("inside the lock: %v, want EAGAIN", err)
		}
		a.Release(ctx)
		b.Release(ctx)
	}
}
