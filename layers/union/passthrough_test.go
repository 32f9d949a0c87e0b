package union_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWriteWhileReadOpen: a lower file held open for reading (passed
// through to the lower file) is opened for writing, which copies it up:
// the write reaches the upper copy, and a new reader sees it.
func TestWriteWhileReadOpen(t *testing.T) {
	upper, lower := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(lower, "f"), []byte("lower"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := mountUnion(t, upper, lower)
	r, err := os.Open(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(m.Path("f"), os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("upper!"); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(m.Path("f"))
	if err != nil || !bytes.Equal(b, []byte("upper!")) {
		t.Errorf("read back %q, %v", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "f")); string(b) != "lower" {
		t.Errorf("the lower file holds %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(upper, "f")); string(b) != "upper!" {
		t.Errorf("the upper file holds %q", b)
	}
}

// TestMmapWriteWhileReadOpen: as TestWriteWhileReadOpen, through a shared
// writable mapping of the writer: the kernel maps an open of a node that
// has a passthrough backing file to that file, which here is the lower
// file the reader holds. The writer's open therefore gets a node of its
// own (the kernel looks the name up again): its mapping writes the upper
// copy, the reader keeps reading the lower file, which stays as it was.
func TestMmapWriteWhileReadOpen(t *testing.T) {
	upper, lower := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(lower, "f"), []byte("lower content here"), 0o644); err != nil {
		t.Fatal(err)
	}
	m := mountUnion(t, upper, lower)
	r, err := os.Open(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := os.OpenFile(m.Path("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open for writing while a reader holds the lower file: %v", err)
	}
	mp, err := unix.Mmap(int(w.Fd()), 0, 10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	if string(mp[:5]) != "lower" {
		t.Errorf("the writer's mapping shows %q", mp[:10])
	}
	copy(mp, "UPPER")
	unix.Msync(mp, unix.MS_SYNC)
	unix.Munmap(mp)
	w.Close()
	if b, _ := os.ReadFile(filepath.Join(lower, "f")); string(b) != "lower content here" {
		t.Errorf("the lower file holds %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(upper, "f")); string(b) != "UPPER content here" {
		t.Errorf("the upper file holds %q", b)
	}
	if b, _ := os.ReadFile(m.Path("f")); string(b) != "UPPER content here" {
		t.Errorf("the mount shows %q", b)
	}
}
