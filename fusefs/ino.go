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
// never share a node. The layout is gocryptfs's inomap, with mergerfs's hash
// where the identity does not fit:
//
//	[0][15-bit namespace][48-bit lower inode number]
//	[1][0][62-bit hash of the identity]
//	[1][1][62-bit serial number]
//
// A namespace is one (device, branch) pair, numbered in the order the mount
// meets them; the root's comes first, as 0, so the files of the root's own
// file system keep the lower's inode numbers. A lower inode number of 2^48
// or more (GlusterFS's are), or a namespace past the 32767th, takes a hash
// of its device, branch and inode numbers: the same number whenever the
// object is met, before and after the kernel forgets it and across
// remounts, with nothing to keep. (Serial numbers kept while the kernel
// knew the object, as gocryptfs keeps them, came apart between a FORGET and
// a LOOKUP that raced it, and gave two hard links two numbers.) Two
// identities whose hashes meet (about one chance in 10^8 for 10^5 hashed
// objects alive at once) are told apart when the second one's node is made
// (node.newNode): it takes a serial number, kept for the mount's life.
// Serial numbers are never reused.
type inoMap struct {
	mu   sync.Mutex
	ns   map[nsKey]uint64
	keys []nsKey // by namespace number: the inverse of ns
	// collided holds the serial numbers of identities whose hash another
	// identity had first.
	collided map[layer.ID]uint64
	// fresh gives objects a serial number in place of their own while a
	// node of their own number must be left to the files open on it (see
	// renumber).
	fresh map[layer.ID]uint64
	next  uint64 // next serial number
	root  layer.ID
	hash  func(layer.ID) uint64 // hashIno; tests make it collide
}

type nsKey struct{ dev, branch uint64 }

const (
	nsShift   = 48
	maxNs     = 1<<15 - 1
	maxIno    = 1<<nsShift - 1
	spillBit  = 1 << 63 // a hashed or serial number: not the lower's
	serialBit = 1 << 62 // a serial number (with spillBit)
	hashMask  = serialBit - 1
)

// ino is the inode number of id: a node's, and a directory entry's
// (READDIR, which makes no node) alike.
func (m *inoMap) ino(id layer.ID) uint64 {
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
	if n, ok := m.collided[noGen(id)]; ok {
		return n
	}
	h := hashIno
	if m.hash != nil {
		h = m.hash
	}
	return spillBit | h(id)&hashMask
}

// hashIno mixes an identity's device, branch and inode numbers (not its
// generation: a reused inode number keeps its st_ino, as on the lower)
// with splitmix64's finaliser.
func hashIno(id layer.ID) uint64 {
	h := uint64(0x9e3779b97f4a7c15)
	for _, v := range [3]uint64{id.Dev, id.Branch, id.Ino} {
		h = mix64(h ^ v)
	}
	return h
}

func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// hashed says whether n is a hashed number (not the lower's, not serial).
func hashed(n uint64) bool { return n&(spillBit|serialBit) == spillBit }

// collide gives id, whose hashed number another identity's node holds, a
// serial number of its own for the rest of the mount.
func (m *inoMap) collide(id layer.ID) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.collided[noGen(id)]; ok {
		return n
	}
	if m.collided == nil {
		m.collided = make(map[layer.ID]uint64)
	}
	n := m.serial()
	m.collided[noGen(id)] = n
	return n
}

// serial is a new serial number; m.mu is held.
func (m *inoMap) serial() uint64 {
	n := spillBit | serialBit | m.next
	m.next++
	return n
}

// id is the identity (but its generation) of the object with number n, for
// finding it again from its node id alone; false for a hashed or serial
// number.
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
	n := m.serial()
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
