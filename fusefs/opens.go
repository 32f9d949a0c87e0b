package fusefs

import (
	"context"
	"errors"
	"syscall"

	"cairnfs.dev/cairn/third_party/gofuse/fs"

	"cairnfs.dev/cairn/layer"
)

// Open files by node. The layer API opens objects by path, and a node
// loses its path when its last name is removed; the kernel may still ask
// for it while a file of it is open: fchmod or futimens (SETATTR without a
// handle), a link of an O_TMPFILE file (linkFile), an open by file handle
// (open_by_handle_at of a removed file that is still open: the kernel
// finds the node in its cache). Those go through one of the node's open
// files. The mount keeps, for each node with files open, the files the
// kernel holds, so it holds nothing of its own: no descriptor, no file, past
// the kernel's release.

// opened registers f, an open file of the node ino.
func (st *state) opened(f *file) {
	n := fileNode(f)
	if n == nil {
		return
	}
	st.opensMu.Lock()
	if st.opens == nil {
		st.opens = map[*node][]*file{}
	}
	st.opens[n] = append(st.opens[n], f)
	st.openedIno(n)
	st.opensMu.Unlock()
}

// released forgets f.
func (st *state) released(f *file) {
	n := fileNode(f)
	if n == nil {
		return
	}
	st.opensMu.Lock()
	fs := st.opens[n]
	for i := range fs {
		if fs[i] == f {
			fs = append(fs[:i], fs[i+1:]...)
			break
		}
	}
	if len(fs) == 0 {
		delete(st.opens, n)
		st.releasedIno(n)
	} else {
		st.opens[n] = fs
	}
	st.opensMu.Unlock()
}

// releaseLeft releases the files still open once the mount is gone. The
// kernel sends RELEASE after close(2) returns, and at the unmount it drops
// the requests the daemon has not read yet: a file closed just before the
// unmount was never released, and its layers' work at release (a codec's
// header and fold, a replica's times) was lost. The kernel's backing files
// went with the connection: there is nothing to unregister.
func (st *state) releaseLeft() {
	st.opensMu.Lock()
	opens := st.opens
	st.opens = nil
	st.opensMu.Unlock()
	for _, fs := range opens {
		for _, f := range fs {
			st.errno("release", f.path, f.f.Release(context.Background()))
			st.nopen.Add(-1)
		}
	}
}

func fileNode(f *file) *node {
	if f.ino == nil {
		return nil
	}
	n, _ := f.ino.Operations().(*node)
	return n
}

// openFile is one of the node's open files, nil if it has none.
func (n *node) openFile() *file {
	n.st.opensMu.Lock()
	defer n.st.opensMu.Unlock()
	if fs := n.st.opens[n]; len(fs) > 0 {
		return fs[len(fs)-1]
	}
	return nil
}

// reopen opens the node, which has no path, from one of its open files
// (layer.ReopenFile), and returns the open flags wbOpen adds: ESTALE where
// the stack's files cannot reopen, or the node has no file open (as
// open_by_handle_at of a removed file on ext4).
func (n *node) reopen(ctx context.Context, flags uint32) (layer.File, fs.FileHandle, uint32, syscall.Errno) {
	of := n.openFile()
	if of == nil {
		return nil, nil, 0, syscall.ESTALE
	}
	var lf layer.File
	direct, err := n.st.wbOpen(flags, func(flags uint32) (err error) {
		lf, err = layer.ReopenFile(callerCtx(ctx), of.f, int(flags))
		return err
	})
	if errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EBADF) {
		return nil, nil, 0, syscall.ESTALE
	}
	if err != nil {
		return nil, nil, 0, n.st.errno("open", of.path, err)
	}
	return lf, n.st.newFile(ctx, lf, of.path, &n.Inode, flags), direct, 0
}
