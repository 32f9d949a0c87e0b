package fusefs

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"cairnfs.dev/cairn/third_party/gofuse/fs"
	"cairnfs.dev/cairn/third_party/gofuse/fuse"

	"cairnfs.dev/cairn/layer"
)

// file is an open file of the mount.
type file struct {
	f    layer.File
	path string // at open time, for log lines
	st   *state
	req  <-chan struct{} // the OPEN or CREATE request's (see passOpened)
	// ino and writable serve Flush: the kernel's cached attributes of a
	// writable file passed through (passed) are not told of writes made
	// through a shared mapping.
	ino      *fs.Inode
	writable bool
	passed   atomic.Bool
	// ctime is the lower file's ctime (ns) when the kernel was last told
	// to fetch its attributes, or given them (at create); 0: unknown.
	ctime atomic.Int64
	// noticeMu orders noticeWrites with Release (gone: released).
	noticeMu sync.Mutex
	gone     bool
	// How the kernel reads and writes it (passthrough.go), set once the
	// open's reply is ready; guarded by st.ptMu.
	bk     *backing // the node's backing file, which it is passed through to
	cached bool     // through the daemon, in the kernel's cached io mode
}

var (
	_ fs.FileReader    = (*file)(nil)
	_ fs.FileWriter    = (*file)(nil)
	_ fs.FileFlusher   = (*file)(nil)
	_ fs.FileFsyncer   = (*file)(nil)
	_ fs.FileReleaser  = (*file)(nil)
	_ fs.FileGetattrer = (*file)(nil)
	_ fs.FileSetattrer = (*file)(nil)
	_ fs.FileAllocater = (*file)(nil)
	_ fs.FileLseeker   = (*file)(nil)
)

func (st *state) newFile(ctx context.Context, f layer.File, path string, ino *fs.Inode, flags uint32) *file {
	nf := &file{f: f, path: path, st: st, ino: ino, writable: flags&syscall.O_ACCMODE != syscall.O_RDONLY}
	if fc, ok := ctx.(*fuse.Context); ok {
		nf.req = fc.Cancel
		st.opening(nf)
	}
	st.opened(nf)
	st.nopen.Add(1)
	return nf
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
	// Under the writeback cache, a short answer loses the rest: the
	// kernel takes it as written (writeback.go). The rest is written, or
	// the write fails.
	for f.st.writeback && err == nil && n < len(data) {
		var m int
		m, err = f.f.WriteAt(callerCtx(ctx), data[n:], off+int64(n))
		if m == 0 && err == nil {
			err = syscall.EIO
		}
		n += m
	}
	if err != nil {
		return uint32(n), f.st.errno("write", f.path, err)
	}
	return uint32(n), 0
}

func (f *file) Flush(ctx context.Context) syscall.Errno {
	// Writes through a shared mapping of a passed-through file change the
	// lower's mtime and ctime at the page fault, which the kernel does not
	// see (it updates the attributes of write(2)s only): let it fetch them
	// again after a close, as a program that wrote through mmap and closed
	// the file expects (xfstests generic/080). Files kept open are
	// watched (watchMapped).
	f.noticeWrites(callerCtx(ctx))
	return f.st.errno("flush", f.path, f.f.Flush(callerCtx(ctx)))
}

// noticeWrites makes the kernel fetch the attributes of a writable file
// passed through again if the lower's ctime moved since it last had them
// (a close of a descriptor through which nothing was written, such as a
// shell's redirection, would otherwise cost a GETATTR at the next stat).
// Only the attributes: no page is touched, no round trip waited for.
func (f *file) noticeWrites(ctx context.Context) {
	if !f.writable || !f.passed.Load() || f.ino == nil {
		return
	}
	f.noticeMu.Lock()
	defer f.noticeMu.Unlock()
	if f.gone {
		return
	}
	a, err := f.f.Getattr(ctx)
	if c := a.Ctime.Nano(); err != nil || c != f.ctime.Load() {
		f.ino.NotifyContent(-1, 0)
		f.ctime.Store(c)
	}
}

func (f *file) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return f.st.errno("fsync", f.path, f.f.Fsync(callerCtx(ctx), flags&1 != 0))
}

func (f *file) Release(ctx context.Context) syscall.Errno {
	f.noticeMu.Lock()
	f.gone = true // watchMapped lets go of it
	f.noticeMu.Unlock()
	f.st.passReleased(f)
	f.st.released(f)
	defer f.st.nopen.Add(-1)
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
	if f.st.writeback {
		// The stack cannot see the bytes still in the kernel's cache: it
		// would call them a hole (cp --sparse would copy zeros). ENOSYS
		// makes the kernel answer from its own size for the rest of the
		// mount, every byte data (writeback.go).
		return 0, syscall.ENOSYS
	}
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
	return &fuse.DirEntry{Name: e.Name, Mode: e.Mode, Ino: d.n.st.inos.ino(id), Off: cookie + dots}, 0
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

// mappedEvery is how often watchMapped looks at the files open for
// writing: the longest a write through a shared mapping of a file kept open
// goes unseen by stat, when the kernel keeps attributes for longer (an
// exclusive stack's day). (A mapping of a passed-through file holds the
// lower file, not the mount's: once the mount's file is closed, writes
// through a mapping that outlives it show at the next close of the file
// opened for writing, or when the kernel's attributes expire.)
const mappedEvery = time.Second

// watchMapped, for a mount whose kernel keeps attributes for longer than
// mappedEvery, tells the kernel every mappedEvery of the writes made
// through shared mappings of passed-through files (noticeWrites), until
// done is closed: one fstat per such open file per second.
func (st *state) watchMapped(done <-chan struct{}) {
	t := time.NewTicker(mappedEvery)
	defer t.Stop()
	ctx := layer.AsSelf(context.Background())
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		var fs []*file
		st.opensMu.Lock()
		for _, l := range st.opens {
			for _, f := range l {
				if f.writable && f.passed.Load() {
					fs = append(fs, f)
				}
			}
		}
		st.opensMu.Unlock()
		for _, f := range fs {
			f.noticeWrites(ctx)
		}
	}
}
