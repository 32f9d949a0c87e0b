package local

import (
	"context"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// atDir runs fn with a descriptor (O_PATH) of the directory path itself.
func (fs *FS) atDir(path string, fn func(dfd int) error) error {
	if path == "" {
		return fn(fs.rootFd)
	}
	dfd, done, err := fs.dirs.get(path, func() (int, error) {
		return openBeneath(fs.rootFd, path, unix.O_PATH|unix.O_DIRECTORY, 0)
	})
	if err != nil {
		return err
	}
	defer done()
	return fn(dfd)
}

// Tmpfile opens an unnamed file in dir with openat(O_TMPFILE), as the
// caller (identity, umask or default ACL: see asCaller), as Create does.
func (fs *FS) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	flags &= openFlags &^ (unix.O_CREAT | unix.O_TRUNC | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_PATH)
	var fd int
	err := fs.atDir(dir, func(dfd int) error {
		return fs.asCaller(ctx, dfd, ".", mode, func(mode uint32) (err error) {
			for {
				fd, err = unix.Openat2(dfd, ".", &unix.OpenHow{
					Flags: uint64(flags | unix.O_TMPFILE | unix.O_CLOEXEC), Mode: uint64(mode & 0o7777), Resolve: resolve,
				})
				if err != unix.EINTR && err != unix.EAGAIN {
					return err
				}
			}
		})
	})
	if err != nil {
		return nil, layer.Attr{}, err
	}
	f := fs.newFile(fd, flags&^unix.O_EXCL)
	a, err := f.Getattr(ctx)
	if err != nil {
		f.Release(ctx)
		return nil, layer.Attr{}, err
	}
	return f, a, nil
}

// LinkFile links the open file f at newpath: linkat(2) of the descriptor
// itself (AT_EMPTY_PATH, which needs CAP_DAC_READ_SEARCH before Linux
// 6.10), or of /proc/self/fd/N, as a program links an O_TMPFILE file.
func (fs *FS) LinkFile(ctx context.Context, f layer.File, newpath string) (a layer.Attr, err error) {
	lf, ok := f.(*File)
	if !ok || lf.fs != fs {
		return layer.Attr{}, syscall.EXDEV
	}
	err = lf.with(func(fd int) error {
		return fs.inDir(newpath, func(ndfd int, nname string) error {
			err := unix.Linkat(fd, "", ndfd, nname, unix.AT_EMPTY_PATH)
			if err == unix.ENOENT || err == unix.EPERM {
				err = unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), ndfd, nname, unix.AT_SYMLINK_FOLLOW)
			}
			if err != nil {
				return err
			}
			a, err = fs.lstatAt(ndfd, nname)
			return err
		})
	})
	return a, err
}
