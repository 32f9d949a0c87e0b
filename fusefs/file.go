package fusefs

import (
	"context"
	"io"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"cairn/layer"
)

// file is an open file of the mount.
type file struct {
	f    layer.File
	path string // at open time, for log lines
	st   *state
	req  <-chan struct{} // the OPEN or CREATE request's (see handedOver)
	ptfd int             // a descriptor handed to the kernel, until it holds the file; guarded by st.handMu
	// ino and writable serve Flush: the kernel's cached attributes of a
	// writable file passed through (passed) are not told of writes made
	// through a shared mapping.
	ino      *fs.Inode
	writable bool
	passed   atomic.Bool
	direct   *node // counted in its node's direct files (PassthroughFd)
}

var (
	_ fs.FileReader          = (*file)(nil)
	_ fs.FileWriter          = (*file)(nil)
	_ fs.FileFlusher         = (*file)(nil)
	_ fs.FileFsyncer         = (*file)(nil)
	_ fs.FileReleaser        = (*file)(nil)
	_ fs.FileGetattrer       = (*file)(nil)
	_ fs.FileSetattrer       = (*file)(nil)
	_ fs.FileAllocater       = (*file)(nil)
	_ fs.FileLseeker         = (*file)(nil)
	_ fs.FilePassthroughFder = (*file)(nil)
)

func (st *state) newFile(ctx context.Context, f layer.File, path string, ino *fs.Inode, flags uint32) *file {
	nf := &file{f: f, path: path, st: st, ptfd: -1, ino: ino, writable: flags&syscall.O_ACCMODE != syscall.O_RDONLY}
	if fc, ok := ctx.(*fuse.Context); ok {
		nf.req = fc.Cancel
	}
	st.opened(nf)
	return nf
}

// PassthroughFd gives go-fuse a descriptor to register with the kernel as
// the file's backing file. The layer's PassthroughFd returns a new
// descriptor; the kernel takes its own reference when go-fuse registers it,
// within the same request, so it is closed when the request is done
// (rawFS.Open, rawFS.Create; a descriptor that escapes them is closed at
// release), and the daemon holds no descriptor for a passed-through file
// that it does not use otherwise.
//
// go-fuse asks only the first of a node's files opened together: the
// others share its backing file. And its release of any file drops a
// reference to the node's backing file, one that a file served by the
// daemon never took: with such a file open, passing another through would
// let the release of the first unregister the backing file of the second;
// the kernel would then refuse the next open's new backing file while it
// keeps the old one (EIO), and refuses to mix passed-through and cached
// files of an inode anyway. So while a node has files served by the
// daemon (direct), its files are not passed through. (go-fuse asks under a
// lock of its own that its releases take too, so the count and its
// decisions do not race.)
func (f *file) PassthroughFd() (int, bool) {
	n := fileNode(f)
	if (n != nil && n.direct.Load() > 0) || !f.st.passes(f.f.Caps()) {
		f.goDirect(n)
		return -1, false
	}
	fd, ok := f.f.PassthroughFd()
	f.passed.Store(ok)
	if !ok {
		f.goDirect(n)
		return -1, false
	}
	f.st.handMu.Lock()
	f.ptfd = fd
	if f.st.handed == nil {
		f.st.handed = make(map[<-chan struct{}][]*file)
	}
	f.st.handed[f.req] = append(f.st.handed[f.req], f)
	f.st.handMu.Unlock()
	return fd, true
}

// goDirect counts f, served by the daemon, in its node's direct files.
func (f *file) goDirect(n *node) {
	if n != nil && f.direct == nil {
		f.direct = n
		n.direct.Add(1)
	}
}

// undirect takes f out of its node's direct files once go-fuse has
// released it: after the RELEASE request req (rawFS.Release), or now.
func (f *file) undirect(req <-chan struct{}) {
	n := f.direct
	if n == nil {
		return
	}
	f.direct = nil
	if req == nil {
		n.direct.Add(-1)
		return
	}
	f.st.handMu.Lock()
	if f.st.undirect == nil {
		f.st.undirect = make(map[<-chan struct{}][]*node)
	}
	f.st.undirect[req] = append(f.st.undirect[req], n)
	f.st.handMu.Unlock()
}

// releaseDone runs when go-fuse is done with a RELEASE request.
func (st *state) releaseDone(req <-chan struct{}) {
	st.handMu.Lock()
	ns := st.undirect[req]
	delete(st.undirect, req)
	st.handMu.Unlock()
	for _, n := range ns {
		n.direct.Add(-1)
	}
}

// closeHanded closes the descriptor handed to the kernel, if still open.
func (f *file) closeHanded() {
	f.st.handMu.Lock()
	defer f.st.handMu.Unlock()
	if f.ptfd >= 0 {
		syscall.Close(f.ptfd)
		f.ptfd = -1
	}
}

// handedOver runs when an OPEN or CREATE request is done: the kernel holds
// the files registered in it.
func (st *state) handedOver(req <-chan struct{}) {
	st.handMu.Lock()
	files := st.handed[req]
	delete(st.handed, req)
	st.handMu.Unlock()
	for _, f := range files {
		f.closeHanded()
	}
}

func (f *file) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	n, err := f.f.ReadAt(callerCtx(ctx), dest, off)
	if err != nil && !isEOF(err) {
		return nil, f.st.errno("read", f.path, err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, err := f.f.WriteAt(callerCtx(ctx), data, off)
	if err != nil {
		return uint32(n), f.st.errno("write", f.path, err)
	}
	return uint32(n), 0
}

func (f *file) Flush(ctx context.Context) syscall.Errno {
	if f.writable && f.passed.Load() && f.ino != nil {
		// Writes through a shared mapping of a passed-through file change
		// the lower's mtime and ctime at the page fault, which the kernel
		// does not see (it updates the attributes of write(2)s only): let
		// it fetch them again after each close, as a program that wrote
		// through mmap and closed the file expects (xfstests generic/080).
		// Only the attributes: no page is touched, no round trip waited for.
		f.ino.NotifyContent(-1, 0)
	}
	return f.st.errno("flush", f.path, f.f.Flush(callerCtx(ctx)))
}

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return f.st.errno("fsync", f.path, f.f.Fsync(callerCtx(ctx), flags&1 != 0))
}

func (f *file) Release(ctx context.Context) syscall.Errno {
	f.closeHanded()
	var req <-chan struct{}
	if fc, ok := ctx.(*fuse.Context); ok {
		req = fc.Cancel
	}
	f.undirect(req)
	f.st.released(f)
	return f.st.errno("release", f.path, f.f.Release(callerCtx(ctx)))
}

func (f *file) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	a, err := f.f.Getattr(callerCtx(ctx))
	if err != nil {
		return f.st.errno("getattr", f.path, err)
	}
	fillAttr(&a, &out.Attr)
	out.Ino = f.st.inos.ino(a.ID())
	return 0
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	// Node.Setattr handles both cases; it is reached with this file.
	return syscall.ENOTSUP
}

func (f *file) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return f.st.errno("fallocate", f.path, f.f.Allocate(callerCtx(ctx), int64(off), int64(size), mode))
}

func (f *file) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	o, err := f.f.Lseek(callerCtx(ctx), int64(off), int(whence))
	if err != nil {
		return 0, f.st.errno("lseek", f.path, err)
	}
	return uint64(o), 0
}

// dir is an open directory: the stack's listing as a stream (layer.Dir),
// after "." and "..". Offsets given to the kernel: 1 after ".", 2 after
// "..", then each entry's cookie plus 2, which Seekdir takes back.
type dir struct {
	n    *node
	path string
	ds   layer.Dir
	pos  int // entries of the dots given: 0, 1 or 2
	last *layer.DirEntry
	// gone are the directory's last attributes once it has been removed
	// or replaced (see node.dirGone).
	gone atomic.Pointer[layer.Attr]
}

// dots is the number of entries before the listing: "." and "..".
const dots = 2

var (
	_ fs.FileReaddirenter = (*dir)(nil)
	_ fs.FileLookuper     = (*dir)(nil)
	_ fs.FileSeekdirer    = (*dir)(nil)
	_ fs.FileFsyncdirer   = (*dir)(nil)
	_ fs.FileReleasedirer = (*dir)(nil)
)

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return nil, 0, syscall.ENOENT
	}
	ds, err := layer.OpenDir(callerCtx(ctx), n.st.top, p)
	if err != nil {
		return nil, 0, n.st.errno("opendir", p, err)
	}
	d := &dir{n: n, path: p, ds: ds}
	n.st.dirOpened(d)
	if n.st.cacheDirs {
		// The kernel keeps the listing from one opendir to the next
		// (FOPEN_CACHE_DIR, FOPEN_KEEP_CACHE) and drops it when it
		// changes the directory (a create, a removal, a rename) or
		// sees its mtime change.
		return d, fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE, 0
	}
	return d, 0, 0
}

func (d *dir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	d.last = nil
	if d.pos < dots {
		// Every Linux file system lists "." and ".." (some programs count
		// on them): "." is this directory, ".." its parent, and the root's
		// parent is the root, as on any file system's root directory.
		self, name := &d.n.Inode, "."
		if d.pos == 1 {
			name = ".."
			if _, p := self.Parent(); p != nil && !self.IsRoot() {
				self = p
			}
		}
		d.pos++
		return &fuse.DirEntry{Name: name, Mode: syscall.S_IFDIR, Ino: self.StableAttr().Ino, Off: uint64(d.pos)}, 0
	}
	e, cookie, err := d.ds.Next(callerCtx(ctx), true)
	if err == io.EOF {
		return nil, 0
	}
	if err != nil {
		return nil, d.n.st.errno("readdir", d.path, err)
	}
	d.last = &e
	id := layer.ID{Dev: d.n.id.Dev, Branch: d.n.id.Branch, Ino: e.Ino}
	if e.Attr != nil {
		id = e.Attr.ID()
	}
	return &fuse.DirEntry{Name: e.Name, Mode: e.Mode, Ino: d.n.st.inos.direntIno(id), Off: cookie + dots}, 0
}

// Lookup serves READDIRPLUS with the attributes that came with the listing.
func (d *dir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e := d.last; e != nil && e.Name == name && e.Attr != nil {
		return d.n.newChild(ctx, layer.Join(d.path, name), e.Attr, out), 0
	}
	return d.n.Lookup(ctx, name, out)
}

func (d *dir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	var err error
	switch {
	case off < dots:
		d.pos = int(off)
		err = d.ds.Seek(callerCtx(ctx), 0)
	case off == dots:
		d.pos = dots
		err = d.ds.Seek(callerCtx(ctx), 0)
	default:
		d.pos = dots
		err = d.ds.Seek(callerCtx(ctx), off-dots)
	}
	return d.n.st.errno("seekdir", d.path, err)
}

func (d *dir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.st.errno("fsyncdir", d.path, d.n.st.top.SyncDir(callerCtx(ctx), d.path))
}

func (d *dir) Releasedir(ctx context.Context, releaseFlags uint32) {
	d.n.st.dirClosed(d)
	d.ds.Close()
}
