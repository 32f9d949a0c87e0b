package union_test

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMmapWhileReadOpen: with a lower file held open for reading (passed
// through to the lower file), a file opened for writing (copied up) and
// mapped shared shows and changes the upper copy, never the read-only
// lower branch; a reader opened after the write maps the written bytes.
func TestMmapWhileReadOpen(t *testing.T) {
	upper, lower := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(lower, "f"), []byte("lower bytes"), 0o644); err != nil {
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
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteAt([]byte("UPPER"), 0); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(w.Fd()), 0, 11, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap of the writer: %v", err)
	}
	if string(b) != "UPPER bytes" {
		t.Errorf("the writer's mapping shows %q, want %q", b, "UPPER bytes")
	}
	copy(b[6:], "MAPPD")
	unix.Msync(b, unix.MS_SYNC)
	unix.Munmap(b)
	r2, err := os.Open(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if b, err := unix.Mmap(int(r2.Fd()), 0, 11, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		t.Errorf("mmap of a new reader: %v", err)
	} else {
		if string(b) != "UPPER MAPPD" {
			t.Errorf("a new reader's mapping shows %q, want %q", b, "UPPER MAPPD")
		}
		unix.Munmap(b)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "f")); string(b) != "lower bytes" {
		t.Errorf("the read-only lower file holds %q", b)
	}
}
