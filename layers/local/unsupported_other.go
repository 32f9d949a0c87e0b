//go:build !linux

package local

import (
	"context"
	"syscall"

	"cairnfs.dev/cairn/layer"
)

// Inode flags (chattr) are Linux's FS_IOC_GETFLAGS: ENOTTY, as Linux
// answers for a file system without them.
func (fs *FS) GetFlags(ctx context.Context, path string) (uint32, error) {
	return 0, syscall.ENOTTY
}

func (fs *FS) SetFlags(ctx context.Context, path string, flags uint32) error {
	return syscall.ENOTTY
}

// Tmpfile: no O_TMPFILE off Linux; EOPNOTSUPP, as Linux answers for a file
// system without it.
func (fs *FS) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	return nil, layer.Attr{}, syscall.EOPNOTSUPP
}

func (fs *FS) LinkFile(ctx context.Context, f layer.File, newpath string) (layer.Attr, error) {
	return layer.Attr{}, syscall.EOPNOTSUPP
}
