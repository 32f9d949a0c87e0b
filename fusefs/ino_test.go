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
	// Inode numbers past 48 bits are hashed: distinct, the same for a
	// directory entry as for a node, whatever the generation, and the same
	// in another map (a remount) whatever the order objects are met in.
	big1, big2 := layer.ID{Dev: 10, Ino: 1 << 50}, layer.ID{Dev: 11, Ino: 1 << 50}
	a, b := m.ino(big1), m.ino(big2)
	if !hashed(a) || !hashed(b) || a == b || m.ino(big1) != a || m.ino(big1) != a {
		t.Fatalf("hashed: %x %x", a, b)
	}
	if m.ino(layer.ID{Dev: 10, Ino: 1 << 50, Gen: 7}) != a {
		t.Fatal("a hashed number depends on the generation")
	}
	var again inoMap
	again.ino(root)
	if again.ino(big2) != b || again.ino(big1) != a {
		t.Fatal("hashed numbers differ after a remount")
	}
	// Past 32767 namespaces, new ones are hashed.
	for dev := uint64(100); len(m.ns) < maxNs; dev++ {
		m.ino(layer.ID{Dev: dev, Ino: 5})
	}
	if got := m.ino(layer.ID{Dev: 1 << 40, Ino: 5}); !hashed(got) {
		t.Fatalf("namespace %d was not hashed: %x", maxNs+1, got)
	}
	// A collision: the second identity takes a serial number, kept.
	m.hash = func(layer.ID) uint64 { return 42 }
	x, y := layer.ID{Dev: 20, Ino: 1 << 49}, layer.ID{Dev: 21, Ino: 1 << 49}
	if m.ino(x) != m.ino(y) {
		t.Fatal("the test hash does not collide")
	}
	s := m.collide(y)
	if hashed(s) || s&spillBit == 0 || m.ino(y) != s || m.collide(y) != s || m.ino(x) == s {
		t.Fatalf("collided: %x, then %x", s, m.ino(y))
	}
	if r := m.renumber(x); r == s || r&serialBit == 0 {
		t.Fatalf("serial numbers reused: %x %x", r, s)
	}
}
