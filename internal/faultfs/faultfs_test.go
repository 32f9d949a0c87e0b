package faultfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

func newFS(t *testing.T) (string, *FS, layer.File) {
	t.Helper()
	dir := t.TempDir()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	fs := New(l)
	f, _, err := fs.Create(context.Background(), "f", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Release(context.Background()) })
	return dir, fs, f
}

func lowerBytes(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestShortWrites(t *testing.T) {
	ctx := context.Background()
	dir, fs, f := newFS(t)
	fs.Set(Faults{ShortWrites: true})
	n, err := f.WriteAt(ctx, []byte("abcdefgh"), 0)
	if n != 4 || err != nil {
		t.Fatalf("short write: %d, %v; want 4, nil", n, err)
	}
	if got := lowerBytes(t, dir); got != "abcd" {
		t.Fatalf("lower holds %q", got)
	}
}

func TestNoSpace(t *testing.T) {
	ctx := context.Background()
	dir, fs, f := newFS(t)
	fs.Set(Faults{NoSpace: true, SpaceLeft: 10})
	if n, err := f.WriteAt(ctx, []byte("123456"), 0); n != 6 || err != nil {
		t.Fatalf("first write: %d, %v", n, err)
	}
	if n, err := f.WriteAt(ctx, []byte("789abc"), 6); n != 4 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write across the limit: %d, %v; want 4, ENOSPC", n, err)
	}
	if n, err := f.WriteAt(ctx, []byte("x"), 10); n != 0 || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write on a full disk: %d, %v; want ENOSPC", n, err)
	}
	if got := lowerBytes(t, dir); got != "123456789a" {
		t.Fatalf("lower holds %q", got)
	}
	fs.Set(Faults{})
	if n, err := f.WriteAt(ctx, []byte("b"), 10); n != 1 || err != nil {
		t.Fatalf("write after space came back: %d, %v", n, err)
	}
}

func TestFailRead(t *testing.T) {
	ctx := context.Background()
	_, fs, f := newFS(t)
	f.WriteAt(ctx, []byte("data"), 0)
	fs.Set(Faults{FailRead: 2})
	b := make([]byte, 4)
	for i, want := range []error{nil, syscall.EIO, nil} {
		if _, err := f.ReadAt(ctx, b, 0); err != want {
			t.Fatalf("read %d: %v, want %v", i+1, err, want)
		}
	}
}

func TestSlowFsync(t *testing.T) {
	ctx := context.Background()
	_, fs, f := newFS(t)
	fs.Set(Faults{FsyncDelay: 50 * time.Millisecond})
	t0 := time.Now()
	if err := f.Fsync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 50*time.Millisecond {
		t.Fatalf("fsync took %v", d)
	}
}

func TestCrashPoint(t *testing.T) {
	ctx := context.Background()
	dir, fs, f := newFS(t)
	fs.Set(Faults{CrashAfter: 5})
	if n, err := f.WriteAt(ctx, []byte("abc"), 0); n != 3 || err != nil {
		t.Fatalf("write before the crash: %d, %v", n, err)
	}
	if n, err := f.WriteAt(ctx, []byte("defg"), 3); n != 2 || !errors.Is(err, syscall.EIO) {
		t.Fatalf("torn write: %d, %v; want 2, EIO", n, err)
	}
	if !fs.Crashed() {
		t.Fatal("not crashed")
	}
	if _, err := f.WriteAt(ctx, []byte("x"), 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write after the crash: %v", err)
	}
	if _, err := f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 0}); !errors.Is(err, syscall.EIO) {
		t.Fatalf("truncate after the crash: %v", err)
	}
	if err := f.Fsync(ctx, false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync after the crash: %v", err)
	}
	if _, _, err := fs.Create(ctx, "g", unix.O_RDWR, 0o644); !errors.Is(err, syscall.EIO) {
		t.Fatalf("create after the crash: %v", err)
	}
	if err := fs.Rename(ctx, "f", "h", 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("rename after the crash: %v", err)
	}
	if got := lowerBytes(t, dir); got != "abcde" {
		t.Fatalf("lower holds %q", got)
	}
	b := make([]byte, 5)
	if n, err := f.ReadAt(ctx, b, 0); n != 5 || string(b) != "abcde" {
		t.Fatalf("read after the crash: %q, %v", b[:n], err)
	}
}
