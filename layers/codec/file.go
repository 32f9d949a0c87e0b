package codec

import (
	"context"
	"io"
	"slices"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// File is an open file of a codec layer: a handle on the file's shared
// state.
type File struct {
	fs    *Engine
	st    *state
	flags int
	path  string
	once  sync.Once
	// writer: open for writing, counted in st.writers (a shared lower).
	writer bool

	lkMu sync.Mutex
	lk   layer.File // this handle's own lower file, for its locks
}

var _ layer.File = (*File)(nil)

func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if f.flags&unix.O_ACCMODE == unix.O_WRONLY {
		return 0, syscall.EBADF
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	return f.st.readAt(ctx, p, off)
}

func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if f.flags&unix.O_ACCMODE == unix.O_RDONLY {
		return 0, syscall.EBADF
	}
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.lockWriter(); err != nil {
		return 0, err
	}
	if f.flags&unix.O_APPEND != 0 {
		off = s.size
	}
	n, err := s.writeAt(ctx, p, off)
	if err == nil && f.flags&(unix.O_SYNC|layer.ODsync) != 0 {
		err = s.sync(ctx, true, false)
	}
	return n, err
}

// TouchAtime: the lower file's atime is the file's (a read may be served
// from the chunks the file keeps decoded, or from its size alone).
func (f *File) TouchAtime(ctx context.Context) bool {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	return layer.TouchAtime(ctx, s.lower)
}

// Getattr gives the lower file's attributes with the logical size.
func (f *File) Getattr(ctx context.Context) (layer.Attr, error) {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.lower.Getattr(ctx)
	a.Size = uint64(s.size)
	return a, err
}

func (f *File) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.Valid&layer.SetSize != 0 {
		if err := s.lockWriter(); err != nil {
			return layer.Attr{}, err
		}
		if err := s.truncate(ctx, int64(in.Size)); err != nil {
			return layer.Attr{}, err
		}
	}
	rest := *in
	rest.Valid &^= layer.SetSize
	var a layer.Attr
	var err error
	if rest.Valid&setTimes != 0 {
		// Write out what is pending first: a later write to the lower
		// file would change the times just set (tar, cp -p, rsync).
		if err := s.sync(ctx, false, true); err != nil {
			return layer.Attr{}, err
		}
	}
	if rest.Valid != 0 {
		a, err = s.lower.Setattr(ctx, &rest)
	} else {
		a, err = s.lower.Getattr(ctx)
	}
	a.Size = uint64(s.size)
	return a, err
}

// Flush (each close) writes the dirty chunks, so that write errors reach
// close(2); each write to the lower flushes it (writeLower), so a lower
// that holds data of its own (the next link of a chain: another codec's
// file) has written it too. It does not wait for the disk. (Flushing the
// lower here as well would flush each link below twice per link above:
// 2^n flushes through n links.)
func (f *File) Flush(ctx context.Context) error {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ro {
		return nil
	}
	if !s.fs.shared {
		return s.flushDirty(ctx)
	}
	// A shared lower: after close(2) another client may open the file
	// and stat it from its header, before this handle's release (which
	// the kernel sends later) would have written it: write it now, and
	// compact now if it is due, not after close returned. Another client
	// may then write it too: the writer lock goes (a later write here
	// takes it again).
	err := s.sync(ctx, false, true)
	if err == nil {
		s.restamp(ctx)
		s.unlockWriter()
	}
	return err
}

// Fsync makes everything written durable.
func (f *File) Fsync(ctx context.Context, datasync bool) error {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.sync(ctx, true, true)
	if err == nil {
		s.restamp(ctx)
	}
	return err
}

func (f *File) Release(ctx context.Context) error {
	var err error
	f.once.Do(func() {
		if f.writer {
			s := f.st
			s.mu.Lock()
			if s.writers--; s.writers == 0 {
				s.unlockWriter()
			}
			s.mu.Unlock()
		}
		err = f.fs.put(ctx, f.st)
		f.lkMu.Lock()
		if f.lk != nil {
			f.lk.Release(ctx)
			f.lk = nil
		}
		f.lkMu.Unlock()
	})
	return err
}

// Allocate serves fallocate: reserving space is a no-op (encoded sizes are
// not known in advance) except that it may extend the file; punching holes
// and zeroing ranges write zeros.
func (f *File) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if off < 0 || length <= 0 {
		return syscall.EINVAL
	}
	if err := s.lockWriter(); err != nil {
		return err
	}
	keep := mode&layer.FallocKeepSize != 0
	switch mode &^ layer.FallocKeepSize {
	case 0:
	case layer.FallocPunchHole:
		if !keep {
			return syscall.EINVAL
		}
		return s.punch(ctx, off, length)
	case layer.FallocZeroRange:
		if err := s.punch(ctx, off, length); err != nil {
			return err
		}
	default:
		return syscall.EOPNOTSUPP
	}
	if end := off + length; !keep && end > s.size {
		return s.truncate(ctx, end)
	}
	return nil
}

// Lseek serves SEEK_DATA and SEEK_HOLE: whole chunks without data are
// holes.
func (f *File) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if off >= s.size {
		return 0, syscall.ENXIO
	}
	// The chunks with data at or after off's chunk, in order.
	first := off / s.cs
	var data []int64
	for c := range s.chunks {
		if c >= first {
			data = append(data, c)
		}
	}
	for c := range s.dirty {
		if _, dup := s.chunks[c]; !dup && c >= first {
			data = append(data, c)
		}
	}
	slices.Sort(data)
	switch whence {
	case unix.SEEK_DATA:
		if len(data) == 0 || data[0]*s.cs >= s.size {
			return 0, syscall.ENXIO
		}
		return max(off, data[0]*s.cs), nil
	case unix.SEEK_HOLE:
		next := first
		for _, c := range data {
			if c != next {
				break
			}
			next++
		}
		return min(max(off, next*s.cs), s.size), nil
	}
	return 0, syscall.EINVAL
}

// CopyFileRange copies between files of this layer by reading and writing
// here (one request instead of many); to other files it answers EXDEV,
// after which the kernel copies through read and write itself.
func (f *File) CopyFileRange(ctx context.Context, offIn int64, dst layer.File, offOut int64, n int64, flags uint32) (int64, error) {
	d, ok := dst.(*File)
	if !ok || d.fs != f.fs || flags != 0 {
		return 0, syscall.EXDEV
	}
	if f.flags&unix.O_ACCMODE == unix.O_WRONLY || d.flags&unix.O_ACCMODE == unix.O_RDONLY || d.flags&unix.O_APPEND != 0 {
		return 0, syscall.EBADF
	}
	buf := make([]byte, min(n, copyMaxBytes))
	f.st.mu.Lock()
	k, err := f.st.readAt(ctx, buf, offIn)
	f.st.mu.Unlock()
	if k == 0 {
		if err != nil && err != io.EOF {
			return 0, err
		}
		return 0, nil
	}
	d.st.mu.Lock()
	defer d.st.mu.Unlock()
	w, err := d.st.writeAt(ctx, buf[:k], offOut)
	return int64(w), err
}

// lockFile returns this handle's own lower file: locks belong to open files
// below, and the state's lower file is shared by all handles.
func (f *File) lockFile(ctx context.Context) (layer.File, error) {
	f.lkMu.Lock()
	defer f.lkMu.Unlock()
	if f.lk != nil {
		return f.lk, nil
	}
	lf, err := f.fs.Lower.Open(ctx, f.path, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, syscall.ENOLCK
	}
	if a, err := lf.Getattr(ctx); err != nil || a.ID() != f.st.ino {
		lf.Release(ctx)
		return nil, syscall.ENOLCK // renamed since it was opened
	}
	f.lk = lf
	return lf, nil
}

func (f *File) Getlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32) (layer.Lock, error) {
	l, err := f.lockFile(ctx)
	if err != nil {
		return layer.Lock{}, err
	}
	return l.Getlk(ctx, owner, lk, flags)
}

func (f *File) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32, wait bool) error {
	l, err := f.lockFile(ctx)
	if err != nil {
		return err
	}
	return l.Setlk(ctx, owner, lk, flags, wait)
}

// PassthroughFd: the lower bytes are not the file's bytes.
func (f *File) PassthroughFd() (int, bool) { return -1, false }

// Caps: the bytes are encoded below; the kernel reads through the layer.
// The file changes only through this stack (the engine keeps its index
// across opens on that assumption; a fold changes the records, not the
// bytes), so the kernel may keep the pages it read from one open to the
// next: a warm read is not a decode of its chunk (a 1 MiB zstd chunk
// costs a millisecond). Not on a lower shared with other machines.
func (f *File) Caps() layer.Caps {
	if f.fs.shared {
		return 0
	}
	return layer.CapKeepCache
}
