//go:build linux

package union_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/layers/union"
)

// indexEntries lists the index of upper branch up (without the claim's
// lock file, which a mount or fsck makes there).
func indexEntries(t *testing.T, up string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(up, ".cairn-union-index"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.Name() != "lock" {
			names = append(names, e.Name())
		}
	}
	return names
}

func freeBlocks(t *testing.T, d string) uint64 {
	t.Helper()
	var s unix.Statfs_t
	if err := unix.Statfs(d, &s); err != nil {
		t.Fatal(err)
	}
	return s.Bfree * uint64(s.Bsize) / 4096
}

func statIno(t *testing.T, p string) (ino uint64, nlink uint64) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino, uint64(st.Nlink)
}

// TestUnionIndexCollected: the index entry of a copied-up file of several
// links goes, and its blocks are freed, once every name of the original
// is gone (removed through the union, whether it came to the copy first
// or was hidden before the copy-up), and is kept while a name of the
// original remains: looked up later, even after a remount, that name is
// linked to the copy (one inode, the copy's bytes).
func TestUnionIndexCollected(t *testing.T) {
	const size = 4 << 20
	data := bytes.Repeat([]byte("0123456789abcdef"), size/16)
	changed := append([]byte("changed\n"), data[8:]...)
	setup := func(names ...string) (up, lo string) {
		up, lo = smallFS(t, 64), t.TempDir()
		for i, n := range names {
			p := filepath.Join(lo, n)
			os.MkdirAll(filepath.Dir(p), 0o755)
			if i == 0 {
				if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Link(filepath.Join(lo, names[0]), p); err != nil {
				t.Fatal(err)
			}
		}
		return up, lo
	}
	change := func(m *mounttest.Mounted, name string) {
		t.Helper()
		f, err := os.OpenFile(m.Path(name), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte("changed\n"), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	remove := func(m *mounttest.Mounted, name string) {
		t.Helper()
		if err := os.Remove(m.Path(name)); err != nil {
			t.Fatal(err)
		}
	}
	lowerIntact := func(lo, name string) {
		t.Helper()
		if b, err := os.ReadFile(filepath.Join(lo, name)); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("the lower %s changed (%v)", name, err)
		}
	}

	t.Run("all names removed", func(t *testing.T) {
		up, lo := setup("a", "d/b")
		m := mountUnion(t, up, lo)
		free0 := freeBlocks(t, up)
		change(m, "a")
		if n := indexEntries(t, up); len(n) != 1 {
			t.Fatalf("index after the copy-up: %v", n)
		}
		if free0-freeBlocks(t, up) < size/4096 {
			t.Fatalf("the copy takes %d blocks", free0-freeBlocks(t, up))
		}
		remove(m, "a")
		if n := indexEntries(t, up); len(n) != 1 {
			t.Fatalf("index with d/b left: %v", n)
		}
		remove(m, "d/b")
		if n := indexEntries(t, up); len(n) != 0 {
			t.Fatalf("index after every name is removed: %v", n)
		}
		if used := free0 - freeBlocks(t, up); used > 16 {
			t.Fatalf("the copy's blocks are not freed: %d blocks used", used)
		}
		if !isWhiteout(t, filepath.Join(up, "a")) || !isWhiteout(t, filepath.Join(up, "d", "b")) {
			t.Fatal("no whiteouts")
		}
		for _, n := range []string{"a", "d/b"} {
			if _, err := os.Lstat(m.Path(n)); !os.IsNotExist(err) {
				t.Fatalf("%s is still seen: %v", n, err)
			}
			lowerIntact(lo, n)
		}
	})

	t.Run("one name left", func(t *testing.T) {
		up, lo := setup("a", "d/b")
		m := mountUnion(t, up, lo)
		ino0, _ := statIno(t, m.Path("a"))
		change(m, "a")
		remove(m, "a")
		m.Unmount()
		if n := indexEntries(t, up); len(n) != 1 {
			t.Fatalf("index with d/b left: %v", n)
		}
		m = mountUnion(t, up, lo)
		ino, nlink := statIno(t, m.Path("d", "b"))
		if ino != ino0 || nlink != 1 {
			t.Fatalf("d/b: ino %d nlink %d; a was ino %d", ino, nlink, ino0)
		}
		if b, err := os.ReadFile(m.Path("d", "b")); err != nil || !bytes.Equal(b, changed) {
			t.Fatalf("d/b does not read the copy's bytes (%v)", err)
		}
		idx := indexEntries(t, up)
		if len(idx) != 1 {
			t.Fatalf("index: %v", idx)
		}
		i1, _ := statIno(t, filepath.Join(up, "d", "b"))
		i2, _ := statIno(t, filepath.Join(up, ".cairn-union-index", idx[0]))
		if i1 != i2 {
			t.Fatal("d/b is not linked to the copy in the upper branch")
		}
		remove(m, "d/b")
		if n := indexEntries(t, up); len(n) != 0 {
			t.Fatalf("index after the last name is removed: %v", n)
		}
		lowerIntact(lo, "d/b")
	})

	t.Run("a name hidden before the copy-up", func(t *testing.T) {
		up, lo := setup("x", "y", "z")
		m := mountUnion(t, up, lo)
		remove(m, "x") // no copy yet: a placeholder counts it
		change(m, "y")
		remove(m, "y")
		if n := indexEntries(t, up); len(n) != 1 {
			t.Fatalf("index with z left: %v", n)
		}
		if b, err := os.ReadFile(m.Path("z")); err != nil || !bytes.Equal(b, changed) {
			t.Fatalf("z does not read the copy's bytes (%v)", err)
		}
		// A link made through the union is a name of the copy too.
		if err := os.Link(m.Path("z"), m.Path("w")); err != nil {
			t.Fatal(err)
		}
		remove(m, "z")
		if n := indexEntries(t, up); len(n) != 1 {
			t.Fatalf("index with w left: %v", n)
		}
		remove(m, "w")
		if n := indexEntries(t, up); len(n) != 0 {
			t.Fatalf("index after every name is removed: %v", n)
		}
	})

	t.Run("names hidden without a copy-up", func(t *testing.T) {
		up, lo := setup("p", "q")
		m := mountUnion(t, up, lo)
		remove(m, "p")
		if n := indexEntries(t, up); len(n) != 1 {
			t.Fatalf("index with q left: %v", n)
		}
		if b, err := os.ReadFile(m.Path("q")); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("q (%v)", err)
		}
		remove(m, "q")
		if n := indexEntries(t, up); len(n) != 0 {
			t.Fatalf("the placeholder stays: %v", n)
		}
	})
}

// TestUnionFsckIndex: an index entry that the counts keep although no name
// reaches it (here: the original has a link outside the read-only branch,
// which the union cannot see, so its names never all end) is reported by
// cairn fsck (exit 1) and removed by fsck --repair, which says so (exit 0);
// an entry that a name of the original still reaches is kept; fsck refuses
// a union that is mounted (exit 5).
func TestUnionFsckIndex(t *testing.T) {
	up, top := t.TempDir(), t.TempDir()
	lo := filepath.Join(top, "branch")
	write(t, filepath.Join(lo, "a"), "one file\n")
	write(t, filepath.Join(lo, "k1"), "kept\n")
	for _, l := range [][2]string{{"a", "b"}, {"k1", "k2"}} {
		if err := os.Link(filepath.Join(lo, l[0]), filepath.Join(lo, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(lo, "a"), filepath.Join(top, "outside")); err != nil {
		t.Fatal(err)
	}
	m := mountUnion(t, up, lo)
	for _, n := range []string{"a", "k1"} {
		f, err := os.OpenFile(m.Path(n), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("changed\n")
		f.Close()
	}
	for _, n := range []string{"a", "b", "k1"} {
		if err := os.Remove(m.Path(n)); err != nil {
			t.Fatal(err)
		}
	}
	m.Unmount()
	if n := indexEntries(t, up); len(n) != 2 {
		t.Fatalf("index: %v", n)
	}
	spec := filepath.Join(t.TempDir(), "spec.toml")
	write(t, spec, `mount = "u"
[layer.u]
type = "union"
over = ["up", "lo"]
[layer.up]
type = "local"
path = "`+up+`"
[layer.lo]
type = "local"
path = "`+lo+`"
`)
	p := mounttest.MountSpec(t, read(t, spec))
	if out, code := mounttest.Run(t, "fsck", spec); code != 5 {
		t.Fatalf("fsck of a mounted union: exit %d: %s", code, out)
	}
	p.Unmount()
	out, code := mounttest.Run(t, "fsck", spec)
	if code != 1 || !strings.Contains(out, "no name reaches") || !strings.Contains(out, "reached by none: 1") {
		t.Fatalf("fsck: exit %d: %s", code, out)
	}
	if n := indexEntries(t, up); len(n) != 2 {
		t.Fatalf("fsck without --repair changed the index: %v", n)
	}
	out, code = mounttest.Run(t, "fsck", "--repair", spec)
	if code != 0 || !strings.Contains(out, ": removed") {
		t.Fatalf("fsck --repair: exit %d: %s", code, out)
	}
	if n := indexEntries(t, up); len(n) != 1 {
		t.Fatalf("index after the repair: %v", n)
	}
	if out, code := mounttest.Run(t, "fsck", spec); code != 0 {
		t.Fatalf("fsck after the repair: exit %d: %s", code, out)
	}
	// The entry kept is k2's: looked up, k2 is the copy.
	m = mountUnion(t, up, lo)
	if got := read(t, m.Path("k2")); got != "kept\nchanged\n" {
		t.Fatalf("k2 reads %q", got)
	}
}

// TestUnionIndexModel: rounds of random writes, removals, links and
// renames of the names of two files of several links of the read-only
// branch, with remounts, against a model of the files (which names each
// has, and its bytes): every name read (the one each operation used, and
// all of them now and then; the others stay unlooked-up, as names of the
// original left on the read-only branch) reads its file's bytes, a removed
// name is gone, and fsck finds no index entry that no name reaches; once
// every name is removed, the index is empty.
func TestUnionIndexModel(t *testing.T) {
	seed := time.Now().UnixNano()
	if s := os.Getenv("CAIRN_FSX_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (replay: CAIRN_FSX_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	for round := 0; round < 20; round++ {
		indexRound(t, rng, round)
	}
}

func indexRound(t *testing.T, rng *rand.Rand, round int) {
	up, lo := t.TempDir(), t.TempDir()
	names := []string{"a", "b", "d/c", "g", "d/h", "x", "d/y"}
	file := map[string]int{"a": 0, "b": 0, "d/c": 0, "g": 1, "d/h": 1} // name -> file
	data := []string{"file 0\n", "file 1\n"}
	write(t, filepath.Join(lo, "a"), data[0])
	write(t, filepath.Join(lo, "g"), data[1])
	os.Mkdir(filepath.Join(lo, "d"), 0o755)
	for n, f := range file {
		if n != "a" && n != "g" {
			if err := os.Link(filepath.Join(lo, []string{"a", "g"}[f]), filepath.Join(lo, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	mount := func() (*union.FS, *mounttest.Mounted) {
		u, err := union.New([]fanout.Branch{{FS: localFS(t, up), Mode: fanout.RW}, {FS: localFS(t, lo), Mode: fanout.RO}}, union.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return u, mounttest.Mount(t, u)
	}
	u, m := mount()
	defer func() { m.Unmount() }()
	check := func(step int, some ...string) {
		t.Helper()
		if some == nil {
			some = names
		}
		for _, n := range some {
			b, err := os.ReadFile(m.Path(n))
			f, ok := file[n]
			switch {
			case !ok && !os.IsNotExist(err):
				t.Fatalf("round %d step %d: %s exists (%v)", round, step, n, err)
			case ok && err != nil:
				t.Fatalf("round %d step %d: %s: %v", round, step, n, err)
			case ok && string(b) != data[f]:
				t.Fatalf("round %d step %d: %s reads %q, its file has %q", round, step, n, b, data[f])
			}
		}
	}
	for step := 0; step < 40; step++ {
		n, n2 := names[rng.Intn(len(names))], names[rng.Intn(len(names))]
		f, ok := file[n]
		switch op := rng.Intn(20); {
		case op < 6: // write
			if !ok {
				continue
			}
			s := fmt.Sprintf("round %d step %d\n", round, step)
			w, err := os.OpenFile(m.Path(n), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatalf("round %d step %d: open %s: %v", round, step, n, err)
			}
			w.WriteString(s)
			w.Close()
			data[f] += s
		case op < 12: // unlink
			err := os.Remove(m.Path(n))
			if ok != (err == nil) {
				t.Fatalf("round %d step %d: unlink %s: %v", round, step, n, err)
			}
			delete(file, n)
		case op < 15: // link
			_, exists := file[n2]
			err := os.Link(m.Path(n), m.Path(n2))
			if (ok && !exists) != (err == nil) {
				t.Fatalf("round %d step %d: link %s %s: %v", round, step, n, n2, err)
			}
			if err == nil {
				file[n2] = f
			}
		case op < 18: // rename
			err := os.Rename(m.Path(n), m.Path(n2))
			if ok != (err == nil) {
				t.Fatalf("round %d step %d: rename %s %s: %v", round, step, n, n2, err)
			}
			if ok && n != n2 && !(file[n2] == f && hasName(file, n2)) {
				delete(file, n)
				file[n2] = f
			}
		default: // remount
			m.Unmount()
			u, m = mount()
		}
		check(step, n)
	}
	check(-1)
	var reports []string
	sum, err := u.Fsck(context.Background(), layer.CheckOnly, func(int, int, string) {}, func(r layer.FileReport) { reports = append(reports, r.Text) })
	if err != nil || sum.Bad != 0 {
		t.Fatalf("round %d: fsck: %s: %v (%v)", round, sum.Line, reports, err)
	}
	for n := range file {
		if err := os.Remove(m.Path(n)); err != nil {
			t.Fatal(err)
		}
	}
	if idx := indexEntries(t, up); len(idx) != 0 {
		t.Fatalf("round %d: index after every name is removed: %v", round, idx)
	}
}

func hasName(file map[string]int, n string) bool { _, ok := file[n]; return ok }

// TestUnionHardLinkCount: the link count of a copy in the index is the
// union's, as overlayfs's: the copy's names and the original's names not
// yet linked to it. With the copy's names only, a name the kernel had
// looked up before the copy-up (d/c), removed later, took the kernel's
// count of the inode to 0, and the kernel then refused to link the file's
// other name (b) with ENOENT, before asking the mount.
func TestUnionHardLinkCount(t *testing.T) {
	up, lo := t.TempDir(), t.TempDir()
	write(t, filepath.Join(lo, "a"), "one\n")
	os.Mkdir(filepath.Join(lo, "d"), 0o755)
	for _, n := range []string{"b", "d/c"} {
		if err := os.Link(filepath.Join(lo, "a"), filepath.Join(lo, n)); err != nil {
			t.Fatal(err)
		}
	}
	m := mountUnion(t, up, lo)
	if got := read(t, m.Path("d", "c")); got != "one\n" {
		t.Fatalf("d/c reads %q", got)
	}
	f, err := os.OpenFile(m.Path("b"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("two\n")
	var fst unix.Stat_t
	err = unix.Fstat(int(f.Fd()), &fst)
	f.Close()
	if err != nil || fst.Nlink != 3 {
		t.Fatalf("fstat of the copy: nlink %d (%v), want 3", fst.Nlink, err)
	}
	if _, nlink := statIno(t, m.Path("b")); nlink != 3 {
		t.Fatalf("b after the copy-up: nlink %d, want 3 (b, and a and d/c not yet linked)", nlink)
	}
	if err := os.Remove(m.Path("d", "c")); err != nil {
		t.Fatal(err)
	}
	if _, nlink := statIno(t, m.Path("b")); nlink != 2 {
		t.Fatalf("b after d/c is removed: nlink %d, want 2", nlink)
	}
	if err := os.Link(m.Path("b"), m.Path("x")); err != nil {
		t.Fatal(err)
	}
	ib, nb := statIno(t, m.Path("b"))
	ia, na := statIno(t, m.Path("a"))
	if ib != ia || nb != 3 || na != 3 || read(t, m.Path("x")) != "one\ntwo\n" || read(t, m.Path("a")) != "one\ntwo\n" {
		t.Fatalf("b: ino %d nlink %d; a: ino %d nlink %d", ib, nb, ia, na)
	}
}
