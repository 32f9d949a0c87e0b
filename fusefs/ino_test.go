package fusefs

import (
	"testing"

	"cairnfs.dev/cairn/layer"
)

func TestInoMap(t *testing.T) {
	var m inoMap
	root := layer.ID{Dev: 10, Ino: 2}
	if got := m.ino(root); got != 2 {
		t.Fatalf("the root's file system must keep its inode numbers: %d", got)
	}
	if got := m.ino(layer.ID{Dev: 10, Ino: 77}); got != 77 {
		t.Fatalf("inode 77 of the root's file system: %d", got)
	}
	other := m.ino(layer.ID{Dev: 11, Ino: 77})
	branch := m.ino(layer.ID{Dev: 10, Branch: 1, Ino: 77})
	if other == 77 || branch == 77 || other == branch {
		t.Fatalf("equal inode numbers of other namespaces: %d %d", other, branch)
	}
	if m.ino(layer.ID{Dev: 11, Ino: 77}) != other {
		t.Fatal("not stable")
	}
	// Inode numbers past 48 bits spill; the spilled numbers are distinct
	// and stable while kept.
	big1, big2 := layer.ID{Dev: 10, Ino: 1 << 50}, layer.ID{Dev: 11, Ino: 1 << 50}
	a, b := m.ino(big1), m.ino(big2)
	if a&spillBit == 0 || b&spillBit == 0 || a == b || m.ino(big1) != a {
		t.Fatalf("spilled: %x %x", a, b)
	}
	if d := m.direntIno(layer.ID{Dev: 12, Ino: 1 << 50}); d&spillBit == 0 || len(m.spill) != 2 {
		t.Fatalf("a directory entry's spilled number is kept: %x, %d kept", d, len(m.spill))
	}
	m.forget(big1, a)
	if c := m.ino(big1); c == a || c == b {
		t.Fatalf("a forgotten spilled number came back: %x", c)
	}
	// Past 32767 namespaces, new ones spill.
	for dev := uint64(100); len(m.ns) < maxNs; dev++ {
		m.ino(layer.ID{Dev: dev, Ino: 5})
	}
	if got := m.ino(layer.ID{Dev: 1 << 40, Ino: 5}); got&spillBit == 0 {
		t.Fatalf("namespace %d did not spill: %x", maxNs+1, got)
	}
}
