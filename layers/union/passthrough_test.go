//go:build linux

package union_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
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
