//go:build linux

package union_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
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
	if got := mounttest.MapCopyOut(t, b); string(got) != "UPPER bytes" {
		t.Errorf("the writer's mapping shows %q, want %q", got, "UPPER bytes")
	}
	mounttest.MapCopyIn(t, b[6:], "MAPPD")
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
		if got := mounttest.MapCopyOut(t, b); string(got) != "UPPER MAPPD" {
			t.Errorf("a new reader's mapping shows %q, want %q", got, "UPPER MAPPD")
		}
		unix.Munmap(b)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "f")); string(b) != "lower bytes" {
		t.Errorf("the read-only lower file holds %q", b)
	}
}

// TestLongMergedListing: a directory of 9000 names on two branches (some
// on both, some whited out, one a file above and a directory below, one a
// directory on both) is listed once each; seekdir to cookies far behind
// the last read (past the ring of recent entries: from a checkpoint) and
// near it continues with the entry that followed, in both branches' parts,
// also after a seek back; rewinddir lists the same names again.
func TestLongMergedListing(t *testing.T) {
	upper, lower := t.TempDir(), t.TempDir()
	want := map[string]bool{}
	for i := range 6000 {
		name := fmt.Sprintf("lo-%05d", i)
		os.WriteFile(filepath.Join(lower, name), nil, 0o644)
		want[name] = true
	}
	os.Mkdir(filepath.Join(lower, "mix"), 0o755)
	os.WriteFile(filepath.Join(lower, "mix", "x"), nil, 0o644)
	os.Mkdir(filepath.Join(lower, "both"), 0o755)
	m := mountUnion(t, upper, lower)
	for i := 0; i < 6000; i += 13 {
		name := fmt.Sprintf("lo-%05d", i)
		if err := os.Remove(m.Path(name)); err != nil {
			t.Fatal(err)
		}
		delete(want, name)
	}
	for i := 1; i < 6000; i += 17 {
		if i%13 == 0 {
			continue // whited out
		}
		if err := os.WriteFile(m.Path(fmt.Sprintf("lo-%05d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3000 {
		name := fmt.Sprintf("up-%05d", i)
		os.WriteFile(filepath.Join(upper, name), nil, 0o644)
		want[name] = true
	}
	if err := os.RemoveAll(m.Path("mix")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("mix"), []byte("file"), 0o644); err != nil {
		t.Fatal(err)
	}
	want["mix"] = true
	os.Mkdir(filepath.Join(upper, "both"), 0o755)
	want["both"] = true
	fd, err := unix.Open(m.Dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	list := func() []dent {
		var all []dent
		seen := map[string]int{}
		for ds := getdents(t, fd); len(ds) > 0; ds = getdents(t, fd) {
			for _, d := range ds {
				if seen[d.name]++; seen[d.name] == 2 {
					t.Errorf("%s listed twice", d.name)
				}
				all = append(all, d)
			}
		}
		for name := range want {
			if seen[name] != 1 {
				t.Errorf("%s listed %d times, want once", name, seen[name])
			}
		}
		for name := range seen {
			if !want[name] {
				t.Errorf("%s listed, not in the directory", name)
			}
		}
		return all
	}
	all := list()
	if t.Failed() {
		t.FailNow()
	}
	next := func(k int) {
		t.Helper()
		if _, err := unix.Seek(fd, all[k].off, 0); err != nil {
			t.Fatalf("seekdir to the cookie of %s: %v", all[k].name, err)
		}
		ds := getdents(t, fd)
		if len(ds) == 0 || ds[0].name != all[k+1].name {
			t.Errorf("after seekdir to the cookie of %s (entry %d): %v, want %q", all[k].name, k, ds[:min(len(ds), 1)], all[k+1].name)
		}
	}
	for _, k := range []int{0, 1, 4095, 4096, 4097, 5000, 8191, 8192, 100, len(all) - 2, 2, len(all) - 4097, 4500, 7000, 6} {
		next(k)
	}
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		t.Fatal(err)
	}
	list()
}
