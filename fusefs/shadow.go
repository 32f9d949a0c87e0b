package fusefs

import "cairnfs.dev/cairn/layer"

// Two objects on one number. The kernel takes a node id that a lookup or
// create returns with another generation than the inode it holds for that
// id as the sign that the number was reused: it marks its inode bad, and
// every read, write and fstat of the files open on it fails with EIO. A
// lower file system does not reuse an inode number while a file of it is
// open, but a stack may: a replica's identity is one replica's inode, and a
// file open for reading on another replica does not keep that one's inode
// from being reused once the file is unlinked. So when a new object comes
// to a number whose node has files open, and is another object (another
// generation), it gets a serial number of its own (inoMap.renumber) until
// the old node's files are released.

// noClash returns the number for a node of object id: ino, or a new one if
// ino's node has files open and is another object.
func (st *state) noClash(id layer.ID, ino uint64) uint64 {
	st.opensMu.Lock()
	old := st.openIno[ino]
	st.opensMu.Unlock()
	if old == nil || old.id == id {
		return ino
	}
	old.shadowed.Store(true)
	return st.inos.renumber(id)
}

// openedIno notes that n has files open; st.opensMu is held.
func (st *state) openedIno(n *node) {
	if st.openIno == nil {
		st.openIno = map[uint64]*node{}
	}
	st.openIno[n.StableAttr().Ino] = n
}

// releasedIno notes that n has no file open any more; st.opensMu is held.
// A new object that was given a number of its own because of n takes its
// own again (for the nodes made from now on).
func (st *state) releasedIno(n *node) {
	ino := n.StableAttr().Ino
	if st.openIno[ino] == n {
		delete(st.openIno, ino)
	}
	if n.shadowed.Swap(false) {
		st.inos.unfresh(n.id)
	}
}
