package local

import (
	"container/list"
	"context"
	"io"
	"math"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// File is an open file of the local layer: a descriptor, which the layer
// may close while the file is not in use and reopen on demand (see
// fdCache). Every operation takes the descriptor with get and gives it back
// with put.
type File struct {
	fs    *FS
	flags int // open flags, for a reopen

	// Guarded by fs.fds.mu:
	fd        int // -1 while closed by the cache
	busy      int // operations using fd
	pinned    bool
	released  bool
	elem      *list.Element // in the cache's LRU list
	hasHandle bool
	handle    fileHandle
	mountFd   int
	key       fileKey // while closed
	lateErr   error   // from closing the descriptor; the next Flush, Fsync or Release reports it
}

var _ layer.File = (*File)(nil)

// newFile wraps a descriptor just opened with flags.
func (fs *FS) newFile(fd, flags int) *File {
	f := &File{fs: fs, flags: flags, fd: fd}
	fs.fds.add(f)
	return f
}

// with runs fn with the file's descriptor.
func (f *File) with(fn func(fd int) error) error {
	fd, err := f.get(false)
	if err != nil {
		return err
	}
	defer f.put()
	return fn(fd)
}

// takeLateErr returns (and clears) the error of closing an evicted
// descriptor.
func (f *File) takeLateErr() error {
	c := &f.fs.fds
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.lateErr
	f.lateErr = nil
	return err
}

func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (n int, err error) {
	err = f.with(func(fd int) error {
		for {
			n, err = unix.Pread(fd, p, off)
			if err != unix.EINTR {
				break
			}
		}
		n = max(n, 0)
		return err
	})
	return n, err
}

// TouchAtime reads at the end of the file: the kernel then changes the atime or not by the
// rule of the mount the file was opened through (see FS.SetAtime), as for
// any read, also of an empty file. A file not open for reading is left as
// it is.
func (f *File) TouchAtime(ctx context.Context) (changed bool) {
	f.with(func(fd int) error {
		var before, after unix.Stat_t
		var b [1]byte
		if unix.Fstat(fd, &before) != nil {
			return nil
		}
		// A read at the end of the file: the kernel changes the atime
		// as for any read (file_accessed), and reads no data (a read
		// at 0 of a file not in the page cache read it from the disk).
		if _, err := unix.Pread(fd, b[:], before.Size); err != nil {
			return nil
		}
		changed = unix.Fstat(fd, &after) == nil && after.Atim != before.Atim
		return nil
	})
	return changed
}

// WriteAt writes all of p or returns an error with the count written: a
// short pwrite(2) (a full disk, a file size limit, a signal) is retried for
// the rest, which either completes or gives the reason (ENOSPC, EFBIG, EIO).
// A layer above never sees a short count without an error.
func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (done int, err error) {
	err = f.with(func(fd int) error {
		for done < len(p) {
			n, err := unix.Pwrite(fd, p[done:], off+int64(done))
			if n > 0 {
				done += n
			}
			switch {
			case err == unix.EINTR:
			case err != nil:
				return err
			case n <= 0:
				return io.ErrShortWrite // no progress and no reason: not expected of pwrite
			}
		}
		return nil
	})
	return done, err
}

func (f *File) Getattr(ctx context.Context) (a layer.Attr, err error) {
	err = f.with(func(fd int) error {
		a, err = statFd(fd)
		return err
	})
	return a, err
}

func (f *File) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	err := f.with(func(fd int) error {
		if in.Valid&layer.SetSize != 0 {
			if err := unix.Ftruncate(fd, int64(in.Size)); err != nil {
				return err
			}
		}
		// The descriptor itself, by AT_EMPTY_PATH: no name to race on.
		if in.Valid&(layer.SetUid|layer.SetGid) != 0 {
			uid, gid := -1, -1
			if in.Valid&layer.SetUid != 0 {
				uid = int(in.Uid)
			}
			if in.Valid&layer.SetGid != 0 {
				gid = int(in.Gid)
			}
			if err := unix.Fchown(fd, uid, gid); err != nil {
				return err
			}
		}
		if in.Valid&layer.SetMode != 0 {
			if err := unix.Fchmod(fd, in.Mode&07777); err != nil {
				return err
			}
		}
		if ts, ok := times(in); ok {
			return utimensFd(fd, ts)
		}
		return nil
	})
	if err != nil {
		return layer.Attr{}, err
	}
	return f.Getattr(ctx)
}

func (f *File) Flush(ctx context.Context) error {
	if err := f.takeLateErr(); err != nil {
		return err
	}
	// close(2) semantics: errors of delayed writes show up at close. A dup
	// closed at once asks the lower file system for them without closing
	// the descriptor we keep.
	return f.with(func(fd int) error {
		nfd, err := unix.Dup(fd)
		if err != nil {
			return err
		}
		return unix.Close(nfd)
	})
}

func (f *File) Fsync(ctx context.Context, datasync bool) error {
	late := f.takeLateErr()
	err := f.with(func(fd int) error {
		if datasync {
			return fdatasync(fd)
		}
		return unix.Fsync(fd)
	})
	if late != nil {
		return late
	}
	return err
}

func (f *File) Release(ctx context.Context) error { return f.fs.fds.release(f) }

func (f *File) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	return f.with(func(fd int) error { return fallocate(fd, mode, off, length) })
}

func (f *File) Lseek(ctx context.Context, off int64, whence int) (o int64, err error) {
	err = f.with(func(fd int) error {
		o, err = unix.Seek(fd, off, whence)
		return err
	})
	return o, err
}

func (f *File) CopyFileRange(ctx context.Context, offIn int64, dst layer.File, offOut int64, n int64, flags uint32) (c int64, err error) {
	d, ok := dst.(*File)
	if !ok {
		return 0, syscall.EXDEV
	}
	err = f.with(func(in int) error {
		return d.with(func(out int) error {
			m, err := copyFileRange(in, &offIn, out, &offOut, int(n), int(flags))
			c = int64(m)
			return err
		})
	})
	return c, err
}

// The locks belong to the open file description: a file that takes one
// keeps its descriptor (get(true)).

func (f *File) Getlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32) (layer.Lock, error) {
	fd, err := f.get(false)
	if err != nil {
		return layer.Lock{}, err
	}
	defer f.put()
	fl := toFlock(lk)
	if err := fcntlOFD(fd, fOFDGetlk, &fl); err != nil {
		return layer.Lock{}, err
	}
	return fromFlock(&fl), nil
}

func (f *File) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32, wait bool) error {
	fd, err := f.get(true)
	if err != nil {
		return err
	}
	defer f.put()
	if flags&layer.LockFlock != 0 {
		op := unix.LOCK_UN
		switch lk.Type {
		case unix.F_RDLCK:
			op = unix.LOCK_SH
		case unix.F_WRLCK:
			op = unix.LOCK_EX
		}
		if !wait {
			op |= unix.LOCK_NB
		}
		return unix.Flock(fd, op)
	}
	fl := toFlock(lk)
	cmd := fOFDSetlk
	if wait {
		cmd = fOFDSetlkw
	}
	return fcntlOFD(fd, cmd, &fl)
}

func toFlock(lk *layer.Lock) unix.Flock_t {
	fl := unix.Flock_t{Type: int16(lk.Type), Whence: 0, Start: int64(lk.Start)}
	// To the end of the file: ^uint64(0), or OFFSET_MAX as the kernel says it.
	if lk.End != ^uint64(0) && lk.End < math.MaxInt64 {
		fl.Len = int64(lk.End - lk.Start + 1)
	}
	return fl
}

func fromFlock(fl *unix.Flock_t) layer.Lock {
	lk := layer.Lock{Type: uint32(fl.Type), Start: uint64(fl.Start), Pid: uint32(fl.Pid)}
	if fl.Len == 0 {
		lk.End = ^uint64(0)
	} else {
		lk.End = uint64(fl.Start + fl.Len - 1)
	}
	return lk
}

// PassthroughFd returns a new descriptor of the file (a dup, sharing the
// open file description), the caller's to close; the file's own may be
// closed and reopened meanwhile (see fdCache).
// Caps: the file's bytes are the lower's (passthrough); the directory may
// change behind the mount, so the kernel does not keep its cache. Opened
// read-only, it has no delayed writes whose errors a close would report:
// its Flush does nothing (CapNoFlush). (Opened for writing, its flushes
// are needed even on a local file system: the frontend tells the kernel
// at each close about writes made through a shared mapping.)
func (f *File) Caps() layer.Caps {
	if f.flags&unix.O_ACCMODE == unix.O_RDONLY {
		return layer.CapPassthrough | layer.CapNoFlush
	}
	return layer.CapPassthrough
}

func (f *File) PassthroughFd() (int, bool) {
	d := -1
	err := f.with(func(fd int) (err error) {
		d, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	})
	return d, err == nil
}

// LendFd (layer.FdLender): the file's own descriptor, kept open while fn
// runs.
func (f *File) LendFd(fn func(fd int)) bool {
	return f.with(func(fd int) error { fn(fd); return nil }) == nil
}

// ReopenFile opens the file's object again with flags through its
// descriptor (/proc/self/fd/N), which reaches it whether or not it still
// has a name (layer.FileReopener).
func (f *File) ReopenFile(ctx context.Context, flags int) (layer.File, error) {
	flags &^= unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | oPath
	var nfd int
	err := f.with(func(fd int) (err error) {
		nfd, err = reopenFd(fd, flags)
		return err
	})
	if err != nil {
		return nil, err
	}
	return f.fs.newFile(nfd, flags), nil
}
