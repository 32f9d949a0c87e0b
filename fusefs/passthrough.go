package fusefs

import (
	"cairnfs.dev/cairn/layer"

	"cairnfs.dev/cairn/third_party/gofuse/fuse"
	"golang.org/x/sys/unix"
)

// Passthrough. The kernel reads and writes a file opened with
// FOPEN_PASSTHROUGH in its backing file, one the daemon registered, without
// asking the daemon; it has one backing file per inode, and it refuses
// (the open fails with EIO) a second backing file for an inode that has
// one, a passed-through open of an inode with files open in cached io mode,
// and an open that is not passed through of an inode that has a backing
// file. Each open of a node therefore gets one of three answers:
//
//   - passed through to the node's backing file: the layer's file can be
//     passed through (layer.CapPassthrough) to the same file (device and
//     inode) as the node's other passed-through files, or the node has none
//     and no file in cached io mode (then the layer's file becomes the
//     node's backing file);
//   - FOPEN_PASSTHROUGH with FOPEN_DIRECT_IO, when the node has a backing
//     file and this file is not to be passed through (a file the layer
//     serves itself: a codec's plain file open to write, a replica's write
//     to every replica), or is another file and the open is read-only:
//     reads and writes come to the daemon, which serves them from the
//     layer's file (a mapping of it, though, maps the backing file, as the
//     kernel does for such opens);
//   - ESTALE for an open that may write and would be passed through to
//     another file than the node's backing file: a shared mapping of it
//     would write the backing file, whatever its access mode (a union's
//     lower file held open by a reader from before a copy-up). The object
//     is given a new node number, so that the kernel, which looks the name
//     up again on ESTALE, opens a node of its own, with no backing file;
//     the files open on the old node keep it (its st_ino then differs from
//     the new one's until they are closed);
//   - cached io through the daemon otherwise.
//
// The daemon decides this itself rather than through go-fuse's
// FilePassthroughFder, which shares a node's backing file with every later
// open whatever its layer file is (a union's write to a lower file read
// through passthrough went to the read-only branch), and whose release of
// any file drops a reference to the backing file that only passed-through
// files took (the next open got a second backing file: EIO).
//
// The kernel sends RELEASE once it has let go of the file, so what the
// daemon counts here is never less than what the kernel holds.

// backing is a node's backing file.
type backing struct {
	id       int32
	dev, ino uint64
	refs     int
}

// opening records f as the file of the OPEN or CREATE request it is opened
// in (f.req), for passOpened.
func (st *state) opening(f *file) {
	st.ptMu.Lock()
	if st.openings == nil {
		st.openings = map[<-chan struct{}]*file{}
	}
	st.openings[f.req] = f
	st.ptMu.Unlock()
}

// passOpened sets the reply out of the OPEN or CREATE request req, which
// gave status s, to say how the kernel reads and writes its file; false
// when the open must fail with ESTALE instead (its node renumbered).
func (st *state) passOpened(req <-chan struct{}, s fuse.Status, out *fuse.OpenOut) bool {
	st.ptMu.Lock()
	defer st.ptMu.Unlock()
	f := st.openings[req]
	delete(st.openings, req)
	if f == nil || !s.Ok() {
		return true
	}
	n := fileNode(f)
	if n == nil {
		return true
	}
	pass := true
	if !st.withBackingFd(f, func(fd int, dev, ino uint64) { pass = st.passWith(f, n, fd, dev, ino, out) }) {
		pass = st.passWith(f, n, -1, 0, 0, out)
	}
	return pass
}

// passWith is passOpened's decision with fd, a descriptor of the file f
// would pass through to (the kernel takes its own reference when it
// registers it), or -1. st.ptMu is held.
func (st *state) passWith(f *file, n *node, fd int, dev, ino uint64, out *fuse.OpenOut) bool {
	switch {
	case fd >= 0 && n.bk != nil && n.bk.dev == dev && n.bk.ino == ino:
	case fd >= 0 && n.bk == nil && n.cached == 0:
		id, errno := registerBackingFd(st.srv, fd)
		if errno != 0 {
			// Not root, or no CAP_SYS_ADMIN: no passthrough for this mount.
			st.ptOff = true
			st.log.Warn("the kernel refuses backing files: files are served by the daemon", "err", errno)
			n.cached++
			f.cached = true
			return true
		}
		n.bk = &backing{id: id, dev: dev, ino: ino}
	case n.bk != nil && f.writable && fd >= 0:
		st.inos.renumber(n.id)
		return false
	case n.bk != nil:
		out.OpenFlags |= fuse.FOPEN_DIRECT_IO | fuse.FOPEN_PASSTHROUGH
		out.OpenFlags &^= fuse.FOPEN_KEEP_CACHE
		out.BackingID = n.bk.id
		n.bk.refs++
		f.bk = n.bk
		return true
	default:
		n.cached++
		f.cached = true
		return true
	}
	out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
	out.OpenFlags &^= fuse.FOPEN_KEEP_CACHE
	out.BackingID = n.bk.id
	n.bk.refs++
	f.bk = n.bk
	f.passed.Store(true)
	return true
}

// withBackingFd calls fn with a descriptor of the file f passes through to
// and its device and inode, borrowed (layer.LendFd: a duplicate's close
// would be a FLUSH round trip on a FUSE or network lower), and reports
// whether it did. st.ptMu is held.
func (st *state) withBackingFd(f *file, fn func(fd int, dev, ino uint64)) bool {
	if !kernelPassthrough || st.ptOff || st.srv == nil || !st.passes(f.f.Caps()) {
		return false
	}
	called := false
	layer.LendFd(f.f, func(fd int) {
		var s unix.Stat_t
		if unix.Fstat(fd, &s) == nil {
			called = true
			fn(fd, uint64(s.Dev), s.Ino)
		}
	})
	return called
}

// passReleased: the kernel has let go of f.
func (st *state) passReleased(f *file) {
	n := fileNode(f)
	st.ptMu.Lock()
	defer st.ptMu.Unlock()
	switch {
	case f.bk != nil:
		if f.bk.refs--; f.bk.refs == 0 {
			if errno := unregisterBackingFd(st.srv, f.bk.id); errno != 0 {
				st.log.Warn("cannot unregister a backing file", "path", f.path, "err", errno)
			}
			if n != nil && n.bk == f.bk {
				n.bk = nil
				st.inos.unfresh(n.id)
			}
		}
		f.bk = nil
	case f.cached:
		if n != nil {
			n.cached--
		}
		f.cached = false
	}
}
