package cairn

import (
	"io"
	"io/fs"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// File is an open file or directory of a stack, in the manner of *os.File.
// Its methods may be called from several goroutines; Read, Write and Seek
// share the file's offset.
type File struct {
	s      *Stack
	name   string
	path   string
	f      layer.File // nil for a directory
	dir    bool
	append bool
	rd, wr bool

	mu     sync.Mutex
	off    int64
	ds     layer.Dir // a directory's listing, open from the first ReadDir
	closed bool
}

func newFile(s *Stack, name, p string, f layer.File, flag int) *File {
	acc := flag & (os.O_RDONLY | os.O_WRONLY | os.O_RDWR)
	return &File{s: s, name: name, path: p, f: f, append: flag&os.O_APPEND != 0,
		rd: acc != os.O_WRONLY, wr: acc != os.O_RDONLY}
}

// Name is the name the file was opened by.
func (f *File) Name() string { return f.name }

func (f *File) check(op string, dirOK bool) error {
	if f == nil {
		return fs.ErrInvalid
	}
	if f.closed {
		return &fs.PathError{Op: op, Path: f.name, Err: fs.ErrClosed}
	}
	if f.dir && !dirOK {
		return &fs.PathError{Op: op, Path: f.name, Err: syscall.EISDIR}
	}
	return nil
}

// ReadAt reads len(p) bytes at off; fewer only at the end, with io.EOF.
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "readat", Path: f.name, Err: syscall.EINVAL}
	}
	return f.readAt(p, off)
}

// readAt reads until p is full or the end; f.mu is held.
func (f *File) readAt(p []byte, off int64) (int, error) {
	if !f.rd {
		return 0, &fs.PathError{Op: "read", Path: f.name, Err: syscall.EBADF}
	}
	n := 0
	for n < len(p) {
		m, err := f.f.ReadAt(f.s.ctx, p[n:], off+int64(n))
		n += m
		if err == io.EOF || (err == nil && m == 0) {
			return n, io.EOF
		}
		if err != nil {
			return n, pathErr("read", f.name, err)
		}
	}
	return n, nil
}

// Read reads at the file's offset and moves it.
func (f *File) Read(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	n, err := f.readAt(p, f.off)
	f.off += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// WriteAt writes p at off (at the end for a file opened with O_APPEND,
// which os refuses; here it writes at the end, as pwrite(2) does).
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("write", false); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "writeat", Path: f.name, Err: syscall.EINVAL}
	}
	return f.writeAt(p, off)
}

func (f *File) writeAt(p []byte, off int64) (int, error) {
	if !f.wr {
		return 0, &fs.PathError{Op: "write", Path: f.name, Err: syscall.EBADF}
	}
	n := 0
	for n < len(p) {
		m, err := f.f.WriteAt(f.s.ctx, p[n:], off+int64(n))
		n += m
		if err != nil {
			return n, pathErr("write", f.name, err)
		}
		if m == 0 {
			return n, &fs.PathError{Op: "write", Path: f.name, Err: io.ErrShortWrite}
		}
	}
	return n, nil
}

// Write writes at the file's offset (at its end with O_APPEND) and moves
// it.
func (f *File) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("write", false); err != nil {
		return 0, err
	}
	if f.append {
		a, err := f.f.Getattr(f.s.ctx)
		if err != nil {
			return 0, pathErr("write", f.name, err)
		}
		f.off = int64(a.Size)
	}
	n, err := f.writeAt(p, f.off)
	f.off += int64(n)
	return n, err
}

// WriteString writes s.
func (f *File) WriteString(s string) (int, error) { return f.Write([]byte(s)) }

// Seek sets the offset for the next Read or Write (io.SeekStart,
// io.SeekCurrent, io.SeekEnd).
func (f *File) Seek(offset int64, whence int) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("seek", true); err != nil {
		return 0, err
	}
	if f.dir {
		if offset != 0 || whence != io.SeekStart {
			return 0, &fs.PathError{Op: "seek", Path: f.name, Err: syscall.EINVAL}
		}
		if f.ds != nil {
			f.ds.Close()
			f.ds = nil
		}
		return 0, nil
	}
	var base int64
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		base = f.off
	case io.SeekEnd:
		a, err := f.f.Getattr(f.s.ctx)
		if err != nil {
			return 0, pathErr("seek", f.name, err)
		}
		base = int64(a.Size)
	default:
		return 0, &fs.PathError{Op: "seek", Path: f.name, Err: syscall.EINVAL}
	}
	if base+offset < 0 {
		return 0, &fs.PathError{Op: "seek", Path: f.name, Err: syscall.EINVAL}
	}
	f.off = base + offset
	return f.off, nil
}

// Truncate sets the file's size.
func (f *File) Truncate(size int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("truncate", false); err != nil {
		return err
	}
	if size < 0 || !f.wr {
		return &fs.PathError{Op: "truncate", Path: f.name, Err: syscall.EINVAL}
	}
	_, err := f.f.Setattr(f.s.ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)})
	return pathErr("truncate", f.name, err)
}

// Sync makes what was written durable (fsync(2)).
func (f *File) Sync() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("sync", true); err != nil {
		return err
	}
	if f.dir {
		return pathErr("sync", f.name, f.s.top.SyncDir(f.s.ctx, f.path))
	}
	return pathErr("sync", f.name, f.f.Fsync(f.s.ctx, false))
}

// Stat describes the open file.
func (f *File) Stat() (fs.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("stat", true); err != nil {
		return nil, err
	}
	var a layer.Attr
	var err error
	if f.dir {
		a, err = f.s.top.Getattr(f.s.ctx, f.path)
	} else {
		a, err = f.f.Getattr(f.s.ctx)
	}
	if err != nil {
		return nil, pathErr("stat", f.name, err)
	}
	return newInfo(baseName(f.path), a), nil
}

// ReadDir reads the next n entries of a directory, in directory order, as
// os.File.ReadDir does: for n > 0, at most n, and io.EOF at the end; for
// n <= 0, all that are left.
func (f *File) ReadDir(n int) ([]fs.DirEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.check("readdir", true); err != nil {
		return nil, err
	}
	if !f.dir {
		return nil, &fs.PathError{Op: "readdir", Path: f.name, Err: syscall.ENOTDIR}
	}
	if f.ds == nil {
		d, err := layer.OpenDir(f.s.ctx, f.s.top, f.path)
		if err != nil {
			return nil, pathErr("readdir", f.name, err)
		}
		f.ds = d
	}
	out := []fs.DirEntry{}
	for n <= 0 || len(out) < n {
		e, _, err := f.ds.Next(f.s.ctx, true)
		if err == io.EOF {
			break
		}
		if err != nil {
			return out, pathErr("readdir", f.name, err)
		}
		out = append(out, f.s.dirEntry(f.path, e))
	}
	if n > 0 && len(out) == 0 {
		return nil, io.EOF
	}
	return out, nil
}

// Close closes the file: the error of its last write, if any, shows here.
func (f *File) Close() error {
	if f == nil {
		return fs.ErrInvalid
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return &fs.PathError{Op: "close", Path: f.name, Err: fs.ErrClosed}
	}
	f.closed = true
	var err error
	if f.ds != nil {
		f.ds.Close()
	}
	if f.f != nil {
		err = f.f.Flush(f.s.ctx)
		if rerr := f.f.Release(f.s.ctx); err == nil {
			err = rerr
		}
	}
	return pathErr("close", f.name, err)
}

// readAll reads from the start to the end.
func (f *File) readAll() ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []byte
	buf := make([]byte, 256<<10)
	for {
		n, err := f.readAt(buf, int64(len(out)))
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// readDir lists directory p (name to messages), sorted by name.
func (s *Stack) readDir(name, p string) ([]fs.DirEntry, error) {
	d, err := layer.OpenDir(s.ctx, s.top, p)
	if err != nil {
		return nil, pathErr("readdir", name, err)
	}
	defer d.Close()
	var out []fs.DirEntry
	for {
		e, _, err := d.Next(s.ctx, true)
		if err == io.EOF {
			break
		}
		if err != nil {
			return out, pathErr("readdir", name, err)
		}
		out = append(out, s.dirEntry(p, e))
	}
	slices.SortFunc(out, func(a, b fs.DirEntry) int {
		switch {
		case a.Name() < b.Name():
			return -1
		case a.Name() > b.Name():
			return 1
		}
		return 0
	})
	return out, nil
}

func (s *Stack) dirEntry(dir string, e layer.DirEntry) fs.DirEntry {
	return &dirEntry{s: s, path: layer.Join(dir, e.Name), e: e}
}

// dirEntry is an fs.DirEntry; its Info is the attributes that came with
// the listing, or a lookup.
type dirEntry struct {
	s    *Stack
	path string
	e    layer.DirEntry
}

func (d *dirEntry) Name() string { return d.e.Name }
func (d *dirEntry) IsDir() bool  { return d.Type().IsDir() }
func (d *dirEntry) Type() fs.FileMode {
	m := d.e.Mode
	if m == 0 && d.e.Attr != nil {
		m = d.e.Attr.Mode
	}
	if m == 0 {
		if a, err := d.s.top.Getattr(d.s.ctx, d.path); err == nil {
			m = a.Mode
		}
	}
	return fileMode(m).Type()
}

func (d *dirEntry) Info() (fs.FileInfo, error) {
	if d.e.Attr != nil {
		return newInfo(d.e.Name, *d.e.Attr), nil
	}
	a, err := d.s.top.Getattr(d.s.ctx, d.path)
	if err != nil {
		return nil, pathErr("stat", d.path, err)
	}
	return newInfo(d.e.Name, a), nil
}

func (d *dirEntry) String() string { return fs.FormatDirEntry(d) }

// info is an fs.FileInfo; Sys gives the layer.Attr.
type info struct {
	name string
	a    layer.Attr
}

func newInfo(name string, a layer.Attr) *info { return &info{name: name, a: a} }

func (i *info) Name() string       { return i.name }
func (i *info) Size() int64        { return int64(i.a.Size) }
func (i *info) Mode() fs.FileMode  { return fileMode(i.a.Mode) }
func (i *info) ModTime() time.Time { return time.Unix(i.a.Mtime.Unix()) }
func (i *info) IsDir() bool        { return i.a.IsDir() }
func (i *info) Sys() any           { return &i.a }
func (i *info) String() string     { return fs.FormatFileInfo(i) }

// fileMode converts a mode_t to an fs.FileMode (as os does).
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
