package layer

import (
	"context"
	"syscall"
)

// Base forwards every operation to Lower unchanged: the Wrapfs template.
// Embed it and override only what the layer changes.
type Base struct {
	Lower FS
}

func (b *Base) Getattr(ctx context.Context, path string) (Attr, error) {
	return b.Lower.Getattr(ctx, path)
}
func (b *Base) Setattr(ctx context.Context, path string, in *SetAttr) (Attr, error) {
	return b.Lower.Setattr(ctx, path, in)
}
func (b *Base) ReadDir(ctx context.Context, path string, plus bool) ([]DirEntry, error) {
	return b.Lower.ReadDir(ctx, path, plus)
}
func (b *Base) Open(ctx context.Context, path string, flags int) (File, error) {
	return b.Lower.Open(ctx, path, flags)
}
func (b *Base) Create(ctx context.Context, path string, flags int, mode uint32) (File, Attr, error) {
	return b.Lower.Create(ctx, path, flags, mode)
}
func (b *Base) Mkdir(ctx context.Context, path string, mode uint32) (Attr, error) {
	return b.Lower.Mkdir(ctx, path, mode)
}
func (b *Base) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (Attr, error) {
	return b.Lower.Mknod(ctx, path, mode, rdev)
}
func (b *Base) Symlink(ctx context.Context, target, path string) (Attr, error) {
	return b.Lower.Symlink(ctx, target, path)
}
func (b *Base) Readlink(ctx context.Context, path string) (string, error) {
	return b.Lower.Readlink(ctx, path)
}
func (b *Base) Link(ctx context.Context, oldpath, newpath string) (Attr, error) {
	return b.Lower.Link(ctx, oldpath, newpath)
}
func (b *Base) Unlink(ctx context.Context, path string) error { return b.Lower.Unlink(ctx, path) }
func (b *Base) Rmdir(ctx context.Context, path string) error  { return b.Lower.Rmdir(ctx, path) }
func (b *Base) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	return b.Lower.Rename(ctx, oldpath, newpath, flags)
}
func (b *Base) Getxattr(ctx context.Context, path, name string, dest []byte) (int, error) {
	return b.Lower.Getxattr(ctx, path, name, dest)
}
func (b *Base) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	return b.Lower.Setxattr(ctx, path, name, value, flags)
}
func (b *Base) Listxattr(ctx context.Context, path string, dest []byte) (int, error) {
	return b.Lower.Listxattr(ctx, path, dest)
}
func (b *Base) Removexattr(ctx context.Context, path, name string) error {
	return b.Lower.Removexattr(ctx, path, name)
}
func (b *Base) Statfs(ctx context.Context, path string) (Statfs, error) {
	return b.Lower.Statfs(ctx, path)
}
func (b *Base) SyncDir(ctx context.Context, path string) error {
	return b.Lower.SyncDir(ctx, path)
}
func (b *Base) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (File, Attr, error) {
	return b.Lower.Tmpfile(ctx, dir, flags, mode)
}

// LinkFile forwards f, which Base's Tmpfile had from the lower as it is: a
// layer whose Tmpfile wraps the lower's file links it itself.
func (b *Base) LinkFile(ctx context.Context, f File, newpath string) (Attr, error) {
	return b.Lower.LinkFile(ctx, f, newpath)
}
func (b *Base) GetFlags(ctx context.Context, path string) (uint32, error) {
	return b.Lower.GetFlags(ctx, path)
}
func (b *Base) SetFlags(ctx context.Context, path string, flags uint32) error {
	return b.Lower.SetFlags(ctx, path, flags)
}
func (b *Base) Lowers() []FS     { return []FS{b.Lower} }
func (b *Base) Changes() Changes { return 0 }
func (b *Base) Close() error     { return nil }

// FSCaps forwards the lower layer's (see FSCapser).
func (b *Base) FSCaps() FSCaps { return FSCapsOf(b.Lower) }

// BaseFile forwards every operation of an open file to Lower.
type BaseFile struct {
	Lower File
}

// Unwrapper is implemented by files that wrap one lower file; BaseFile does.
// CopyFileRange uses it to reach the destination's lower file.
type Unwrapper interface {
	Unwrap() File
}

func (f *BaseFile) Unwrap() File { return f.Lower }

func (f *BaseFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.Lower.ReadAt(ctx, p, off)
}
func (f *BaseFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return f.Lower.WriteAt(ctx, p, off)
}
func (f *BaseFile) Getattr(ctx context.Context) (Attr, error) { return f.Lower.Getattr(ctx) }
func (f *BaseFile) Setattr(ctx context.Context, in *SetAttr) (Attr, error) {
	return f.Lower.Setattr(ctx, in)
}
func (f *BaseFile) Flush(ctx context.Context) error { return f.Lower.Flush(ctx) }
func (f *BaseFile) Fsync(ctx context.Context, datasync bool) error {
	return f.Lower.Fsync(ctx, datasync)
}
func (f *BaseFile) Release(ctx context.Context) error { return f.Lower.Release(ctx) }
func (f *BaseFile) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	return f.Lower.Allocate(ctx, off, length, mode)
}
func (f *BaseFile) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	return f.Lower.Lseek(ctx, off, whence)
}
func (f *BaseFile) CopyFileRange(ctx context.Context, offIn int64, dst File, offOut int64, n int64, flags uint32) (int64, error) {
	u, ok := dst.(Unwrapper)
	if !ok {
		return 0, syscall.EXDEV
	}
	return f.Lower.CopyFileRange(ctx, offIn, u.Unwrap(), offOut, n, flags)
}
func (f *BaseFile) Getlk(ctx context.Context, owner uint64, lk *Lock, flags uint32) (Lock, error) {
	return f.Lower.Getlk(ctx, owner, lk, flags)
}
func (f *BaseFile) Setlk(ctx context.Context, owner uint64, lk *Lock, flags uint32, wait bool) error {
	return f.Lower.Setlk(ctx, owner, lk, flags, wait)
}
func (f *BaseFile) PassthroughFd() (int, bool)          { return f.Lower.PassthroughFd() }
func (f *BaseFile) TouchAtime(ctx context.Context) bool { return TouchAtime(ctx, f.Lower) }
func (f *BaseFile) Caps() Caps                          { return f.Lower.Caps() }
