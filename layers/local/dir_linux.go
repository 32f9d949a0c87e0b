package local

import (
	"context"
	"io"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// dir streams a directory with getdents64, a batch at a time: memory is one
// batch whatever the directory's size, and each entry's cookie is the
// lower's d_off (ext4's name hash), which lseek takes back, so a listing
// that goes on while names are created and removed lists the names that
// stay exactly once. Between batches an open directory holds no
// descriptor: each batch reopens it by file handle (as fdCache reopens
// files), so that a process holding many directories open cannot use up
// the daemon's descriptors; a daemon that cannot reopen by handle (not
// root) keeps one.
type dir struct {
	fs      *FS
	fd      int // kept only when there is no handle
	handle  unix.FileHandle
	mountFd int
	plus    bool
	ents    []dirent // the current batch
	i       int
	next    uint64 // the cookie the next batch starts after
	eof     bool
}

// dirBufs are getdents buffers, one per batch being read.
var dirBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

type dirent struct {
	e      layer.DirEntry
	cookie uint64
}

var _ layer.DirOpener = (*FS)(nil)

// OpenDir opens path's listing as a stream (layer.DirOpener).
func (fs *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	fd, err := fs.openIn(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	d := &dir{fs: fs, fd: fd}
	if h, m, ok := fs.fds.handleOf(fd, unix.S_IFDIR); ok {
		d.handle, d.mountFd = h, m
		unix.Close(fd)
		d.fd = -1
	}
	return d, nil
}

func (d *dir) Next(ctx context.Context, plus bool) (layer.DirEntry, uint64, error) {
	for d.i >= len(d.ents) {
		if d.eof {
			return layer.DirEntry{}, 0, io.EOF
		}
		if err := d.fill(plus); err != nil {
			return layer.DirEntry{}, 0, err
		}
	}
	e := d.ents[d.i]
	d.i++
	if plus && e.e.Attr == nil && !d.plus {
		// Asked for attributes after a batch without: rare; stat by name.
		if a, err := d.statOne(e.e.Name); err == nil {
			e.e.Attr = &a
		}
	}
	return e.e, e.cookie, nil
}

// fill reads the next batch.
func (d *dir) fill(plus bool) error {
	fd := d.fd
	if fd < 0 {
		var err error
		if fd, err = unix.OpenByHandleAt(d.mountFd, d.handle, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC); err != nil {
			return err
		}
		defer unix.Close(fd)
	}
	if _, err := unix.Seek(fd, int64(d.next), io.SeekStart); err != nil {
		return err
	}
	// Fill the buffer while the directory is open: a small directory's
	// end is then found now, not by reopening it for an empty batch.
	bp := dirBufs.Get().(*[]byte)
	defer dirBufs.Put(bp)
	buf := *bp
	n := 0
	for len(buf)-n >= 1024 {
		m, err := unix.Getdents(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if m <= 0 {
			d.eof = true
			break
		}
		n += m
	}
	d.ents, d.i, d.plus = d.ents[:0], 0, plus
	for b := buf[:n]; len(b) > 0; {
		// struct linux_dirent64 { u64 ino; s64 off; u16 reclen; u8 type; char name[]; }
		ino := *(*uint64)(unsafe.Pointer(&b[0]))
		off := *(*uint64)(unsafe.Pointer(&b[8]))
		reclen := int(*(*uint16)(unsafe.Pointer(&b[16])))
		typ := b[18]
		name := b[19:reclen]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		b = b[reclen:]
		d.next = off
		if s := string(name); s != "." && s != ".." {
			e := layer.DirEntry{Name: s, Ino: ino, Mode: uint32(typ) << 12}
			if plus {
				if a, err := d.fs.lstatAt(fd, s); err == nil {
					e.Attr = &a
				}
			}
			d.ents = append(d.ents, dirent{e, off})
		}
	}
	return nil
}

func (d *dir) statOne(name string) (layer.Attr, error) {
	fd := d.fd
	if fd < 0 {
		var err error
		if fd, err = unix.OpenByHandleAt(d.mountFd, d.handle, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC); err != nil {
			return layer.Attr{}, err
		}
		defer unix.Close(fd)
	}
	return d.fs.lstatAt(fd, name)
}

func (d *dir) Seek(ctx context.Context, off uint64) error {
	d.ents, d.i, d.next, d.eof = d.ents[:0], 0, off, false
	return nil
}

func (d *dir) Close() error {
	if d.fd >= 0 {
		return unix.Close(d.fd)
	}
	return nil
}
