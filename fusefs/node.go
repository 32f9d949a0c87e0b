// Package fusefs serves a cairn stack (a layer.FS) through FUSE with go-fuse.
//
// It is the only package that knows about FUSE. Nodes are addressed by path
// down the stack; open files are layer.File values. When no layer of the
// stack changes data, open files hand their lower descriptor to the kernel
// (FUSE passthrough) and reads and writes never reach this process.
package fusefs

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"cairn/layer"
)

// state is shared by all nodes of one mount.
type state struct {
	top         layer.FS
	passthrough bool // every layer leaves data unchanged
	log         *slog.Logger
	root        *node
	inos        inoMap
	handMu      sync.Mutex
	handed      map[<-chan struct{}][]*file // by request: descriptors handed to the kernel
}

type node struct {
	fs.Inode
	st *state
	id layer.ID // the object's identity (see inoMap)
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeReadlinker     = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeGetxattrer     = (*node)(nil)
	_ fs.NodeSetxattrer     = (*node)(nil)
	_ fs.NodeListxattrer    = (*node)(nil)
	_ fs.NodeRemovexattrer  = (*node)(nil)
	_ fs.NodeStatfser       = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.NodeOnForgetter    = (*node)(nil)
)

// path is the node's path in the stack; false if the node was removed.
func (n *node) path() (string, bool) {
	var names []string
	var p *fs.Inode = &n.Inode
	for !p.IsRoot() {
		name, parent := p.Parent()
		if parent == nil {
			return "", false
		}
		names = append(names, name)
		p = parent
	}
	size := 0
	for _, s := range names {
		size += len(s) + 1
	}
	buf := make([]byte, 0, size)
	for i := len(names) - 1; i >= 0; i-- {
		if len(buf) > 0 {
			buf = append(buf, '/')
		}
		buf = append(buf, names[i]...)
	}
	return string(buf), true
}

func (n *node) child(name string) (string, bool) {
	p, ok := n.path()
	return layer.Join(p, name), ok
}

// callerCtx attaches the FUSE caller's identity for the layers.
func callerCtx(ctx context.Context) context.Context {
	if fc, ok := ctx.(*fuse.Context); ok {
		return layer.WithCaller(ctx, &layer.Caller{Uid: fc.Caller.Uid, Gid: fc.Caller.Gid, Pid: fc.Caller.Pid})
	}
	return ctx
}

// errno converts a layer error for the kernel; errors that are not errnos
// are the layer's own failures (corrupt data, a broken lower): the operator
// gets a log line, the application EIO.
func (st *state) errno(op, path string, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	e := layer.Errno(err)
	if e == syscall.EIO {
		st.log.Error("I/O error", "op", op, "path", path, "err", err)
	}
	return e
}

// fillAttr fills out from a, all but the inode number, which is the node's
// (see inoMap).
func fillAttr(a *layer.Attr, out *fuse.Attr) {
	out.Size = a.Size
	out.Blocks = a.Blocks
	out.Atime, out.Atimensec = uint64(a.Atime.Sec), uint32(a.Atime.Nsec)
	out.Mtime, out.Mtimensec = uint64(a.Mtime.Sec), uint32(a.Mtime.Nsec)
	out.Ctime, out.Ctimensec = uint64(a.Ctime.Sec), uint32(a.Ctime.Nsec)
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Uid, out.Gid = a.Uid, a.Gid
	out.Rdev = uint32(a.Rdev)
	out.Blksize = a.Blksize
}

// newChild makes (or finds, by identity) the Inode for a looked-up or
// created object and fills out.
func (n *node) newChild(ctx context.Context, a *layer.Attr, out *fuse.EntryOut) *fs.Inode {
	fillAttr(a, &out.Attr)
	id := a.ID()
	ino := n.st.inos.ino(id)
	out.Attr.Ino = ino
	return n.NewInode(ctx, &node{st: n.st, id: id}, fs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: ino})
}

// OnForget: the kernel has forgotten the node.
func (n *node) OnForget() { n.st.inos.forget(n.id, n.StableAttr().Ino) }

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	a, err := n.st.top.Getattr(callerCtx(ctx), p)
	if err != nil {
		return nil, n.st.errno("lookup", p, err)
	}
	return n.newChild(ctx, &a, out), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var a layer.Attr
	var err error
	p := ""
	if fh, ok := f.(*file); ok {
		a, err = fh.f.Getattr(callerCtx(ctx))
	} else {
		var ok bool
		if p, ok = n.path(); !ok {
			return syscall.ENOENT
		}
		a, err = n.st.top.Getattr(callerCtx(ctx), p)
	}
	if err != nil {
		return n.st.errno("getattr", p, err)
	}
	fillAttr(&a, &out.Attr)
	out.Ino = n.StableAttr().Ino
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	var sa layer.SetAttr
	if m, ok := in.GetMode(); ok {
		sa.Valid |= layer.SetMode
		sa.Mode = m
	}
	if u, ok := in.GetUID(); ok {
		sa.Valid |= layer.SetUid
		sa.Uid = u
	}
	if g, ok := in.GetGID(); ok {
		sa.Valid |= layer.SetGid
		sa.Gid = g
	}
	if s, ok := in.GetSize(); ok {
		sa.Valid |= layer.SetSize
		sa.Size = s
	}
	switch {
	case in.Valid&fuse.FATTR_ATIME_NOW != 0:
		sa.Valid |= layer.SetAtimeNow
	case in.Valid&fuse.FATTR_ATIME != 0:
		sa.Valid |= layer.SetAtime
		sa.Atime = layer.Time{Sec: int64(in.Atime), Nsec: int64(in.Atimensec)}
	}
	switch {
	case in.Valid&fuse.FATTR_MTIME_NOW != 0:
		sa.Valid |= layer.SetMtimeNow
	case in.Valid&fuse.FATTR_MTIME != 0:
		sa.Valid |= layer.SetMtime
		sa.Mtime = layer.Time{Sec: int64(in.Mtime), Nsec: int64(in.Mtimensec)}
	}
	var a layer.Attr
	var err error
	p := ""
	if fh, ok := f.(*file); ok {
		a, err = fh.f.Setattr(callerCtx(ctx), &sa)
	} else {
		var ok bool
		if p, ok = n.path(); !ok {
			return syscall.ENOENT
		}
		a, err = n.st.top.Setattr(callerCtx(ctx), p, &sa)
	}
	if err != nil {
		return n.st.errno("setattr", p, err)
	}
	fillAttr(&a, &out.Attr)
	out.Ino = n.StableAttr().Ino
	return 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return nil, 0, syscall.ENOENT
	}
	lf, err := n.st.top.Open(callerCtx(ctx), p, int(flags))
	if err != nil {
		return nil, 0, n.st.errno("open", p, err)
	}
	return n.st.newFile(ctx, lf, p), n.st.openFlags(lf), 0
}

// openFlags keeps the kernel's page cache across opens of a file that says
// it may (see layer.CacheKeeper).
func (st *state) openFlags(f layer.File) uint32 {
	if k, ok := f.(layer.CacheKeeper); ok && !st.passthrough && k.KeepCache() {
		return fuse.FOPEN_KEEP_CACHE
	}
	return 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, nil, 0, syscall.ENOENT
	}
	lf, a, err := n.st.top.Create(callerCtx(ctx), p, int(flags), mode)
	if err != nil {
		return nil, nil, 0, n.st.errno("create", p, err)
	}
	return n.newChild(ctx, &a, out), n.st.newFile(ctx, lf, p), n.st.openFlags(lf), 0
}

// made finishes an operation that creates a directory entry.
func (n *node) made(ctx context.Context, op, p string, a layer.Attr, err error, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if err != nil {
		return nil, n.st.errno(op, p, err)
	}
	return n.newChild(ctx, &a, out), 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	a, err := n.st.top.Mkdir(callerCtx(ctx), p, mode)
	return n.made(ctx, "mkdir", p, a, err, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	a, err := n.st.top.Mknod(callerCtx(ctx), p, mode, uint64(dev))
	return n.made(ctx, "mknod", p, a, err, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	a, err := n.st.top.Symlink(callerCtx(ctx), target, p)
	return n.made(ctx, "symlink", p, a, err, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	old, ok1 := t.path()
	p, ok2 := n.child(name)
	if !ok1 || !ok2 {
		return nil, syscall.ENOENT
	}
	a, err := n.st.top.Link(callerCtx(ctx), old, p)
	return n.made(ctx, "link", p, a, err, out)
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return nil, syscall.ENOENT
	}
	s, err := n.st.top.Readlink(callerCtx(ctx), p)
	if err != nil {
		return nil, n.st.errno("readlink", p, err)
	}
	return []byte(s), 0
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	p, ok := n.child(name)
	if !ok {
		return syscall.ENOENT
	}
	return n.st.errno("unlink", p, n.st.top.Unlink(callerCtx(ctx), p))
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	p, ok := n.child(name)
	if !ok {
		return syscall.ENOENT
	}
	return n.st.errno("rmdir", p, n.st.top.Rmdir(callerCtx(ctx), p))
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	old, ok1 := n.child(name)
	nw, ok2 := np.child(newName)
	if !ok1 || !ok2 {
		return syscall.ENOENT
	}
	return n.st.errno("rename", old, n.st.top.Rename(callerCtx(ctx), old, nw, flags))
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return 0, syscall.ENOENT
	}
	sz, err := n.st.top.Getxattr(callerCtx(ctx), p, attr, dest)
	if err != nil {
		return uint32(sz), n.st.errno("getxattr", p, err)
	}
	return uint32(sz), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	p, ok := n.path()
	if !ok {
		return syscall.ENOENT
	}
	return n.st.errno("setxattr", p, n.st.top.Setxattr(callerCtx(ctx), p, attr, data, int(flags)))
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return 0, syscall.ENOENT
	}
	sz, err := n.st.top.Listxattr(callerCtx(ctx), p, dest)
	if err != nil {
		return uint32(sz), n.st.errno("listxattr", p, err)
	}
	return uint32(sz), 0
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	p, ok := n.path()
	if !ok {
		return syscall.ENOENT
	}
	return n.st.errno("removexattr", p, n.st.top.Removexattr(callerCtx(ctx), p, attr))
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	p, _ := n.path()
	s, err := n.st.top.Statfs(callerCtx(ctx), p)
	if err != nil {
		return n.st.errno("statfs", p, err)
	}
	out.Blocks, out.Bfree, out.Bavail = s.Blocks, s.Bfree, s.Bavail
	out.Files, out.Ffree = s.Files, s.Ffree
	out.Bsize, out.Frsize, out.NameLen = s.Bsize, s.Frsize, s.NameLen
	return 0
}

func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle,
	offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	in, ok1 := fhIn.(*file)
	dst, ok2 := fhOut.(*file)
	if !ok1 || !ok2 {
		return 0, syscall.EXDEV
	}
	c, err := in.f.CopyFileRange(callerCtx(ctx), int64(offIn), dst.f, int64(offOut), int64(length), uint32(flags))
	if err != nil {
		return 0, n.st.errno("copy_file_range", in.path, err)
	}
	return uint32(c), 0
}

// isEOF reports whether err only says that a read reached the end.
func isEOF(err error) bool { return err == io.EOF }
