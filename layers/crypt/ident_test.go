//go:build linux

package crypt

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// Two files with the same inode number on two file systems (a tmpfs mounted
// inside the lower) are two files to the journal too: each rewrites in place
// under a journal of its own, and releasing one leaves the other's.
func TestJournalPerFileSystem(t *testing.T) {
	mounttest.NeedRoot(t)
	ctx := context.Background()
	dir := mounttest.Tmpfs(t, "")
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Init(ctx, l, InitParams{KDF: fastKDF}, testPass); err != nil {
		t.Fatal(err)
	}
	l.Close()
	fs := open(t, dir)
	if _, err := fs.Mkdir(ctx, "sub", 0o755); err != nil {
		t.Fatal(err)
	}
	// Mount a tmpfs on the lower directory of sub, with its contents (the directory IV).
	ents, _ := os.ReadDir(dir)
	lsub := ""
	for _, e := range ents {
		if e.IsDir() && e.Name()[0] != '.' {
			lsub = filepath.Join(dir, e.Name())
		}
	}
	if lsub == "" {
		t.Fatalf("no lower directory for sub in %v", ents)
	}
	saved := map[string][]byte{}
	inner, _ := os.ReadDir(lsub)
	for _, e := range inner {
		saved[e.Name()], _ = os.ReadFile(filepath.Join(lsub, e.Name()))
	}
	mounttest.Tmpfs(t, lsub)
	for n, b := range saved {
		if err := os.WriteFile(filepath.Join(lsub, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A new stack: the first one's directory cache holds sub's old directory.
	fs = open(t, dir)
	data := bytes.Repeat([]byte("x"), 10000)
	if err := layer.WriteFile(ctx, fs, "a", data, 0o644); err != nil {
		t.Fatal(err)
	}
	aa, err := fs.Getattr(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	twin := ""
	for i := 0; i < 100 && twin == ""; i++ {
		p := fmt.Sprintf("sub/b%d", i)
		if err := layer.WriteFile(ctx, fs, p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if ba, err := fs.Getattr(ctx, p); err == nil && ba.Ino == aa.Ino {
			twin = p
		}
	}
	if twin == "" {
		t.Fatalf("no file of the inner tmpfs got inode number %d", aa.Ino)
	}
	fa, err := fs.Open(ctx, "a", syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := fs.Open(ctx, twin, syscall.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	// In-place rewrites: each journals its old blocks.
	if _, err := fa.WriteAt(ctx, []byte("AAAA"), 100); err != nil {
		t.Fatal(err)
	}
	if _, err := fb.WriteAt(ctx, []byte("BBBB"), 100); err != nil {
		t.Fatal(err)
	}
	journals, _ := os.ReadDir(filepath.Join(dir, journalDir))
	if len(journals) != 2 {
		t.Errorf("%d journals for two files rewritten in place, want 2: %v", len(journals), journals)
	}
	fa.Release(ctx)
	journals, _ = os.ReadDir(filepath.Join(dir, journalDir))
	if len(journals) != 1 {
		t.Errorf("after releasing one of the two files, %d journals left, want 1 (the other's): %v", len(journals), journals)
	}
	fb.Release(ctx)
	for p, want := range map[string]string{"a": "AAAA", twin: "BBBB"} {
		got, err := layer.ReadFile(ctx, fs, p)
		if err != nil || string(got[100:104]) != want {
			t.Errorf("%s: %q, %v", p, got[100:104], err)
		}
	}
}
