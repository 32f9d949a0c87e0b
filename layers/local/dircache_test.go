package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"cairnfs.dev/cairn/layer"
)

func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A rename or rmdir through the layer must not leave a cached descriptor
// that sends later operations to the old directory.
func TestDirCacheFollowsRenames(t *testing.T) {
	fs, root := newFS(t)
	ctx := context.Background()
	if err := layer.MkdirAll(ctx, fs, "a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := layer.WriteFile(ctx, fs, "a/b/f", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	// a/b is cached now; move a away and make a new a/b.
	if err := fs.Rename(ctx, "a", "c", 0); err != nil {
		t.Fatal(err)
	}
	if err := layer.MkdirAll(ctx, fs, "a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := layer.WriteFile(ctx, fs, "a/b/g", []byte("2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "a/b/g")); err != nil {
		t.Fatalf("the new a/b did not get g: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "c/b/g")); err == nil {
		t.Fatal("g went to the renamed directory c/b through a stale descriptor")
	}
	// rmdir, then a directory of the same name: the old one is gone.
	if err := fs.Unlink(ctx, "a/b/g"); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rmdir(ctx, "a/b"); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Mkdir(ctx, "a/b", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := layer.WriteFile(ctx, fs, "a/b/h", []byte("3"), 0o644); err != nil {
		t.Fatalf("create in a directory made again after rmdir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "a/b/h")); err != nil {
		t.Fatal(err)
	}
	// RENAME_EXCHANGE swaps two cached directories.
	if err := layer.WriteFile(ctx, fs, "c/b/x", []byte("4"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(ctx, "a", "c", 2 /* RENAME_EXCHANGE */); err != nil {
		t.Fatal(err)
	}
	if err := layer.WriteFile(ctx, fs, "a/b/y", []byte("5"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "a/b/x")); err != nil {
		t.Fatalf("after the exchange, a/b is the old c/b: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "a/b/y")); err != nil {
		t.Fatalf("y not in the exchanged a/b: %v", err)
	}
}

// The cache holds a bounded number of descriptors, and Close releases them.
func TestDirCacheIsBounded(t *testing.T) {
	root := t.TempDir()
	fs, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := openFds(t)
	for i := 0; i < 3*dirCacheSize; i++ {
		d := fmt.Sprintf("d%d/e", i)
		if err := layer.MkdirAll(ctx, fs, d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := layer.WriteFile(ctx, fs, d+"/f", nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if n := openFds(t) - before; n > dirCacheSize {
		t.Fatalf("%d descriptors open after touching %d directories; the bound is %d", n, 6*dirCacheSize, dirCacheSize)
	}
	if n := len(fs.dirs.m); n == 0 || n > dirCacheSize {
		t.Fatalf("%d cached directories", n)
	}
	fs.Close()
	if n := openFds(t) - before; n > 0 {
		t.Fatalf("%d descriptors left open after Close", n)
	}
}
