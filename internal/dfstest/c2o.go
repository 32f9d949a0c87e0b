package dfstest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

// CloseToOpen runs writers and readers on two mounts a and b of the same
// stack (two machines), one at a time with close-to-open discipline: one
// side changes a file (create, overwrite, write in place, append, truncate,
// rename, unlink) and closes it, then the other side opens and reads every
// file, which must hold exactly the bytes of the model, and lists the
// directory. rounds changes, alternating sides at random.
func CloseToOpen(t *testing.T, a, b string, rounds int) {
	t.Helper()
	seed := rand.Uint64()
	if v, err := strconv.ParseUint(os.Getenv("CAIRN_FSX_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	model := map[string][]byte{}
	names := []string{"f0", "f1", "f2", "d/f3", "d/f4"}
	for _, s := range []string{a} {
		if err := os.Mkdir(filepath.Join(s, "d"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fill := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.IntN(7)) // compressible, not constant
		}
		return p
	}
	var hist []string
	for i := 0; i < rounds; i++ {
		w, o := a, b
		if r.IntN(2) == 1 {
			w, o = b, a
		}
		name := names[r.IntN(len(names))]
		old, exists := model[name]
		path := filepath.Join(w, name)
		var desc string
		var err error
		switch op := r.IntN(8); {
		case op < 2 || !exists:
			data := fill(r.IntN(40000))
			desc = fmt.Sprintf("write %s (%d bytes)", name, len(data))
			if err = os.WriteFile(path, data, 0o644); err == nil {
				model[name] = data
			}
		case op < 4: // in place, maybe past the end
			off := r.IntN(len(old) + 5000)
			data := fill(1 + r.IntN(9000))
			desc = fmt.Sprintf("pwrite %s at %d (%d bytes)", name, off, len(data))
			var f *os.File
			if f, err = os.OpenFile(path, os.O_RDWR, 0); err == nil {
				if _, err = f.WriteAt(data, int64(off)); err == nil {
					err = f.Close()
				} else {
					f.Close()
				}
			}
			if err == nil {
				n := max(len(old), off+len(data))
				nb := make([]byte, n)
				copy(nb, old)
				copy(nb[off:], data)
				model[name] = nb
			}
		case op < 5:
			data := fill(1 + r.IntN(5000))
			desc = fmt.Sprintf("append %s (%d bytes)", name, len(data))
			var f *os.File
			if f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0); err == nil {
				if _, err = f.Write(data); err == nil {
					err = f.Close()
				} else {
					f.Close()
				}
			}
			if err == nil {
				model[name] = append(append([]byte(nil), old...), data...)
			}
		case op < 6:
			n := r.IntN(len(old) + 3000)
			desc = fmt.Sprintf("truncate %s to %d", name, n)
			if err = os.Truncate(path, int64(n)); err == nil {
				nb := make([]byte, n)
				copy(nb, old)
				model[name] = nb
			}
		case op < 7:
			to := names[r.IntN(len(names))]
			desc = fmt.Sprintf("rename %s %s", name, to)
			if err = os.Rename(path, filepath.Join(w, to)); err == nil && to != name {
				model[to] = old
				delete(model, name)
			}
		default:
			desc = "unlink " + name
			if err = os.Remove(path); err == nil {
				delete(model, name)
			}
		}
		if err != nil {
			t.Fatalf("round %d on %s: %s: %v\n%s", i, w, desc, err, strings.Join(hist, "\n"))
		}
		side := "a"
		if w == b {
			side = "b"
		}
		hist = append(hist, fmt.Sprintf("%d: %s: %s", i, side, desc))
		if len(hist) > 20 {
			hist = hist[1:]
		}
		// The other side opens and reads every file.
		for _, n := range names {
			got, err := os.ReadFile(filepath.Join(o, n))
			want, ok := model[n]
			switch {
			case !ok && os.IsNotExist(err):
			case !ok:
				t.Fatalf("round %d, after %s on the other side: %s in %s: %d bytes, %v; want no file", i, desc, n, o, len(got), err)
			case err != nil:
				t.Fatalf("round %d, after %s on the other side: reading %s in %s: %v\n%s", i, desc, n, o, err, strings.Join(hist, "\n"))
			case !bytes.Equal(got, want):
				at := 0
				for at < min(len(got), len(want)) && got[at] == want[at] {
					at++
				}
				t.Fatalf("round %d, after %s on the other side: %s in %s: %d bytes, want %d, first difference at %d", i, desc, n, o, len(got), len(want), at)
			}
		}
	}
}

// Stacks: a and b are two clients' mounts of one file system, mounted so
// that neither caches what the other changes; over each, the same null,
// crypt and zstd stacks over one directory, mounted with -shared, write and
// read in turns (close, then open on the other side) and never see wrong
// bytes, stale sizes or EIO.
func Stacks(t *testing.T, a, b string) {
	for _, kind := range []string{"null", "crypt", "zstd"} {
		t.Run(kind, func(t *testing.T) {
			sub := fmt.Sprintf("c2o-%s-%d", kind, rand.Uint32())
			specA, specB := TwoSpecs(t, kind, a, b, sub)
			pa := mounttest.MountSpec(t, specA, "-shared")
			pb := mounttest.MountSpec(t, specB, "-o", "shared") // fstab's way
			CloseToOpen(t, pa.Dir, pb.Dir, 200)
		})
	}
}

// Raw runs the same turns on the two clients' mounts a and b themselves.
func Raw(t *testing.T, a, b string) {
	sub := fmt.Sprintf("raw-%d", rand.Uint32())
	os.Mkdir(filepath.Join(a, sub), 0o755)
	CloseToOpen(t, filepath.Join(a, sub), filepath.Join(b, sub), 200)
}

// SharedDirs: directories that one machine renames, or removes and makes
// again, are seen as they are now by the other (crypt's directory IVs,
// which encrypt the names in them, change with them), with -shared, over
// two clients' mounts a and b.
func SharedDirs(t *testing.T, a, b string) {
	for _, kind := range []string{"crypt", "zstd"} {
		t.Run(kind, func(t *testing.T) {
			sub := fmt.Sprintf("dirs-%s-%d", kind, rand.Uint32())
			specA, specB := TwoSpecs(t, kind, a, b, sub)
			pa := mounttest.MountSpec(t, specA, "-shared")
			pb := mounttest.MountSpec(t, specB, "-shared")
			write := func(p, s string) {
				t.Helper()
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			read := func(p, want string) {
				t.Helper()
				got, err := os.ReadFile(p)
				if err != nil || string(got) != want {
					t.Fatalf("%s: %q, %v; want %q", p, got, err, want)
				}
			}
			write(pa.Path("x/y/f"), "one")
			read(pb.Path("x/y/f"), "one")
			// a removes x and makes it again: new directories.
			if err := os.RemoveAll(pa.Path("x")); err != nil {
				t.Fatal(err)
			}
			write(pa.Path("x/y/f"), "two")
			read(pb.Path("x/y/f"), "two")
			// b renames them; a reads through the new names.
			if err := os.Rename(pb.Path("x"), pb.Path("z")); err != nil {
				t.Fatal(err)
			}
			read(pa.Path("z/y/f"), "two")
			if _, err := os.Stat(pa.Path("x")); !os.IsNotExist(err) {
				t.Fatalf("x after b renamed it: %v", err)
			}
			write(pb.Path("x/f"), "three") // a new x, by b
			read(pa.Path("x/f"), "three")
			ents, err := os.ReadDir(pa.Path("z/y"))
			if err != nil || len(ents) != 1 || ents[0].Name() != "f" {
				t.Fatalf("z/y through a: %v, %v", ents, err)
			}
		})
	}
}

// OneWriterPerFile: two clients' codec stacks over one directory of the
// volume (a and b are two client mounts of it), mounted -shared: while one
// has a file open for writing, the other's open for writing fails with
// EBUSY (the writer lock is a flock on the lower file, which the
// distributed file system passes to its servers); reading is not refused;
// after the writer's close the other may write, and both read both writes.
func OneWriterPerFile(t *testing.T, a, b string) {
	sub := fmt.Sprintf("writer-%d", rand.Uint32())
	specA, specB := TwoSpecs(t, "zstd", a, b, sub)
	pa := mounttest.MountSpec(t, specA, "-shared")
	pb := mounttest.MountSpec(t, specB, "-shared")
	if err := os.WriteFile(pa.Path("f"), []byte("first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fa, err := os.OpenFile(pa.Path("f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fa.WriteString("by a\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.OpenFile(pb.Path("f"), os.O_WRONLY, 0); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("b opens for writing while a writes: %v, want EBUSY", err)
	}
	if got, err := os.ReadFile(pb.Path("f")); err != nil || string(got) != "first\n" {
		t.Fatalf("b reads while a writes: %q, %v", got, err)
	}
	if err := fa.Close(); err != nil {
		t.Fatal(err)
	}
	fb, err := os.OpenFile(pb.Path("f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("b opens for writing after a's close: %v", err)
	}
	if _, err := fb.WriteString("by b\n"); err != nil {
		t.Fatal(err)
	}
	if err := fb.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{pa.Path("f"), pb.Path("f")} {
		if got, err := os.ReadFile(p); err != nil || string(got) != "first\nby a\nby b\n" {
			t.Fatalf("%s after both wrote: %q, %v", p, got, err)
		}
	}
}
