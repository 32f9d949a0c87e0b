// Package faultfs is a layer for tests: it forwards everything to its lower
// and injects the faults a disk and a crash produce, so that a layer's tests
// can run over a lower that fails the way real ones do:
//
//   - short writes: a write stores only part of its bytes and reports that
//     count with no error, as pwrite(2) may;
//   - a full disk: after N more bytes, the write that crosses the limit
//     stores what fits and returns that count with ENOSPC (what the local
//     layer reports when pwrite(2) stops short and its retry gets ENOSPC),
//     and later writes fail with ENOSPC;
//   - EIO on the Nth read;
//   - a slow fsync;
//   - a crash point: after N more bytes (or at once with Crash), the write
//     that crosses it is torn (its count and EIO) and every later change (writes, truncates,
//     fsync, allocate and every namespace change) fails with EIO and changes
//     nothing, as if the machine had stopped there. Reads still work, so the
//     test can look at what a restart would find.
//
// It is not a registered layer type: tests build it in-process with New,
// over any layer.FS, and change the faults while the stack runs with Set.
package faultfs

import (
	"context"
	"sync"
	"syscall"
	"time"

	"cairnfs.dev/cairn/layer"
)

// Faults says what to inject. The zero value injects nothing.
type Faults struct {
	// ShortWrites: every write of more than one byte stores only its first
	// half and returns that count, with no error.
	ShortWrites bool
	// NoSpace: writes may store SpaceLeft more bytes in all; the write that
	// crosses the limit stores what fits and returns that count with
	// ENOSPC, and later writes fail with ENOSPC.
	NoSpace   bool
	SpaceLeft int64
	// FailRead: the FailRead-th read from now (1: the next one) fails with
	// EIO; 0: none.
	FailRead int
	// FsyncDelay is added to every fsync.
	FsyncDelay time.Duration
	// CrashAfter > 0: the crash happens after this many more bytes written;
	// the write that crosses it stores only the bytes before it and returns
	// their count with EIO.
	CrashAfter int64
}

// FS is the fault-injecting layer.
type FS struct {
	layer.Base
	mu      sync.Mutex
	f       Faults
	written int64 // bytes stored since Set
	reads   int   // reads since Set
	crashed bool
	// Log, if set, receives one line per injected fault.
	Log func(format string, a ...any)
}

// New stacks a fault layer, injecting nothing yet, over lower.
func New(lower layer.FS) *FS { return &FS{Base: layer.Base{Lower: lower}} }

// Set replaces the faults and restarts the byte and read counts. It does
// not undo a crash.
func (fs *FS) Set(f Faults) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.f, fs.written, fs.reads = f, 0, 0
}

// Crash stops every later change now.
func (fs *FS) Crash() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.crashed = true
}

// Crashed reports whether the crash point was reached.
func (fs *FS) Crashed() bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.crashed
}

// Written returns the bytes stored since Set.
func (fs *FS) Written() int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.written
}

func (fs *FS) logf(format string, a ...any) {
	if fs.Log != nil {
		fs.Log(format, a...)
	}
}

// change is called before every change other than a write: after the
// crash, it fails.
func (fs *FS) change(what string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.crashed {
		fs.logf("faultfs: %s after the crash: EIO", what)
		return syscall.EIO
	}
	return nil
}

// allow says how many of n bytes a write may store, and the error that
// goes with that count (a write cut by a full disk or the crash point).
func (fs *FS) allow(n int) (int, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.crashed {
		fs.logf("faultfs: write after the crash: EIO")
		return 0, syscall.EIO
	}
	k := n
	var err error
	if fs.f.ShortWrites && k > 1 {
		k /= 2
		fs.logf("faultfs: short write: %d of %d bytes", k, n)
	}
	if fs.f.NoSpace {
		if left := fs.f.SpaceLeft - fs.written; int64(k) > left {
			k, err = int(max(left, 0)), syscall.ENOSPC
			fs.logf("faultfs: disk full: %d of %d bytes, ENOSPC", k, n)
		}
	}
	if fs.f.CrashAfter > 0 {
		if left := fs.f.CrashAfter - fs.written; int64(k) >= left {
			k, err = int(max(left, 0)), syscall.EIO
			fs.crashed = true
			fs.logf("faultfs: crash point: %d of %d bytes written, EIO", k, n)
		}
	}
	fs.written += int64(k)
	return k, err
}

func (fs *FS) read() error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.reads++
	if fs.f.FailRead > 0 && fs.reads == fs.f.FailRead {
		fs.logf("faultfs: read %d: EIO", fs.reads)
		return syscall.EIO
	}
	return nil
}

func (fs *FS) wrap(f layer.File) layer.File {
	return &File{BaseFile: layer.BaseFile{Lower: f}, fs: fs}
}

func (fs *FS) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	if flags&(syscall.O_TRUNC|syscall.O_CREAT) != 0 {
		if err := fs.change("open " + path); err != nil {
			return nil, err
		}
	}
	f, err := fs.Lower.Open(ctx, path, flags)
	if err != nil {
		return nil, err
	}
	return fs.wrap(f), nil
}

func (fs *FS) Create(ctx context.Context, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	if err := fs.change("create " + path); err != nil {
		return nil, layer.Attr{}, err
	}
	f, a, err := fs.Lower.Create(ctx, path, flags, mode)
	if err != nil {
		return nil, a, err
	}
	return fs.wrap(f), a, nil
}

func (fs *FS) Setattr(ctx context.Context, path string, in *layer.SetAttr) (layer.Attr, error) {
	if err := fs.change("setattr " + path); err != nil {
		return layer.Attr{}, err
	}
	return fs.Lower.Setattr(ctx, path, in)
}

func (fs *FS) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	if err := fs.change("mkdir " + path); err != nil {
		return layer.Attr{}, err
	}
	return fs.Lower.Mkdir(ctx, path, mode)
}

func (fs *FS) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (layer.Attr, error) {
	if err := fs.change("mknod " + path); err != nil {
		return layer.Attr{}, err
	}
	return fs.Lower.Mknod(ctx, path, mode, rdev)
}

func (fs *FS) Symlink(ctx context.Context, target, path string) (layer.Attr, error) {
	if err := fs.change("symlink " + path); err != nil {
		return layer.Attr{}, err
	}
	return fs.Lower.Symlink(ctx, target, path)
}

func (fs *FS) Link(ctx context.Context, oldpath, newpath string) (layer.Attr, error) {
	if err := fs.change("link " + newpath); err != nil {
		return layer.Attr{}, err
	}
	return fs.Lower.Link(ctx, oldpath, newpath)
}

func (fs *FS) Unlink(ctx context.Context, path string) error {
	if err := fs.change("unlink " + path); err != nil {
		return err
	}
	return fs.Lower.Unlink(ctx, path)
}

func (fs *FS) Rmdir(ctx context.Context, path string) error {
	if err := fs.change("rmdir " + path); err != nil {
		return err
	}
	return fs.Lower.Rmdir(ctx, path)
}

func (fs *FS) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	if err := fs.change("rename " + oldpath); err != nil {
		return err
	}
	return fs.Lower.Rename(ctx, oldpath, newpath, flags)
}

func (fs *FS) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	if err := fs.change("setxattr " + path); err != nil {
		return err
	}
	return fs.Lower.Setxattr(ctx, path, name, value, flags)
}

func (fs *FS) Removexattr(ctx context.Context, path, name string) error {
	if err := fs.change("removexattr " + path); err != nil {
		return err
	}
	return fs.Lower.Removexattr(ctx, path, name)
}

func (fs *FS) SyncDir(ctx context.Context, path string) error {
	if err := fs.change("syncdir " + path); err != nil {
		return err
	}
	return fs.Lower.SyncDir(ctx, path)
}

// File is an open file of the fault layer.
type File struct {
	layer.BaseFile
	fs *FS
}

func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if err := f.fs.read(); err != nil {
		return 0, err
	}
	return f.Lower.ReadAt(ctx, p, off)
}

func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	k, ferr := f.fs.allow(len(p))
	if k == 0 {
		return 0, ferr
	}
	n, err := f.Lower.WriteAt(ctx, p[:k], off)
	if n < k {
		// The lower's own short write: keep the count honest.
		f.fs.mu.Lock()
		f.fs.written -= int64(k - n)
		f.fs.mu.Unlock()
	}
	if err == nil {
		err = ferr
	}
	return n, err
}

func (f *File) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	if in.Valid != 0 {
		if err := f.fs.change("setattr"); err != nil {
			return layer.Attr{}, err
		}
	}
	return f.Lower.Setattr(ctx, in)
}

func (f *File) Fsync(ctx context.Context, datasync bool) error {
	if err := f.fs.change("fsync"); err != nil {
		return err
	}
	f.fs.mu.Lock()
	d := f.fs.f.FsyncDelay
	f.fs.mu.Unlock()
	if d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return syscall.EINTR
		}
	}
	return f.Lower.Fsync(ctx, datasync)
}

func (f *File) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	if err := f.fs.change("fallocate"); err != nil {
		return err
	}
	return f.Lower.Allocate(ctx, off, length, mode)
}

func (f *File) CopyFileRange(ctx context.Context, offIn int64, dst layer.File, offOut int64, n int64, flags uint32) (int64, error) {
	if err := f.fs.change("copy_file_range"); err != nil {
		return 0, err
	}
	// Through reads and writes, so that the faults apply.
	return 0, syscall.EXDEV
}

// PassthroughFd: the kernel must not bypass the faults.
func (f *File) PassthroughFd() (int, bool) { return -1, false }
func (f *File) Caps() layer.Caps           { return 0 }
