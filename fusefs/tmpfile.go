package fusefs

import (
	"context"
	"syscall"

	"cairnfs.dev/cairn/third_party/gofuse/fs"
	"cairnfs.dev/cairn/third_party/gofuse/fuse"

	"cairnfs.dev/cairn/layer"
)

var _ fs.NodeTmpfiler = (*node)(nil)

// Tmpfile serves open(2) with O_TMPFILE: a file with no name in this
// directory (layer.FS.Tmpfile), whose node is in no directory until a link
// names it (linkFile). Its inode number is its identity's, as any node's.
// A stack without FSTmpfile answers ENOSYS, after which the kernel answers
// EOPNOTSUPP itself for the rest of the mount.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.st.fscaps&layer.FSTmpfile == 0 {
		return nil, nil, 0, syscall.ENOSYS
	}
	p, ok := n.path()
	if !ok {
		return nil, nil, 0, syscall.ENOENT
	}
	var lf layer.File
	var a layer.Attr
	direct, err := n.st.wbOpen(flags, func(flags uint32) (err error) {
		lf, a, err = n.st.top.Tmpfile(n.st.creatorCtx(ctx), p, int(flags)&^oTmpfile, mode)
		return err
	})
	if err != nil {
		return nil, nil, 0, n.st.errno("tmpfile", p, err)
	}
	ch := n.newNode(ctx, &a, out)
	return ch, n.st.newFile(ctx, lf, p, ch, flags), n.st.openFlags(lf) | direct, 0
}

// linkFile links node t, which has no path (a tmpfile's), at p through its
// open file: linkat(2) of /proc/self/fd/N. With no file open there is
// nothing to link from (the kernel asks only while one is).
func (n *node) linkFile(ctx context.Context, t *node, p string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	fh := t.openFile()
	if fh == nil || n.st.fscaps&layer.FSTmpfile == 0 {
		return nil, syscall.ENOENT
	}
	a, err := n.st.top.LinkFile(callerCtx(ctx), fh.f, p)
	return n.made(ctx, "link", p, a, err, out)
}
