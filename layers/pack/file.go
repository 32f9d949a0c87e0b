package pack

import (
	"context"
	"io"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// File is a regular file open through the layer. While its file is packed
// (when it was opened, or since: see node) it is served from memory (the
// bytes were read and checked when packed or opened) until something
// changes them: the first write, truncation or allocation unpacks it (a
// codec above opens every file read-write, so an open for writing cannot
// be the moment). Otherwise it is its lower file, capabilities and all.
type File struct {
	layer.BaseFile
	fs     *FS
	n      *node
	id     layer.ID
	flags  int
	pinned bool // it gave the kernel its lower descriptor
}

// data returns the bytes of the file if it is packed (ok false: it is not).
func (f *File) data() ([]byte, bool) { return f.n.state() }

func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	f.n.io.RLock()
	defer f.n.io.RUnlock()
	f.n.use()
	if b, ok := f.data(); ok {
		if f.flags&unix.O_ACCMODE == unix.O_WRONLY {
			return 0, syscall.EBADF
		}
		if off >= int64(len(b)) {
			return 0, io.EOF
		}
		k := copy(p, b[off:])
		if k < len(p) {
			return k, io.EOF
		}
		return k, nil
	}
	return f.Lower.ReadAt(ctx, p, off)
}

// change runs fn, a change of the lower file's bytes, on the file
// unpacked.
func (f *File) change(ctx context.Context, fn func() error) error {
	return f.changeTo(ctx, false, fn)
}

// changeTo is change; drop: the change leaves none of the bytes (a
// truncation to 0), which are then not written back.
func (f *File) changeTo(ctx context.Context, drop bool, fn func() error) error {
	for {
		if err := f.unpack(ctx, drop); err != nil {
			return err
		}
		f.n.io.RLock()
		if _, packed := f.data(); packed {
			f.n.io.RUnlock() // packed again meanwhile
			continue
		}
		f.n.use()
		err := fn()
		f.n.io.RUnlock()
		f.changed()
		return err
	}
}

// changed notes a change of the file: its directory is looked at for
// files to pack (again at most every half delay: a codec above keeps the
// file open and writes through it for good).
func (f *File) changed() {
	n := f.n
	n.changed.Store(true)
	now := time.Now().UnixNano()
	if last := n.markedAt.Load(); now-last > int64(f.fs.o.Delay/2) && n.markedAt.CompareAndSwap(last, now) {
		n.mu.Lock()
		dir := n.dir
		n.mu.Unlock()
		f.fs.markDirty(dir)
	}
}

// unpack makes the file an ordinary one before a change of its bytes;
// drop: without its bytes (the change is a truncation to 0).
func (f *File) unpack(ctx context.Context, drop bool) error {
	if _, ok := f.data(); !ok {
		return nil
	}
	fs := f.fs
	fs.renameMu.RLock()
	defer fs.renameMu.RUnlock()
	f.n.mu.Lock()
	dir := f.n.dir
	f.n.mu.Unlock()
	d := fs.lockDir(dir)
	defer fs.unlockDir(d)
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	if !f.n.packed {
		return nil
	}
	sctx := layer.AsSelf(ctx)
	// A descriptor of its own, without O_APPEND (the bytes go at 0).
	wf, err := layer.ReopenFile(sctx, f.Lower, unix.O_WRONLY)
	if err != nil {
		fs.log.Error("pack: cannot open a packed file again to unpack it", "err", err)
		return syscall.EIO
	}
	defer wf.Release(sctx)
	if !drop {
		a, err := wf.Getattr(sctx)
		if err != nil {
			return err
		}
		if err := writeBack(sctx, wf, f.n.data, &a); err != nil {
			return err
		}
	}
	if !layer.LendFd(wf, func(fd int) { err = unix.Fremovexattr(fd, XattrName) }) {
		return syscall.EIO
	}
	if err != nil && err != layer.ENOATTR {
		return err
	}
	fs.addGarbage(dir, int64(len(f.n.data)))
	f.n.packed, f.n.data = false, nil
	fs.changed(f.id)
	return nil
}

func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (k int, err error) {
	err = f.change(ctx, func() error {
		k, err = f.Lower.WriteAt(ctx, p, off)
		return err
	})
	return k, err
}

func (f *File) Getattr(ctx context.Context) (layer.Attr, error) {
	f.n.io.RLock()
	defer f.n.io.RUnlock()
	a, err := f.Lower.Getattr(ctx)
	if err != nil {
		return a, err
	}
	if b, ok := f.data(); ok {
		setSize(&a, int64(len(b)))
	}
	return a, nil
}

func (f *File) Setattr(ctx context.Context, in *layer.SetAttr) (a layer.Attr, err error) {
	if in.Valid&layer.SetSize != 0 {
		err = f.changeTo(ctx, in.Size == 0, func() error {
			a, err = f.Lower.Setattr(ctx, in)
			return err
		})
		return a, err
	}
	f.n.io.RLock()
	defer f.n.io.RUnlock()
	a, err = f.Lower.Setattr(ctx, in)
	if err != nil {
		return a, err
	}
	if b, ok := f.data(); ok {
		setSize(&a, int64(len(b)))
	}
	return a, nil
}

func (f *File) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	return f.change(ctx, func() error { return f.Lower.Allocate(ctx, off, length, mode) })
}

func (f *File) Fsync(ctx context.Context, datasync bool) error {
	f.n.io.RLock()
	defer f.n.io.RUnlock()
	return f.Lower.Fsync(ctx, datasync)
}

func (f *File) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	f.n.io.RLock()
	defer f.n.io.RUnlock()
	if b, ok := f.data(); ok {
		size := int64(len(b))
		if off < 0 || off >= size {
			return 0, syscall.ENXIO
		}
		if whence == unix.SEEK_DATA {
			return off, nil
		}
		return size, nil // SEEK_HOLE: the end
	}
	return f.Lower.Lseek(ctx, off, whence)
}

// CopyFileRange copies between ordinary files below; a packed one (either
// side) answers EXDEV, after which the kernel copies through read and
// write.
func (f *File) CopyFileRange(ctx context.Context, offIn int64, dst layer.File, offOut int64, n int64, flags uint32) (int64, error) {
	d, ok := dst.(*File)
	if !ok {
		return 0, syscall.EXDEV
	}
	if _, packed := d.data(); packed {
		return 0, syscall.EXDEV
	}
	f.n.io.RLock()
	defer f.n.io.RUnlock()
	if _, packed := f.data(); packed {
		return 0, syscall.EXDEV
	}
	if d.n != f.n {
		d.n.io.RLock()
		defer d.n.io.RUnlock()
		if _, packed := d.data(); packed {
			return 0, syscall.EXDEV
		}
	}
	return f.Lower.CopyFileRange(ctx, offIn, d.Lower, offOut, n, flags)
}

func (f *File) Release(ctx context.Context) error {
	err := f.Lower.Release(ctx)
	f.n.mu.Lock()
	dir := f.n.dir
	if f.pinned {
		f.n.pinned--
		// The kernel read and wrote it without the layer: written,
		// perhaps, after a pass found it empty (TestShared, loaded).
		f.n.changed.Store(true)
	}
	f.n.mu.Unlock()
	f.fs.put(ctx, f.id, f.n, dir)
	return err
}

// PassthroughFd gives the lower descriptor of a file that is not packed,
// and keeps it from being packed while this file is open (the kernel
// reads and writes the lower file itself).
func (f *File) PassthroughFd() (int, bool) {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	if f.n.packed {
		return -1, false
	}
	fd, ok := f.Lower.PassthroughFd()
	if ok && !f.pinned {
		f.pinned = true
		f.n.pinned++
	}
	return fd, ok
}

// LendFd lends the lower descriptor of a file that is not packed
// (layer.FdLender), and keeps it from being packed while this file is
// open, as PassthroughFd does.
func (f *File) LendFd(fn func(fd int)) bool {
	f.n.mu.Lock()
	defer f.n.mu.Unlock()
	if f.n.packed {
		return false
	}
	ok := layer.LendFd(f.Lower, fn)
	if ok && !f.pinned {
		f.pinned = true
		f.n.pinned++
	}
	return ok
}

func (f *File) Caps() layer.Caps {
	if _, packed := f.data(); packed {
		return f.Lower.Caps() &^ layer.CapPassthrough
	}
	return f.Lower.Caps()
}
