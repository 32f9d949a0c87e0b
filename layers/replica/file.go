package replica

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// file is an open file of a replica layer: one replica's file for a file
// opened read-only (rd), every healthy replica's for one opened to write.
// Reads stay on rd (readahead locality) until it fails.
type file struct {
	fs    *FS
	path  atomic.Pointer[string]
	flags int         // for reopening on another replica
	show  *layer.ID   // the identity shown, when rd is not the primary
	epoch uint64      // fs.epoch when the file was last marked dirty
	id    layer.ID    // the object's identity (the primary's), for fs.opens
	pt    bool        // passed through (see opens.go)
	ptw   bool        // opened to write, and passed through to replica rd
	busy  int         // 1 + the replica whose outstanding count this open holds
	wrote atomic.Bool // changed since its last flush (see alignTimes)

	mu sync.Mutex
	lf []layer.File // by replica; nil where not open
	rd int
	// hold is the primary's file (replica holdAt) of a read-only file
	// read on another replica, kept open unread until the release: see
	// openRead.
	hold   layer.File
	holdAt int
}

// settle drops the files of replicas degraded meanwhile; reads stay on
// their replica if it is left, else go to the first one left.
func (f *file) settle(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	first := -1
	for i, lf := range f.lf {
		if lf == nil {
			continue
		}
		if !f.fs.Healthy(i) {
			go lf.Release(context.Background()) // it may hang
			f.lf[i] = nil
			continue
		}
		if first < 0 {
			first = i
		}
	}
	if f.rd >= 0 && f.rd < len(f.lf) && f.lf[f.rd] != nil {
		return
	}
	f.rd = max(first, 0)
}

func (f *file) releaseAll(ctx context.Context) {
	for i, lf := range f.lf {
		if lf != nil {
			lf.Release(ctx)
			f.lf[i] = nil
		}
	}
}

// open are the replicas this file has open and that are healthy.
func (f *file) open() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var o []int
	for i, lf := range f.lf {
		if lf != nil && f.fs.Healthy(i) {
			o = append(o, i)
		}
	}
	return o
}

func (f *file) get(i int) layer.File {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lf[i]
}

// reader is the file to read from: rd's, or after a failure another
// replica's, opened if need be.
func (f *file) reader(ctx context.Context) (int, layer.File, error) {
	f.mu.Lock()
	i, lf := f.rd, f.lf[f.rd]
	f.mu.Unlock()
	if lf != nil && f.fs.Healthy(i) {
		return i, lf, nil
	}
	for _, j := range f.open() {
		f.mu.Lock()
		f.rd = j
		f.mu.Unlock()
		return j, f.get(j), nil
	}
	// A read-only file whose replica failed: open the file on another.
	path := *f.path.Load()
	nf, i, err := one(f.fs, f.fs.pick(), "open", path, func(j int) (layer.File, error) { return f.fs.r[j].Open(ctx, path, f.flags) })
	if err != nil {
		return 0, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if old := f.lf[i]; old != nil {
		nf.Release(ctx)
		nf = old
	}
	f.lf[i], f.rd = nf, i
	return i, nf, nil
}

// read runs a read on the reading replica, failing over; it gives the
// replica that answered.
func read[T any](ctx context.Context, f *file, op string, fn func(lf layer.File) (T, error)) (T, int, error) {
	for {
		i, lf, err := f.reader(ctx)
		if err != nil {
			var zero T
			return zero, i, err
		}
		v, err := inline(f.fs, i, op, *f.path.Load(), func() (T, error) { return fn(lf) })
		if !failure(err) || !f.fs.degrade(i, op, *f.path.Load(), err) {
			return v, i, err
		}
	}
}

// write runs a change on every replica the file has open; see all.
func write[T any](ctx context.Context, f *file, op string, fn func(lf layer.File) (T, error)) ([]T, int, error) {
	if len(f.open()) == 0 {
		return nil, 0, syscall.EIO
	}
	vals, lead, err := all(f.fs, op, *f.path.Load(), func(i int) (T, error) {
		lf := f.get(i)
		if lf == nil {
			var zero T
			return zero, nil // not open there (a replica degraded meanwhile)
		}
		return fn(lf)
	}, nil)
	if f.fs.degraded.Load() != 0 && f.epoch != f.fs.epoch.Load() {
		f.epoch = f.fs.epoch.Load()
		f.fs.markDirty(ctx, *f.path.Load())
	}
	f.settle(ctx)
	return vals, lead, err
}

func (f *file) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if f.fs.o.Timeout <= 0 {
		n, _, err := read(ctx, f, "read", func(lf layer.File) (int, error) { return lf.ReadAt(ctx, p, off) })
		return n, err
	}
	// Into a buffer of its own: a replica that answers too late must not
	// write into p.
	buf := make([]byte, len(p))
	n, _, err := read(ctx, f, "read", func(lf layer.File) (int, error) { return lf.ReadAt(ctx, buf, off) })
	copy(p, buf[:max(0, min(n, len(buf)))])
	return n, err
}

func (f *file) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	f.wrote.Store(true)
	ns, lead, err := write(ctx, f, "write", func(lf layer.File) (int, error) { return lf.WriteAt(ctx, p, off) })
	if err == nil {
		// A short write on some replicas only: they differ now.
		for _, i := range f.open() {
			if i != lead && ns[i] != ns[lead] {
				f.fs.degrade(i, "write", *f.path.Load(), fmt.Errorf("diverged: replica %d wrote %d bytes, replica %d %d", lead+1, ns[lead], i+1, ns[i]))
			}
		}
		f.settle(ctx)
	}
	if ns == nil {
		return 0, err
	}
	return ns[lead], err
}

// attrs shows the file's attributes as the primary shows its object.
func (f *file) attrs(a *layer.Attr, i int) {
	f.fs.tag(a, i)
	if f.show != nil {
		a.Dev, a.Branch, a.Ino, a.Gen = f.show.Dev, f.show.Branch, f.show.Ino, f.show.Gen
	}
}

func (f *file) Getattr(ctx context.Context) (layer.Attr, error) {
	if o := f.open(); len(o) > 1 && !f.ptw {
		lf := f.get(o[0])
		a, err := inline(f.fs, o[0], "fgetattr", *f.path.Load(), func() (layer.Attr, error) { return lf.Getattr(ctx) })
		if !failure(err) || !f.fs.degrade(o[0], "fgetattr", *f.path.Load(), err) {
			f.attrs(&a, o[0])
			return a, err
		}
	}
	a, i, err := read(ctx, f, "fgetattr", func(lf layer.File) (layer.Attr, error) { return lf.Getattr(ctx) })
	f.attrs(&a, i)
	return a, err
}

func (f *file) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	if in.Valid&layer.SetSize != 0 {
		f.wrote.Store(true)
	}
	as, lead, err := write(ctx, f, "fsetattr", func(lf layer.File) (layer.Attr, error) { return lf.Setattr(ctx, in) })
	if as == nil {
		return layer.Attr{}, err
	}
	a := as[lead]
	f.attrs(&a, lead)
	return a, err
}

func (f *file) Flush(ctx context.Context) error {
	if !writes(f.flags) && !f.ptw {
		// One replica's file, read-only: in the request's goroutine,
		// as its reads (a change on every replica costs a goroutine
		// each).
		_, _, err := read(ctx, f, "flush", func(lf layer.File) (struct{}, error) { return struct{}{}, lf.Flush(ctx) })
		return err
	}
	_, _, err := write(ctx, f, "flush", func(lf layer.File) (struct{}, error) { return struct{}{}, lf.Flush(ctx) })
	if err == nil && f.wrote.Swap(false) {
		f.alignTimes(ctx)
	}
	return err
}

// alignTimes gives every replica's file the first one's access and
// modification times, at each close of a file that changed: each replica
// took the writes at its own moment, and a file's times must not depend on
// the replica that answers a stat (a read-only file is read from another
// replica than the primary). The ctimes still differ.
func (f *file) alignTimes(ctx context.Context) {
	o := f.open()
	if len(o) < 2 {
		return
	}
	a, err := f.get(o[0]).Getattr(ctx)
	if err != nil {
		return
	}
	in := &layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime, Atime: a.Atime, Mtime: a.Mtime}
	for _, i := range o[1:] {
		if lf := f.get(i); lf != nil {
			lf.Setattr(ctx, in)
		}
	}
}

func (f *file) Fsync(ctx context.Context, datasync bool) error {
	if f.ptw {
		f.copyOut(ctx)
	}
	_, _, err := write(ctx, f, "fsync", func(lf layer.File) (struct{}, error) { return struct{}{}, lf.Fsync(ctx, datasync) })
	return err
}

func (f *file) Release(ctx context.Context) error {
	f.fs.mu.Lock()
	delete(f.fs.files, f)
	f.fs.mu.Unlock()
	if f.ptw {
		f.copyOut(ctx)
	}
	f.fs.closed(f)
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, lf := range f.lf {
		if lf == nil {
			continue
		}
		if f.fs.Healthy(i) {
			lf.Release(ctx)
		} else {
			go lf.Release(context.Background())
		}
		f.lf[i] = nil
	}
	if f.hold != nil {
		if f.fs.Healthy(f.holdAt) {
			f.hold.Release(ctx)
		} else {
			go f.hold.Release(context.Background())
		}
		f.hold = nil
	}
	return nil
}

func (f *file) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	f.wrote.Store(true)
	_, _, err := write(ctx, f, "fallocate", func(lf layer.File) (struct{}, error) { return struct{}{}, lf.Allocate(ctx, off, length, mode) })
	return err
}

// Lseek: ENXIO is SEEK_DATA's answer past the last data (and
// SEEK_HOLE's past the end), not a failing replica.
func (f *file) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	var past bool
	o, _, err := read(ctx, f, "lseek", func(lf layer.File) (int64, error) {
		o, err := lf.Lseek(ctx, off, whence)
		if layer.Errno(err) == syscall.ENXIO && (whence == unix.SEEK_DATA || whence == unix.SEEK_HOLE) {
			past = true
			return o, nil
		}
		return o, err
	})
	if past && err == nil {
		return o, syscall.ENXIO
	}
	return o, err
}

// CopyFileRange: the kernel copies through reads and writes instead.
func (f *file) CopyFileRange(context.Context, int64, layer.File, int64, int64, uint32) (int64, error) {
	return 0, syscall.EXDEV
}

// Locks are the kernel's (the frontend keeps them); in-process, the
// reading replica's.
func (f *file) Getlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32) (layer.Lock, error) {
	l, _, err := read(ctx, f, "getlk", func(lf layer.File) (layer.Lock, error) { return lf.Getlk(ctx, owner, lk, flags) })
	return l, err
}

func (f *file) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32, wait bool) error {
	_, _, err := read(ctx, f, "setlk", func(lf layer.File) (struct{}, error) { return struct{}{}, lf.Setlk(ctx, owner, lk, flags, wait) })
	return err
}

// single is the file of a read-only open, which can be handed to the
// kernel (or the passed-through replica's file of a ptw file).
func (f *file) single() layer.File {
	if f.ptw {
		return f.get(f.rd)
	}
	if writes(f.flags) {
		return nil
	}
	o := f.open()
	if len(o) != 1 {
		return nil
	}
	return f.get(o[0])
}

func (f *file) PassthroughFd() (int, bool) {
	if lf := f.single(); lf != nil && f.pt {
		return lf.PassthroughFd()
	}
	return -1, false
}

func (f *file) LendFd(fn func(fd int)) bool {
	lf := f.single()
	return lf != nil && f.pt && layer.LendFd(lf, fn)
}

// Caps: a read-only file has its replica file's (passthrough included,
// unless the layer says no); a file opened to write is several files, and
// passes nothing through. A file opened to write needs its flushes (each
// close of a written file aligns the replicas' times).
func (f *file) Caps() layer.Caps {
	if lf := f.single(); lf != nil {
		c := lf.Caps()
		if !f.pt {
			c &^= layer.CapPassthrough
		}
		if writes(f.flags) {
			c &^= layer.CapNoFlush
		}
		return c
	}
	c := ^layer.Caps(0)
	for _, i := range f.open() {
		c &= f.get(i).Caps()
	}
	return c &^ (layer.CapPassthrough | layer.CapNoFlush)
}

func (f *file) TouchAtime(ctx context.Context) bool {
	if lf := f.single(); lf != nil {
		return layer.TouchAtime(ctx, lf)
	}
	return false
}

var _ layer.File = (*file)(nil)

// copyOut makes the other replicas' files of a file opened to write and
// passed through (whose bytes the kernel wrote to replica rd only) copies
// of rd's. A replica that fails it is degraded.
func (f *file) copyOut(ctx context.Context) {
	src := f.get(f.rd)
	if src == nil {
		return
	}
	a, err := src.Getattr(ctx)
	if err != nil {
		return
	}
	buf := make([]byte, 1<<20)
	for _, j := range f.open() {
		if j == f.rd {
			continue
		}
		dst := f.get(j)
		err := func() error {
			for off := int64(0); off < int64(a.Size); {
				n, err := src.ReadAt(ctx, buf, off)
				if n > 0 {
					if _, err := dst.WriteAt(ctx, buf[:n], off); err != nil {
						return err
					}
					off += int64(n)
				}
				if err == io.EOF || n == 0 {
					break
				}
				if err != nil {
					return err
				}
			}
			_, err := dst.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize | layer.SetMtime, Size: a.Size, Mtime: a.Mtime})
			return err
		}()
		if err != nil {
			f.fs.degrade(j, "write", *f.path.Load(), fmt.Errorf("copying the passed-through writes of replica %d: %w", f.rd+1, err))
		}
	}
}
