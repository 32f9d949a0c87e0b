package local

import (
	"context"
	"math"
	"syscall"

	"golang.org/x/sys/unix"

	"cairn/layer"
)

// File is an open file of the local layer: a descriptor.
type File struct {
	fd int
}

var _ layer.File = (*File)(nil)

// Fd is the file's descriptor.
func (f *File) Fd() int { return f.fd }

func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(f.fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if n < 0 {
			n = 0
		}
		return n, err
	}
}

func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pwrite(f.fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if n < 0 {
			n = 0
		}
		return n, err
	}
}

func (f *File) Getattr(ctx context.Context) (layer.Attr, error) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		return layer.Attr{}, err
	}
	return layer.AttrFromStat(&st), nil
}

func (f *File) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	if in.Valid&layer.SetSize != 0 {
		if err := unix.Ftruncate(f.fd, int64(in.Size)); err != nil {
			return layer.Attr{}, err
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
		if err := unix.Fchown(f.fd, uid, gid); err != nil {
			return layer.Attr{}, err
		}
	}
	if in.Valid&layer.SetMode != 0 {
		if err := unix.Fchmod(f.fd, in.Mode&07777); err != nil {
			return layer.Attr{}, err
		}
	}
	if ts, ok := times(in); ok {
		if err := unix.UtimesNanoAt(f.fd, "", ts[:], unix.AT_EMPTY_PATH); err != nil {
			return layer.Attr{}, err
		}
	}
	return f.Getattr(ctx)
}

func (f *File) Flush(ctx context.Context) error {
	// close(2) semantics: errors of delayed writes show up at close. A dup
	// closed at once asks the lower file system for them without closing
	// the descriptor we keep.
	nfd, err := unix.Dup(f.fd)
	if err != nil {
		return err
	}
	return unix.Close(nfd)
}

func (f *File) Fsync(ctx context.Context, datasync bool) error {
	if datasync {
		return unix.Fdatasync(f.fd)
	}
	return unix.Fsync(f.fd)
}

func (f *File) Release(ctx context.Context) error {
	fd := f.fd
	f.fd = -1
	return unix.Close(fd)
}

func (f *File) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	return unix.Fallocate(f.fd, mode, off, length)
}

func (f *File) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	return unix.Seek(f.fd, off, whence)
}

func (f *File) CopyFileRange(ctx context.Context, offIn int64, dst layer.File, offOut int64, n int64, flags uint32) (int64, error) {
	d, ok := dst.(*File)
	if !ok {
		return 0, syscall.EXDEV
	}
	c, err := unix.CopyFileRange(f.fd, &offIn, d.fd, &offOut, int(n), int(flags))
	return int64(c), err
}

func (f *File) Getlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32) (layer.Lock, error) {
	fl := toFlock(lk)
	if err := unix.FcntlFlock(uintptr(f.fd), unix.F_OFD_GETLK, &fl); err != nil {
		return layer.Lock{}, err
	}
	return fromFlock(&fl), nil
}

func (f *File) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32, wait bool) error {
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
		return unix.Flock(f.fd, op)
	}
	fl := toFlock(lk)
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	return unix.FcntlFlock(uintptr(f.fd), cmd, &fl)
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

func (f *File) PassthroughFd() (int, bool) { return f.fd, true }
