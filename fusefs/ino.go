package fusefs

import (
	"sync"

	"cairnfs.dev/cairn/third_party/gofuse/fuse"

	"cairnfs.dev/cairn/layer"
)

// inoMap gives every object the stack serves its inode number, which is
// also its node in go-fuse's tree, from the object's identity (layer.ID:
// the lower's device and inode numbers and the fan-out branch). Equal IDs
// (hard links) get one number, different IDs different numbers, so files of
// two file systems under one lower, or of two lowers of a fan-out layer,
// never share a node. The layout is gocryptfs's inomap:
//
//	[0][15-bit namespace][48-bit lower inode number]
//	[1][63-bit serial number]
//
// A namespace is one (device, branch) pair, numbered in the order the mount
// meets them; the root's comes first, as 0, so the files of the root's own
// file system keep the lower's inode numbers. A lower inode number of 2^48
// or more, or a namespace past the 32767th, takes a serial number instead
// ("spilled"), kept while the kernel knows the object (see forget); serial
// numbers are never reused.
type inoMap struct {
	mu    sync.Mutex
	ns    map[nsKey]uint64
	keys  []nsKey // by namespace number: the inverse of ns
	spill map[layer.ID]uint64
	// fresh gives objects a serial number in place of their own while a
	// node of their own number must be left to the files open on it (see
	// renumber).
	fresh map[layer.ID]uint64
	next  uint64 // next serial number
	root  layer.ID
}

type nsKey struct{ dev, branch uint64 }

const (
	nsShift  = 48
	maxNs    = 1<<15 - 1
	maxIno   = 1<<nsShift - 1
	spillBit = 1 << 63
)

// ino is the inode number of id, for a node.
func (m *inoMap) ino(id layer.ID) uint64 { return m.get(id, true) }

// direntIno is the inode number of id for a directory entry that may get
// no node (plain READDIR): a spilled number it makes is not kept, so
// listings do not grow the map (such an entry's d_ino then differs from the
// st_ino a later lookup gives).
func (m *inoMap) direntIno(id layer.ID) uint64 { return m.get(id, false) }

func (m *inoMap) get(id layer.ID, keep bool) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.fresh[noGen(id)]; ok {
		return n
	}
	if id.Ino <= maxIno {
		k := nsKey{id.Dev, id.Branch}
		ns, ok := m.ns[k]
		if !ok && len(m.ns) < maxNs {
			if m.ns == nil {
				m.ns = make(map[nsKey]uint64)
			}
			ns, ok = uint64(len(m.ns)), true
			m.ns[k] = ns
			m.keys = append(m.keys, k)
		}
		// The number is also the node id, and FUSE's root has 1 whatever
		// its inode number: another object cannot have it.
		if n := ns<<nsShift | id.Ino; ok && (n != fuse.FUSE_ROOT_ID || id == m.root) {
			return n
		}
	}
	if n, ok := m.spill[id]; ok {
		return n
	}
	n := spillBit | m.next
	m.next++
	if keep {
		if m.spill == nil {
			m.spill = make(map[layer.ID]uint64)
		}
		m.spill[id] = n
	}
	return n
}

// id is the identity (but its generation) of the object with number n, for
// finding it again from its node id alone; false for a serial number.
func (m *inoMap) id(n uint64) (layer.ID, bool) {
	if n&spillBit != 0 {
		return layer.ID{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	ns := n >> nsShift
	if ns >= uint64(len(m.keys)) {
		return layer.ID{}, false
	}
	return layer.ID{Dev: m.keys[ns].dev, Branch: m.keys[ns].branch, Ino: n & maxIno}, true
}

// forget drops a spilled number once the kernel has forgotten its node; the
// next lookup of the object gives it a new one.
func (m *inoMap) forget(id layer.ID, ino uint64) {
	if ino&spillBit == 0 {
		return
	}
	m.mu.Lock()
	if m.spill[id] == ino {
		delete(m.spill, id)
	}
	m.mu.Unlock()
}

// renumber gives id a new serial number, for the nodes made from now on:
// the node of its old number stays the files' that are open on it (a
// passthrough backing file the kernel keeps, see passthrough.go), and the
// next lookup of the name makes a node of the new number. The new number
// stays until that backing file is let go of (unfresh), not until the new
// node is forgotten: the kernel forgets at once the node of a lookup that
// revalidated a name, and looks it up again.
func (m *inoMap) renumber(id layer.ID) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := spillBit | m.next
	m.next++
	if m.fresh == nil {
		m.fresh = make(map[layer.ID]uint64)
	}
	m.fresh[noGen(id)] = n
	return n
}

// unfresh drops id's new number (renumber): the node of its own number has
// no backing file left.
func (m *inoMap) unfresh(id layer.ID) {
	m.mu.Lock()
	delete(m.fresh, noGen(id))
	m.mu.Unlock()
}

// noGen is id without its generation: fresh numbers replace the numbers
// made of the other fields (a layer may present one object with another
// generation later: a union's copy keeps its original's number, not its
// birth time).
func noGen(id layer.ID) layer.ID { id.Gen = 0; return id }
