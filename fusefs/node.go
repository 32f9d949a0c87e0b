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
	"sync/atomic"
	"syscall"
	"time"

	"cairnfs.dev/cairn/third_party/gofuse/fs"
	"cairnfs.dev/cairn/third_party/gofuse/fuse"
	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// state is shared by all nodes of one mount.
type state struct {
	top           layer.FS
	passthrough   bool         // files may be passed through (not NoPassthrough); each file's Caps decide
	fscaps        layer.FSCaps // what the stack can do (layer.FSCapsOf), computed once
	atime         layer.Atime  // the mount's atime options (AtimeOf)
	acl           bool         // the kernel handles POSIX ACLs (allow_other mounts)
	log           *slog.Logger
	root          *node
	inos          inoMap
	finds         bool // the stack finds objects by identity (layer.CanFind): file handles work
	xattrReplaces bool // a layer may replace an object on an xattr change (layer.ReplacesOnXattr)
	cacheDirs     bool // the kernel keeps directory listings (see Options.AttrTimeout)
	shared        bool // Options.Shared: no page cache kept across opens either
	// xattrTTL: how long a node remembers that it lacks a common xattr
	// (xattrcache.go); negative: until it changes; 0: not at all.
	xattrTTL  time.Duration
	writeback bool  // Options.Writeback: the kernel's writeback cache (writeback.go)
	known     known // what finding them needs (see handles.go)
	// Passthrough (passthrough.go).
	srv      *fuse.Server
	ptMu     sync.Mutex
	ptOff    bool                      // the kernel refused a backing file: no more passthrough
	openings map[<-chan struct{}]*file // by OPEN or CREATE request: the file it opened
	// extras maps the cancel channel of a request in flight to what rawFS
	// found in it: the umask of a create, mkdir or mknod, the SETXATTR
	// flags of a setxattr.
	extras sync.Map

	dirsMu   sync.Mutex
	openDirs map[*node][]*dir // open directory handles, for dirGone

	opensMu sync.Mutex
	opens   map[*node][]*file // open files, for nodes with no path (see opens.go)
	openIno map[uint64]*node  // the nodes of opens, by number (see shadow.go)
	// nopen counts the files opened and not released yet, their layers'
	// release done (Server.OpenFiles).
	nopen atomic.Int64
}

// dirOpened and dirClosed keep state.openDirs.
func (st *state) dirOpened(d *dir) {
	st.dirsMu.Lock()
	if st.openDirs == nil {
		st.openDirs = map[*node][]*dir{}
	}
	st.openDirs[d.n] = append(st.openDirs[d.n], d)
	st.dirsMu.Unlock()
}

func (st *state) dirClosed(d *dir) {
	st.dirsMu.Lock()
	ds := st.openDirs[d.n]
	for i := range ds {
		if ds[i] == d {
			ds = append(ds[:i], ds[i+1:]...)
			break
		}
	}
	if len(ds) == 0 {
		delete(st.openDirs, d.n)
	} else {
		st.openDirs[d.n] = ds
	}
	st.dirsMu.Unlock()
}

// dirGone prepares for the removal of the child name of n (rmdir, or a
// rename over it): if it is a directory that is open, it returns a function
// that, once the removal succeeded, gives its open handles the attributes
// it had, with no links left, so that fstat of them still answers as on
// ext4 (the kernel asks, and the path no longer leads to it). It costs a
// Getattr only when such a directory is open.
func (n *node) dirGone(ctx context.Context, name, p string) func() {
	ch := n.GetChild(name)
	if ch == nil {
		return func() {}
	}
	cn, ok := ch.Operations().(*node)
	if !ok {
		return func() {}
	}
	n.st.dirsMu.Lock()
	open := len(n.st.openDirs[cn]) > 0
	n.st.dirsMu.Unlock()
	if !open {
		return func() {}
	}
	a, err := n.st.top.Getattr(ctx, p)
	if err != nil || !a.IsDir() {
		return func() {}
	}
	a.Nlink = 0
	return func() {
		n.st.dirsMu.Lock()
		for _, d := range n.st.openDirs[cn] {
			d.gone.Store(&a)
		}
		n.st.dirsMu.Unlock()
	}
}

// creatorCtx is callerCtx for a request that creates an object: the caller
// carries the umask the kernel sent with it (see rawFS).
func (st *state) creatorCtx(ctx context.Context) context.Context {
	fc, ok := ctx.(*fuse.Context)
	if !ok {
		return ctx
	}
	c := &layer.Caller{Uid: fc.Caller.Uid, Gid: fc.Caller.Gid, Pid: fc.Caller.Pid}
	if u, ok := st.extras.Load(fc.Cancel); ok {
		c.Umask = u.(uint32) & 0o777
	}
	return layer.WithCaller(ctx, c)
}

type node struct {
	fs.Inode
	st *state
	id layer.ID // the object's identity (see inoMap)
	// How the kernel reads and writes the node's open files
	// (passthrough.go); guarded by st.ptMu.
	bk     *backing // the backing file of those passed through
	cached int      // how many go through the daemon in cached io mode
	// shadowed: another object was given a new number while this node
	// had files open on the number they share (see shadow.go).
	shadowed atomic.Bool
	noX      noXattr // xattrs known to be missing (xattrcache.go)
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
	switch e {
	case syscall.EIO:
		st.log.Error("I/O error", "op", op, "path", path, "err", err)
	case syscall.ENOTCONN:
		// A network file system's lower lost its server (a GlusterFS
		// brick died): the cause, where the administrator looks.
		st.log.Error("the lower is not connected", "op", op, "path", path, "err", err)
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
// created object at path p, a child of n, and fills out.
func (n *node) newChild(ctx context.Context, p string, a *layer.Attr, out *fuse.EntryOut) *fs.Inode {
	ch := n.newNode(ctx, a, out)
	n.st.remember(ctx, ch.StableAttr().Ino, p, a.ID(), a.IsDir(), n.StableAttr().Ino)
	return ch
}

// newNode makes the node of an object with attributes a (newChild; a
// tmpfile's, which has no name to remember).
func (n *node) newNode(ctx context.Context, a *layer.Attr, out *fuse.EntryOut) *fs.Inode {
	fillAttr(a, &out.Attr)
	id := a.ID()
	ino := n.st.inos.ino(id)
	if hashed(ino) {
		// Another identity with the same hash holds the number: this one
		// takes a serial number (see inoMap).
		if old := n.NodeByIno(ino); old != nil {
			if on, ok := old.Operations().(*node); ok && noGen(on.id) != noGen(id) {
				ino = n.st.inos.collide(id)
			}
		}
	}
	ino = n.st.noClash(id, ino)
	out.Attr.Ino = ino
	return n.NewInode(ctx, &node{st: n.st, id: id}, fs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: ino, Gen: id.Gen})
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	a, err := n.st.top.Getattr(callerCtx(ctx), p)
	if err != nil {
		return nil, n.st.errno("lookup", p, err)
	}
	// A node the tree has for this name and object (one that a lookup by
	// node id put there, see LookupNode) is the one to give the kernel.
	if ch := n.GetChild(name); ch != nil {
		// (Unless the object has been given a new number since: see
		// inoMap.renumber.)
		if sameObject(ch, a.ID()) && ch.StableAttr().Ino == n.st.inos.ino(a.ID()) {
			fillAttr(&a, &out.Attr)
			out.Attr.Ino = ch.StableAttr().Ino
			n.st.remember(ctx, out.Attr.Ino, p, a.ID(), a.IsDir(), n.StableAttr().Ino)
			return ch, 0
		}
	}
	return n.newChild(ctx, p, &a, out), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	a, errno := n.getattr(ctx, f)
	if errno != 0 {
		return errno
	}
	fillAttr(&a, &out.Attr)
	out.Ino = n.StableAttr().Ino
	return 0
}

// getattr gives the attributes of the node, through its open file f if
// there is one (GETATTR, STATX).
func (n *node) getattr(ctx context.Context, f fs.FileHandle) (layer.Attr, syscall.Errno) {
	if d, ok := f.(*dir); ok && d.gone.Load() != nil {
		return *d.gone.Load(), 0
	}
	if fh, ok := f.(*file); ok {
		a, err := fh.f.Getattr(callerCtx(ctx))
		return a, n.st.errno("getattr", fh.path, err)
	}
	p, ok := n.path()
	if !ok {
		// Removed: its attributes come from one of its open files. With
		// none, the kernel holds a node whose object is gone (an open by
		// handle that came before the node's last RELEASE was answered):
		// stale, as the handle is on ext4, not ENOENT.
		if of := n.openFile(); of != nil {
			a, err := of.f.Getattr(callerCtx(ctx))
			return a, n.st.errno("getattr", of.path, err)
		}
		return layer.Attr{}, syscall.ESTALE
	}
	a, err := n.st.top.Getattr(callerCtx(ctx), p)
	if err == nil && n.st.xattrReplaces && a.ID() != n.id {
		// p names another object now: one a layer put there in the
		// node's place (a conversion of layers/chains). ESTALE makes
		// the kernel look the name up again. (Only under such a layer:
		// replica's identities are its primary's, which a failover
		// changes.)
		return layer.Attr{}, syscall.ESTALE
	}
	return a, n.st.errno("getattr", p, err)
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.noX.forget() // a chmod, chown or write may change its xattrs
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
	cctx := callerCtx(ctx)
	fh, _ := f.(*file)
	p := ""
	if fh == nil {
		var ok bool
		if p, ok = n.path(); !ok {
			// fchmod, futimens of a file removed while open (or a
			// tmpfile): through an open file of it.
			if fh = n.openFile(); fh == nil {
				return syscall.ENOENT
			}
		}
	}
	setattr := func(ctx context.Context, sa *layer.SetAttr) (layer.Attr, error) {
		if fh != nil {
			return fh.f.Setattr(ctx, sa)
		}
		return n.st.top.Setattr(ctx, p, sa)
	}
	// The set-id bits to drop (see killPrivs), judged on the attributes
	// before the change, as the kernel judges them. A truncate or chown
	// changes neither the type nor the mode (the lower may drop set-id
	// bits itself, which leaves nothing to drop), and the group only when
	// it sets one: the attributes after it judge as well, and cost no
	// GETATTR (a round trip on a network lower), except for a change of
	// group by a caller whose membership of the old group counts.
	var a layer.Attr
	var err error
	var drop uint32
	kill := killPrivs(in) && sa.Valid&layer.SetMode == 0
	caller := layer.CallerOf(cctx)
	if kill && (sa.Valid == 0 || sa.Valid&layer.SetGid != 0 && caller.Uid != 0) {
		if fh != nil {
			a, err = fh.f.Getattr(cctx)
		} else {
			a, err = n.st.top.Getattr(cctx, p)
		}
		if err != nil {
			return n.st.errno("setattr", p, err)
		}
		drop, kill = setidToDrop(a, caller), false
	}
	if sa.Valid != 0 || drop == 0 {
		if a, err = setattr(cctx, &sa); err != nil {
			return n.st.errno("setattr", p, err)
		}
	}
	if kill {
		drop = setidToDrop(a, caller)
	}
	if a.Mode&drop != 0 {
		// The file system's own change, not the caller's chmod: made with
		// the daemon's identity, so that a layer's rules on who may chmod
		// do not stop a write.
		if a, err = setattr(daemonCtx(ctx), &layer.SetAttr{Valid: layer.SetMode, Mode: a.Mode & 07777 &^ drop}); err != nil {
			return n.st.errno("setattr", p, err)
		}
	}
	fillAttr(&a, &out.Attr)
	out.Ino = n.StableAttr().Ino
	return 0
}

// daemonCtx carries the daemon's own identity, for changes the file system
// makes by itself.
func daemonCtx(ctx context.Context) context.Context {
	return layer.AsSelf(ctx)
}

// killPrivs says whether a SETATTR asks the file system to drop set-id
// bits (FUSE_HANDLE_KILLPRIV_V2, negotiated in Mount). The kernel leaves it
// to us: the daemon writes to the lower as root, with CAP_FSETID, so the
// lower never drops them by itself. Two forms arrive:
//   - FATTR_KILL_SUIDGID, with a truncate or a chown by a caller without
//     CAP_FSETID (the kernel sets it whatever the mode);
//   - a SETATTR that changes nothing: the kernel's file_remove_privs before
//     a write (cached or passed through), fallocate, punch hole or zero
//     range, sent only when the kernel has found that the caller lacks
//     CAP_FSETID and the file has bits to lose. (The WRITE that follows
//     also carries FUSE_WRITE_KILL_SUIDGID; the bits are gone by then.)
func killPrivs(in *fuse.SetAttrIn) bool {
	return in.Valid&fuse.FATTR_KILL_SUIDGID != 0 ||
		in.Valid&^(fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) == 0
}

// setidToDrop are the set-id bits of a that a change by c drops, as the
// kernel's VFS drops them for every local file system: the set-user-ID bit
// always, the set-group-ID bit when the file is group executable or c is
// not in the file's group (and not root). Directories keep theirs.
func setidToDrop(a layer.Attr, c *layer.Caller) uint32 {
	if a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0
	}
	drop := a.Mode & syscall.S_ISUID
	if a.Mode&syscall.S_ISGID != 0 && (a.Mode&unix.S_IXGRP != 0 || !inGroup(c, a.Gid)) {
		drop |= syscall.S_ISGID
	}
	return drop
}

// inGroup reports whether c is root or a member of gid.
func inGroup(c *layer.Caller, gid uint32) bool {
	return c.Uid == 0 || c.InGroup(gid)
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		// Removed, yet the kernel opens it (by file handle): from one of
		// its open files.
		lf, fh, direct, errno := n.reopen(ctx, flags)
		if errno != 0 {
			return nil, 0, errno
		}
		return fh, n.st.openFlags(lf) | direct, 0
	}
	var lf layer.File
	direct, err := n.st.wbOpen(flags, func(flags uint32) (err error) {
		lf, err = n.st.top.Open(callerCtx(ctx), p, int(flags))
		return err
	})
	if err != nil {
		return nil, 0, n.st.errno("open", p, err)
	}
	if !n.st.xattrReplaces {
	} else if a, err := lf.Getattr(callerCtx(ctx)); err == nil && a.ID() != n.id {
		// p names another file than the node's (see getattr): its bytes
		// must not be served as the node's, nor its backing file given
		// to an inode that has one (the kernel fails such an open with
		// EIO).
		lf.Release(callerCtx(ctx))
		return nil, 0, syscall.ESTALE
	}
	if flags&syscall.O_ACCMODE != syscall.O_WRONLY && n.st.atime.Mode != layer.NoAtime && !n.st.passes(lf.Caps()) {
		// The kernel may serve this file's reads from its page cache,
		// and the layers theirs from their own: the bottom changes the
		// atime now, as a read would under the mount's rule, and the
		// kernel is told to fetch the attributes again (only them;
		// nothing is waited for). A passed-through file's reads go to
		// the lower file itself.
		if layer.TouchAtime(callerCtx(ctx), lf) {
			n.NotifyContent(-1, 0)
		}
	}
	return n.st.newFile(ctx, lf, p, &n.Inode, flags), n.st.openFlags(lf) | direct, 0
}

// openFlags acts on the open file's capabilities (layer.Caps): a file
// that is not passed through keeps the kernel's page cache across opens
// when it says it may, a file that asks for direct I/O gets it, and the
// kernel sends no FLUSH at the close of a file whose Flush does nothing.
// Under the writeback cache every file keeps it: the stack is exclusive
// (its files change only through the mount, whose changes keep the cache
// right), and an open that dropped the cache would first write each dirty
// page back in a WRITE of its own (the kernel's launder_folio).
func (st *state) openFlags(f layer.File) uint32 {
	c := f.Caps()
	var flags uint32
	if (c&layer.CapKeepCache != 0 || st.writeback) && !st.passes(c) && !st.shared {
		flags |= fuse.FOPEN_KEEP_CACHE
	}
	if c&layer.CapDirectIO != 0 {
		flags |= fuse.FOPEN_DIRECT_IO
	}
	if c&layer.CapNoFlush != 0 {
		flags |= fuse.FOPEN_NOFLUSH
	}
	return flags
}

// passes reports whether a file with caps c is handed to the kernel.
func (st *state) passes(c layer.Caps) bool {
	return st.passthrough && c&layer.CapPassthrough != 0 && c&layer.CapDirectIO == 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, nil, 0, syscall.ENOENT
	}
	var lf layer.File
	var a layer.Attr
	direct, err := n.st.wbOpen(flags, func(flags uint32) (err error) {
		lf, a, err = n.st.top.Create(n.st.creatorCtx(ctx), p, int(flags), mode)
		return err
	})
	if err != nil {
		return nil, nil, 0, n.st.errno("create", p, err)
	}
	ch := n.newChild(ctx, p, &a, out)
	nf := n.st.newFile(ctx, lf, p, ch, flags)
	nf.ctime.Store(a.Ctime.Nano()) // the kernel has these attributes
	return ch, nf, n.st.openFlags(lf) | direct, 0
}

// made finishes an operation that creates a directory entry.
func (n *node) made(ctx context.Context, op, p string, a layer.Attr, err error, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if err != nil {
		return nil, n.st.errno(op, p, err)
	}
	return n.newChild(ctx, p, &a, out), 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	a, err := n.st.top.Mkdir(n.st.creatorCtx(ctx), p, mode)
	return n.made(ctx, "mkdir", p, a, err, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	if mode&syscall.S_IFMT != syscall.S_IFREG && n.st.fscaps&layer.FSMknod == 0 {
		return nil, syscall.EPERM
	}
	a, err := n.st.top.Mknod(n.st.creatorCtx(ctx), p, mode, uint64(dev))
	return n.made(ctx, "mknod", p, a, err, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	if n.st.fscaps&layer.FSSymlinks == 0 {
		return nil, syscall.EPERM
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
	if !ok2 {
		return nil, syscall.ENOENT
	}
	if n.st.fscaps&layer.FSHardLinks == 0 {
		return nil, syscall.EPERM
	}
	if !ok1 {
		return n.linkFile(ctx, t, p, out)
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
	gone := n.dirGone(callerCtx(ctx), name, p)
	err := n.st.top.Rmdir(callerCtx(ctx), p)
	if err == nil {
		gone()
	}
	return n.st.errno("rmdir", p, err)
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
	if renameCaps(flags)&^n.st.fscaps != 0 {
		return syscall.EINVAL
	}
	gone := func() {}
	if flags&layer.RenameExchange == 0 {
		gone = np.dirGone(callerCtx(ctx), newName, nw)
	}
	moving, replaced := n.GetChild(name), np.GetChild(newName)
	err := n.st.top.Rename(callerCtx(ctx), old, nw, flags)
	if err == nil {
		gone()
		if moving != nil {
			n.st.moved(moving.StableAttr().Ino, np.StableAttr().Ino)
		}
		if replaced != nil && flags&layer.RenameExchange != 0 {
			n.st.moved(replaced.StableAttr().Ino, n.StableAttr().Ino)
		}
	}
	return n.st.errno("rename", old, err)
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return 0, syscall.ENOENT
	}
	if n.st.fscaps&layer.FSXattr == 0 {
		return 0, syscall.EOPNOTSUPP
	}
	hit, w, bit := n.cachedNoXattr(attr)
	if hit {
		return 0, layer.ENOATTR
	}
	sz, err := n.st.top.Getxattr(callerCtx(ctx), p, attr, dest)
	if err != nil {
		errno := n.st.errno("getxattr", p, err)
		n.noteNoXattr(errno, w, bit)
		return uint32(sz), errno
	}
	return uint32(sz), 0
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	p, ok := n.path()
	if !ok {
		return syscall.ENOENT
	}
	if n.st.fscaps&layer.FSXattr == 0 {
		return syscall.EOPNOTSUPP
	}
	cctx := callerCtx(ctx)
	n.noX.forget()
	if err := n.st.top.Setxattr(cctx, p, attr, data, int(flags)); err != nil {
		return n.st.errno("setxattr", p, err)
	}
	n.aclChanged(attr)
	n.replacedBy(cctx, p)
	// An access ACL set by a caller outside the file's group (and without
	// CAP_FSETID) drops the set-group-ID bit, as posix_acl_update_mode does
	// on every local file system; the daemon set it as root, so the lower
	// kept the bit. The kernel says so with SETXATTR_ACL_KILL_SGID.
	if fc, ok := ctx.(*fuse.Context); ok {
		if f, ok := n.st.extras.Load(fc.Cancel); ok && f.(uint32)&setxattrACLKillSGID != 0 {
			a, err := n.st.top.Getattr(cctx, p)
			if err == nil && a.Mode&syscall.S_ISGID != 0 {
				_, err = n.st.top.Setattr(daemonCtx(ctx), p, &layer.SetAttr{Valid: layer.SetMode, Mode: a.Mode & 07777 &^ syscall.S_ISGID})
			}
			if err != nil {
				return n.st.errno("setxattr", p, err)
			}
		}
	}
	return 0
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return 0, syscall.ENOENT
	}
	if n.st.fscaps&layer.FSXattr == 0 {
		return 0, 0 // no names, as listxattr says on a file system without xattrs
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
	if n.st.fscaps&layer.FSXattr == 0 {
		return syscall.EOPNOTSUPP
	}
	n.noX.forget()
	err := n.st.top.Removexattr(callerCtx(ctx), p, attr)
	if err == nil {
		n.aclChanged(attr)
		n.replacedBy(callerCtx(ctx), p)
	}
	return n.st.errno("removexattr", p, err)
}

// replacedBy follows an xattr change that replaced the object at p with
// another (a chains layer converting a file rewrites it and renames the new
// one over it): the kernel's entry for the name is dropped, so that the
// next lookup finds the new object; open files keep the old one. Only
// stacks with such a layer (layer.ReplacesOnXattr) pay its getattr.
func (n *node) replacedBy(ctx context.Context, p string) {
	if !n.st.xattrReplaces || n.IsDir() {
		return
	}
	a, err := n.st.top.Getattr(ctx, p)
	if err != nil || a.ID() == n.id {
		return
	}
	if name, parent := n.Parent(); parent != nil {
		parent.NotifyEntry(name)
	}
}

// aclChanged follows a change of the xattr attr: an access ACL changes the
// mode too (the lower derives it), and a kernel that does not handle ACLs
// itself (a mount without allow_other) would show the old mode for the
// attribute-cache time. Attributes only; nothing is waited for.
func (n *node) aclChanged(attr string) {
	if attr == "system.posix_acl_access" && !n.st.acl {
		n.NotifyContent(-1, 0)
	}
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

// renameCaps are the FS capabilities a renameat2 with flags needs.
func renameCaps(flags uint32) layer.FSCaps {
	var c layer.FSCaps
	if flags&layer.RenameNoreplace != 0 {
		c |= layer.FSRenameNoReplace
	}
	if flags&layer.RenameExchange != 0 {
		c |= layer.FSRenameExchange
	}
	if flags&layer.RenameWhiteout != 0 {
		c |= layer.FSRenameWhiteout
	}
	return c
}
