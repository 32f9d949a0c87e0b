package layer

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Op is one operation passing through a Hooked layer, as its Hook sees it.
type Op struct {
	// Name is the operation: one of OpNames.
	Name string
	// Path is the path at this layer. For an operation on an open file
	// (read, write, fsetattr...) it is the file's path: the one it was
	// opened with, as renames made through the layer since have changed it.
	// A file with no name (tmpfile) has its directory's until a link
	// names it.
	Path string
	// Path2 is the second name: the new path of rename and link, the target
	// (as text) of symlink, the attribute name of the xattr operations.
	Path2 string
	// Flags are the open(2) flags of open, create and tmpfile, the
	// renameat2 flags of rename, the mode of fallocate, the whence of
	// lseek, the inode flags of setflags.
	Flags int
	// Set is the request of setattr and fsetattr.
	Set *SetAttr
	// Opener is, for an operation on an open file, the caller that opened
	// it (the caller of the operation itself is in the context; the kernel
	// writes mmap pages back as uid 0, pid 0).
	Opener *Caller
	// Size is what the operation asks for: bytes to read or write, the
	// length of copy_file_range and fallocate, the buffer of getxattr.
	// Before may lower it for a read or a write, which then asks the
	// lower for that many bytes only (a short read or write: the fault
	// layer's).
	Size int64
	// Start is when the operation reached the layer.
	Start time.Time

	// Set for After:

	// Bytes is what the operation did: bytes read, written or copied, the
	// size of an xattr value or list, entries listed by readdir.
	Bytes int64
	// Err is the result (nil for success).
	Err error
}

// OpNames are the operations a Hook sees: those of FS, then those of File.
var OpNames = []string{
	"getattr", "setattr", "readdir", "open", "create", "mkdir", "mknod", "symlink", "readlink",
	"link", "unlink", "rmdir", "rename", "getxattr", "setxattr", "listxattr", "removexattr",
	"statfs", "syncdir", "tmpfile", "getflags", "setflags",
	"read", "write", "fgetattr", "fsetattr", "flush", "fsync", "release", "fallocate", "lseek",
	"copy_file_range", "getlk", "setlk",
}

// Hook is called around every operation of a Hooked layer.
type Hook interface {
	// Before is called before the operation goes down. An error refuses
	// the operation: the lower layer is not called, and the error (an
	// Errno, such as EACCES) is the operation's result.
	Before(ctx context.Context, op *Op) error
	// After is called when the operation is done (also when Before
	// refused it), with op.Err and op.Bytes set.
	After(ctx context.Context, op *Op)
}

// Hooked is a layer that calls Hook around every operation of the layer and
// of its open files, and otherwise forwards them unchanged. A layer that
// watches or polices operations (snoop, acl) embeds it and implements Hook:
//
//	type FS struct{ layer.Hooked }
//	func New(lower layer.FS) *FS {
//		fs := &FS{}
//		fs.Lower, fs.Hook = lower, fs
//		return fs
//	}
//	func (fs *FS) Before(ctx context.Context, op *layer.Op) error { ... }
//	func (fs *FS) After(ctx context.Context, op *layer.Op)        { ... }
//
// Files of a Hooked layer keep kernel passthrough, so the reads and writes
// of passed-through files never reach the hook (open and release do).
// Setting NoPassthrough makes every read and write come through.
type Hooked struct {
	Base
	Hook Hook
	// NoPassthrough keeps the layer's files from being handed to the
	// kernel, so that every read and write reaches the hook.
	NoPassthrough bool
	// Flushes: the hook must see every flush (each close(2)), so the
	// layer's files never say CapNoFlush (the kernel would send none).
	Flushes bool

	mu    sync.Mutex
	files map[*hookedFile]struct{} // open, for renames
}

// run calls Before, the operation, and After; the stack's own operations
// (AsSelf) go through without either.
func (h *Hooked) run(ctx context.Context, op *Op, do func() error) error {
	if IsSelf(ctx) {
		return do()
	}
	op.Start = time.Now()
	if err := h.Hook.Before(ctx, op); err != nil {
		op.Err = err
	} else {
		op.Err = do()
	}
	h.Hook.After(ctx, op)
	return op.Err
}

func (h *Hooked) Getattr(ctx context.Context, path string) (a Attr, err error) {
	err = h.run(ctx, &Op{Name: "getattr", Path: path}, func() (err error) {
		a, err = h.Lower.Getattr(ctx, path)
		return
	})
	return
}

func (h *Hooked) Setattr(ctx context.Context, path string, in *SetAttr) (a Attr, err error) {
	err = h.run(ctx, &Op{Name: "setattr", Path: path, Set: in}, func() (err error) {
		a, err = h.Lower.Setattr(ctx, path, in)
		return
	})
	return
}

func (h *Hooked) ReadDir(ctx context.Context, path string, plus bool) (ents []DirEntry, err error) {
	op := &Op{Name: "readdir", Path: path}
	err = h.run(ctx, op, func() (err error) {
		ents, err = h.Lower.ReadDir(ctx, path, plus)
		op.Bytes = int64(len(ents))
		return
	})
	return
}

// OpenDir streams the lower's listing; the hook sees one readdir, when the
// directory is opened (its Bytes are not known then: 0).
func (h *Hooked) OpenDir(ctx context.Context, path string) (d Dir, err error) {
	err = h.run(ctx, &Op{Name: "readdir", Path: path}, func() (err error) {
		d, err = OpenDir(ctx, h.Lower, path)
		return
	})
	return
}

func (h *Hooked) Open(ctx context.Context, path string, flags int) (f File, err error) {
	err = h.run(ctx, &Op{Name: "open", Path: path, Flags: flags}, func() (err error) {
		f, err = h.Lower.Open(ctx, path, flags)
		return
	})
	if err != nil {
		return nil, err
	}
	return h.file(ctx, f, path), nil
}

func (h *Hooked) Create(ctx context.Context, path string, flags int, mode uint32) (f File, a Attr, err error) {
	err = h.run(ctx, &Op{Name: "create", Path: path, Flags: flags}, func() (err error) {
		f, a, err = h.Lower.Create(ctx, path, flags, mode)
		return
	})
	if err != nil {
		return nil, a, err
	}
	return h.file(ctx, f, path), a, nil
}

func (h *Hooked) Mkdir(ctx context.Context, path string, mode uint32) (a Attr, err error) {
	err = h.run(ctx, &Op{Name: "mkdir", Path: path}, func() (err error) {
		a, err = h.Lower.Mkdir(ctx, path, mode)
		return
	})
	return
}

func (h *Hooked) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (a Attr, err error) {
	err = h.run(ctx, &Op{Name: "mknod", Path: path}, func() (err error) {
		a, err = h.Lower.Mknod(ctx, path, mode, rdev)
		return
	})
	return
}

func (h *Hooked) Symlink(ctx context.Context, target, path string) (a Attr, err error) {
	err = h.run(ctx, &Op{Name: "symlink", Path: path, Path2: target}, func() (err error) {
		a, err = h.Lower.Symlink(ctx, target, path)
		return
	})
	return
}

func (h *Hooked) Readlink(ctx context.Context, path string) (s string, err error) {
	op := &Op{Name: "readlink", Path: path}
	err = h.run(ctx, op, func() (err error) {
		s, err = h.Lower.Readlink(ctx, path)
		op.Bytes = int64(len(s))
		return
	})
	return
}

func (h *Hooked) Link(ctx context.Context, oldpath, newpath string) (a Attr, err error) {
	err = h.run(ctx, &Op{Name: "link", Path: oldpath, Path2: newpath}, func() (err error) {
		a, err = h.Lower.Link(ctx, oldpath, newpath)
		return
	})
	return
}

func (h *Hooked) Unlink(ctx context.Context, path string) error {
	return h.run(ctx, &Op{Name: "unlink", Path: path}, func() error { return h.Lower.Unlink(ctx, path) })
}

func (h *Hooked) Rmdir(ctx context.Context, path string) error {
	return h.run(ctx, &Op{Name: "rmdir", Path: path}, func() error { return h.Lower.Rmdir(ctx, path) })
}

func (h *Hooked) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	return h.run(ctx, &Op{Name: "rename", Path: oldpath, Path2: newpath, Flags: int(flags)}, func() error {
		err := h.Lower.Rename(ctx, oldpath, newpath, flags)
		if err == nil {
			h.renamed(oldpath, newpath, flags&RenameExchange != 0)
		}
		return err
	})
}

// renamed moves the paths of open files from old to new (and the other way
// too for an exchange).
func (h *Hooked) renamed(old, new string, exchange bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for f := range h.files {
		p := *f.path.Load()
		if rest, ok := under(p, old); ok {
			f.path.Store(ptr(new + rest))
		} else if rest, ok := under(p, new); ok && exchange {
			f.path.Store(ptr(old + rest))
		}
	}
}

// under reports whether p is dir or below it, and what follows dir.
func under(p, dir string) (string, bool) {
	if p == dir {
		return "", true
	}
	if strings.HasPrefix(p, dir+"/") {
		return p[len(dir):], true
	}
	return "", false
}

func ptr(s string) *string { return &s }

func (h *Hooked) Getxattr(ctx context.Context, path, name string, dest []byte) (n int, err error) {
	op := &Op{Name: "getxattr", Path: path, Path2: name, Size: int64(len(dest))}
	err = h.run(ctx, op, func() (err error) {
		n, err = h.Lower.Getxattr(ctx, path, name, dest)
		op.Bytes = int64(n)
		return
	})
	return
}

func (h *Hooked) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	op := &Op{Name: "setxattr", Path: path, Path2: name, Flags: flags, Size: int64(len(value))}
	return h.run(ctx, op, func() error { return h.Lower.Setxattr(ctx, path, name, value, flags) })
}

func (h *Hooked) Listxattr(ctx context.Context, path string, dest []byte) (n int, err error) {
	op := &Op{Name: "listxattr", Path: path, Size: int64(len(dest))}
	err = h.run(ctx, op, func() (err error) {
		n, err = h.Lower.Listxattr(ctx, path, dest)
		op.Bytes = int64(n)
		return
	})
	return
}

func (h *Hooked) Removexattr(ctx context.Context, path, name string) error {
	return h.run(ctx, &Op{Name: "removexattr", Path: path, Path2: name}, func() error {
		return h.Lower.Removexattr(ctx, path, name)
	})
}

func (h *Hooked) Statfs(ctx context.Context, path string) (s Statfs, err error) {
	err = h.run(ctx, &Op{Name: "statfs", Path: path}, func() (err error) {
		s, err = h.Lower.Statfs(ctx, path)
		return
	})
	return
}

func (h *Hooked) SyncDir(ctx context.Context, path string) error {
	return h.run(ctx, &Op{Name: "syncdir", Path: path}, func() error { return h.Lower.SyncDir(ctx, path) })
}

// Tmpfile: the hook sees a tmpfile of the directory; the file's operations
// carry the directory's path until LinkFile names it.
func (h *Hooked) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (f File, a Attr, err error) {
	err = h.run(ctx, &Op{Name: "tmpfile", Path: dir, Flags: flags}, func() (err error) {
		f, a, err = h.Lower.Tmpfile(ctx, dir, flags, mode)
		return
	})
	if err != nil {
		return nil, a, err
	}
	return h.file(ctx, f, dir), a, nil
}

// LinkFile is a link from the file's path (see Tmpfile) to newpath, which
// is the file's path from then on.
func (h *Hooked) LinkFile(ctx context.Context, f File, newpath string) (a Attr, err error) {
	hf, ok := f.(*hookedFile)
	if !ok {
		return Attr{}, syscall.EOPNOTSUPP
	}
	err = h.run(ctx, &Op{Name: "link", Path: *hf.path.Load(), Path2: newpath}, func() (err error) {
		a, err = h.Lower.LinkFile(ctx, hf.Lower, newpath)
		return
	})
	if err == nil {
		hf.path.Store(&newpath)
	}
	return
}

func (h *Hooked) GetFlags(ctx context.Context, path string) (fl uint32, err error) {
	err = h.run(ctx, &Op{Name: "getflags", Path: path}, func() (err error) {
		fl, err = h.Lower.GetFlags(ctx, path)
		return
	})
	return
}

func (h *Hooked) SetFlags(ctx context.Context, path string, flags uint32) error {
	return h.run(ctx, &Op{Name: "setflags", Path: path, Flags: int(flags)}, func() error {
		return h.Lower.SetFlags(ctx, path, flags)
	})
}

// file wraps an open file of the lower layer.
func (h *Hooked) file(ctx context.Context, f File, path string) File {
	hf := &hookedFile{BaseFile: BaseFile{Lower: f}, h: h, opener: CallerOf(ctx)}
	hf.path.Store(&path)
	h.mu.Lock()
	if h.files == nil {
		h.files = map[*hookedFile]struct{}{}
	}
	h.files[hf] = struct{}{}
	h.mu.Unlock()
	return hf
}

// hookedFile is an open file of a Hooked layer.
type hookedFile struct {
	BaseFile
	h      *Hooked
	path   atomic.Pointer[string]
	opener *Caller
}

func (f *hookedFile) op(name string) *Op {
	return &Op{Name: name, Path: *f.path.Load(), Opener: f.opener}
}

func (f *hookedFile) ReadAt(ctx context.Context, p []byte, off int64) (n int, err error) {
	op := f.op("read")
	op.Size = int64(len(p))
	err = f.h.run(ctx, op, func() (err error) {
		n, err = f.Lower.ReadAt(ctx, short(p, op.Size), off)
		op.Bytes = int64(n)
		return
	})
	return
}

func (f *hookedFile) WriteAt(ctx context.Context, p []byte, off int64) (n int, err error) {
	op := f.op("write")
	op.Size = int64(len(p))
	err = f.h.run(ctx, op, func() (err error) {
		n, err = f.Lower.WriteAt(ctx, short(p, op.Size), off)
		op.Bytes = int64(n)
		return
	})
	return
}

// short is p cut to n bytes, when a hook lowered a read's or write's size.
func short(p []byte, n int64) []byte {
	if n >= 0 && n < int64(len(p)) {
		return p[:n]
	}
	return p
}

func (f *hookedFile) Getattr(ctx context.Context) (a Attr, err error) {
	err = f.h.run(ctx, f.op("fgetattr"), func() (err error) {
		a, err = f.Lower.Getattr(ctx)
		return
	})
	return
}

func (f *hookedFile) Setattr(ctx context.Context, in *SetAttr) (a Attr, err error) {
	op := f.op("fsetattr")
	op.Set = in
	err = f.h.run(ctx, op, func() (err error) {
		a, err = f.Lower.Setattr(ctx, in)
		return
	})
	return
}

func (f *hookedFile) Flush(ctx context.Context) error {
	return f.h.run(ctx, f.op("flush"), func() error { return f.Lower.Flush(ctx) })
}

func (f *hookedFile) Fsync(ctx context.Context, datasync bool) error {
	return f.h.run(ctx, f.op("fsync"), func() error { return f.Lower.Fsync(ctx, datasync) })
}

func (f *hookedFile) Release(ctx context.Context) error {
	f.h.mu.Lock()
	delete(f.h.files, f)
	f.h.mu.Unlock()
	return f.h.run(ctx, f.op("release"), func() error { return f.Lower.Release(ctx) })
}

func (f *hookedFile) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	op := f.op("fallocate")
	op.Size, op.Flags = length, int(mode)
	return f.h.run(ctx, op, func() error { return f.Lower.Allocate(ctx, off, length, mode) })
}

func (f *hookedFile) Lseek(ctx context.Context, off int64, whence int) (o int64, err error) {
	op := f.op("lseek")
	op.Flags = whence
	err = f.h.run(ctx, op, func() (err error) {
		o, err = f.Lower.Lseek(ctx, off, whence)
		return
	})
	return
}

func (f *hookedFile) CopyFileRange(ctx context.Context, offIn int64, dst File, offOut int64, n int64, flags uint32) (c int64, err error) {
	op := f.op("copy_file_range")
	op.Size = n
	if d, ok := dst.(*hookedFile); ok {
		op.Path2 = *d.path.Load()
	}
	err = f.h.run(ctx, op, func() (err error) {
		c, err = f.BaseFile.CopyFileRange(ctx, offIn, dst, offOut, n, flags)
		op.Bytes = c
		return
	})
	return
}

func (f *hookedFile) Getlk(ctx context.Context, owner uint64, lk *Lock, flags uint32) (l Lock, err error) {
	err = f.h.run(ctx, f.op("getlk"), func() (err error) {
		l, err = f.Lower.Getlk(ctx, owner, lk, flags)
		return
	})
	return
}

func (f *hookedFile) Setlk(ctx context.Context, owner uint64, lk *Lock, flags uint32, wait bool) error {
	return f.h.run(ctx, f.op("setlk"), func() error { return f.Lower.Setlk(ctx, owner, lk, flags, wait) })
}

func (f *hookedFile) PassthroughFd() (int, bool) {
	if f.h.NoPassthrough {
		return -1, false
	}
	return f.Lower.PassthroughFd()
}

func (f *hookedFile) LendFd(fn func(fd int)) bool {
	return !f.h.NoPassthrough && LendFd(f.Lower, fn)
}

// Caps forwards the lower file's, without passthrough when the hook must
// see every read and write (NoPassthrough), and without CapNoFlush when it
// must see every flush (Flushes).
func (f *hookedFile) Caps() Caps {
	c := f.Lower.Caps()
	if f.h.NoPassthrough {
		c &^= CapPassthrough
	}
	if f.h.Flushes {
		c &^= CapNoFlush
	}
	return c
}

// ReopenFile: the hook sees an open of the file's path (see FileReopener).
func (f *hookedFile) ReopenFile(ctx context.Context, flags int) (File, error) {
	path := *f.path.Load()
	var lf File
	err := f.h.run(ctx, &Op{Name: "open", Path: path, Flags: flags}, func() (err error) {
		lf, err = ReopenFile(ctx, f.Lower, flags)
		return
	})
	if err != nil {
		return nil, err
	}
	return f.h.file(ctx, lf, path), nil
}
