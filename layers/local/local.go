// Package local is the bottom layer: a real directory.
//
// Every access goes through a descriptor of the root directory with openat2
// (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) for the
// directories on the way and *at calls that do not follow a final symbolic
// link, so no path, symlink or ".." in the directory can lead outside it,
// even if the directory changes under us. Only open files and a bounded
// cache of recently used directories hold descriptors, both bounded, so the
// number of descriptors grows neither with the number of files nor with
// the number of open files (see dirCache and fdCache).
//
// Off Linux, where there is no openat2, the paths are walked a name at a
// time with openat(O_NOFOLLOW) (and O_RESOLVE_BENEATH on FreeBSD), which
// keeps the same guarantee (beneath.go); what else differs there is in the
// *_other.go files and docs/portability.md.
//
// Objects are created with the caller's identity and umask: the creating
// thread takes the caller's fsuid, fsgid and supplementary groups, so
// ownership, setgid directories and the lower file system's own permission
// checks are right, and the caller's umask (or a default ACL of the
// directory instead), not the daemon's (see creators).
package local

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// FS is a local directory as a layer.
type FS struct {
	root    string
	rootFd  int
	private bool   // rootFd is on a private bind mount (see SetAtime)
	asOwner bool   // running as root: create objects as the caller
	umask   uint32 // the process's umask when New ran (see direct)
	dirs    dirCache
	fds     fdCache
	rootDev uint64 // the directory opened (RootMoved)
	rootIno uint64
	// shared: others change the directory too; networked: it is on a
	// network or FUSE file system (see Exclusive).
	shared    sharedFlag
	networked bool
	// creators run the calls that create objects (see asCaller).
	creators creators
	closed   sync.Once
}

var _ layer.FS = (*FS)(nil)

// New opens the directory at root.
func New(root string) (*FS, error) {
	fd, err := unix.Open(root, oPath|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("local: cannot open directory %s: %w", root, err)
	}
	fs := &FS{root: root, rootFd: fd, asOwner: os.Geteuid() == 0, umask: processUmask()}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("local: %s: %w", root, err)
	}
	fs.rootDev, fs.rootIno = uint64(st.Dev), st.Ino
	fs.networked = networked(fd)
	limit := nofile()
	fs.dirs.size = min(dirCacheSize, max(limit/4, 4))
	fs.fds.init(fd, limit)
	fs.initFind()
	return fs, nil
}

// Root is the directory's path.
func (fs *FS) Root() string { return fs.root }

// RootMoved says whether root names another directory than the one the
// layer opened (or nothing): the directory was renamed, removed or
// replaced behind the layer, whose descriptor still reaches it. One stat.
func (fs *FS) RootMoved() error {
	var st unix.Stat_t
	if err := unix.Stat(fs.root, &st); err != nil {
		return fmt.Errorf("%s: %w", fs.root, err)
	}
	if uint64(st.Dev) != fs.rootDev || st.Ino != fs.rootIno {
		return fmt.Errorf("%s is another directory now (device %d inode %d, was %d %d)", fs.root, st.Dev, st.Ino, fs.rootDev, fs.rootIno)
	}
	return nil
}

func (fs *FS) Lowers() []layer.FS     { return nil }
func (fs *FS) Changes() layer.Changes { return 0 }

// Close closes the layer; a second Close does nothing (closing the root
// descriptor again could close another file that took its number).
func (fs *FS) Close() error {
	var err error
	fs.closed.Do(func() {
		fs.creators.close()
		fs.dirs.close()
		fs.fds.close()
		err = unix.Close(fs.rootFd)
	})
	return err
}

// inDir runs fn with a descriptor of path's directory and path's last name.
func (fs *FS) inDir(path string, fn func(dirfd int, name string) error) error {
	if path == "" {
		// The root itself: address it as "." in the root.
		return fn(fs.rootFd, ".")
	}
	dir, name := layer.Split(path)
	if dir == "" {
		return fn(fs.rootFd, name)
	}
	dfd, done, err := fs.dirs.get(dir, func() (int, error) {
		return openBeneath(fs.rootFd, dir, oPath|unix.O_DIRECTORY, 0)
	})
	if err != nil {
		return err
	}
	defer done()
	return fn(dfd, name)
}

// openIn opens path through its directory's descriptor.
func (fs *FS) openIn(path string, flags int, mode uint32) (fd int, err error) {
	err = fs.inDir(path, func(dfd int, name string) error {
		fd, err = openBeneath(dfd, name, flags, mode)
		return err
	})
	return fd, err
}

func (fs *FS) Getattr(ctx context.Context, path string) (a layer.Attr, err error) {
	err = fs.inDir(path, func(dfd int, name string) error {
		a, err = fs.lstatAt(dfd, name)
		return err
	})
	return a, err
}

func (fs *FS) Setattr(ctx context.Context, path string, in *layer.SetAttr) (layer.Attr, error) {
	var a layer.Attr
	err := fs.inDir(path, func(dfd int, name string) error {
		if in.Valid&layer.SetSize != 0 {
			fd, err := openBeneath(dfd, name, unix.O_WRONLY|unix.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			err = unix.Ftruncate(fd, int64(in.Size))
			unix.Close(fd)
			if err != nil {
				return err
			}
		}
		if err := setattrAt(dfd, name, in); err != nil {
			return err
		}
		var err error
		a, err = fs.lstatAt(dfd, name)
		return err
	})
	return a, err
}

// setattrAt applies mode, owner and times (not size) to dirfd/name without
// following a final symlink.
func setattrAt(dfd int, name string, in *layer.SetAttr) error {
	if in.Valid&(layer.SetUid|layer.SetGid) != 0 {
		uid, gid := -1, -1
		if in.Valid&layer.SetUid != 0 {
			uid = int(in.Uid)
		}
		if in.Valid&layer.SetGid != 0 {
			gid = int(in.Gid)
		}
		if err := unix.Fchownat(dfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	if in.Valid&layer.SetMode != 0 {
		if err := fchmodat2(dfd, name, in.Mode&07777, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	if ts, ok := times(in); ok {
		if err := unix.UtimesNanoAt(dfd, name, ts[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	return nil
}

// times gives utimensat's argument for in, and whether times are set at all.
func times(in *layer.SetAttr) ([2]unix.Timespec, bool) {
	ts := [2]unix.Timespec{{Nsec: utimeOmit}, {Nsec: utimeOmit}}
	ok := false
	if in.Valid&layer.SetAtimeNow != 0 {
		ts[0], ok = unix.Timespec{Nsec: utimeNow}, true
	} else if in.Valid&layer.SetAtime != 0 {
		ts[0], ok = in.Atime, true
	}
	if in.Valid&layer.SetMtimeNow != 0 {
		ts[1], ok = unix.Timespec{Nsec: utimeNow}, true
	} else if in.Valid&layer.SetMtime != 0 {
		ts[1], ok = in.Mtime, true
	}
	return ts, ok
}

func (fs *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	d, err := fs.OpenDir(ctx, path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return layer.ReadDirAll(ctx, d, plus)
}

// processUmask is the process's umask, from /proc/thread-self/status
// (reading it with umask(2) would change it for a moment for every thread).
// The calling thread's, not /proc/self's: that is the main thread's, which
// may have become a creator thread with a umask of its own.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/thread-self/status")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Umask:"); ok {
				if n, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
					return uint32(n)
				}
			}
		}
	}
	return 0o777 // unknown: every create goes to a creator thread
}

func (fs *FS) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	flags &^= unix.O_CREAT | unix.O_EXCL
	fd, err := fs.openIn(path, flags|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	return fs.newFile(fd, flags), nil
}

// Share keeps no directory descriptors (layer.Sharer): another machine may
// rename or remake a directory, which a kept descriptor would still reach
// under its old name for up to dirCacheTTL.
func (fs *FS) Share() {
	fs.shared.Store(true)
	fs.dirs.share()
}

func (fs *FS) Create(ctx context.Context, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	var fd int
	err := fs.inDir(path, func(dfd int, name string) error {
		return fs.asCaller(ctx, dfd, name, mode, func(mode uint32) (err error) {
			fd, err = createOpen(dfd, name, flags, mode)
			return err
		})
	})
	if err != nil {
		return nil, layer.Attr{}, err
	}
	f := fs.newFile(fd, flags)
	a, err := f.Getattr(ctx)
	if err != nil {
		f.Release(ctx)
		return nil, layer.Attr{}, err
	}
	return f, a, nil
}

// createOpen opens path with O_CREAT (on a creator thread). A name that
// exists already is opened without blocking, and must be a regular file:
// the kernel sends CREATE for a name it holds as negative, which may be a
// FIFO made in the lower meanwhile, and a blocking open of it would hold
// the creator thread, which every caller's creates share, until a peer
// came; the kernel takes only a regular file as a CREATE's answer (EIO).
func createOpen(dfd int, name string, flags int, mode uint32) (int, error) {
	fd, err := openBeneath(dfd, name, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, mode)
	if err != unix.EEXIST || flags&unix.O_EXCL != 0 {
		return fd, err
	}
	fd, err = openBeneath(dfd, name, flags&^unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err == unix.ENOENT {
		// Gone again: create it after all.
		return openBeneath(dfd, name, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, mode)
	}
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, unix.EIO
	}
	if flags&unix.O_NONBLOCK == 0 {
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err == nil {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
		}
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// createAt runs a creating call in path's directory as the caller (see
// asCaller), and returns the new object's attributes.
func (fs *FS) createAt(ctx context.Context, path string, mode uint32, mk func(dfd int, name string, mode uint32) error) (a layer.Attr, err error) {
	err = fs.inDir(path, func(dfd int, name string) error {
		if err := fs.asCaller(ctx, dfd, name, mode, func(mode uint32) error { return mk(dfd, name, mode) }); err != nil {
			return err
		}
		a, err = fs.lstatAt(dfd, name)
		return err
	})
	return a, err
}

func (fs *FS) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	return fs.createAt(ctx, path, mode, func(dfd int, name string, mode uint32) error {
		return unix.Mkdirat(dfd, name, mode)
	})
}

func (fs *FS) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (layer.Attr, error) {
	return fs.createAt(ctx, path, mode, func(dfd int, name string, mode uint32) error {
		return mknodat(dfd, name, mode, rdev)
	})
}

func (fs *FS) Symlink(ctx context.Context, target, path string) (layer.Attr, error) {
	return fs.createAt(ctx, path, 0o777, func(dfd int, name string, _ uint32) error {
		return unix.Symlinkat(target, dfd, name)
	})
}

func (fs *FS) Readlink(ctx context.Context, path string) (s string, err error) {
	err = fs.inDir(path, func(dfd int, name string) error {
		buf := make([]byte, 256)
		for {
			n, err := unix.Readlinkat(dfd, name, buf)
			if err != nil {
				return err
			}
			if n < len(buf) {
				s = string(buf[:n])
				return nil
			}
			buf = make([]byte, 2*len(buf))
		}
	})
	return s, err
}

func (fs *FS) Link(ctx context.Context, oldpath, newpath string) (a layer.Attr, err error) {
	err = fs.inDir(oldpath, func(odfd int, oname string) error {
		return fs.inDir(newpath, func(ndfd int, nname string) error {
			if err := unix.Linkat(odfd, oname, ndfd, nname, 0); err != nil {
				return err
			}
			a, err = fs.lstatAt(ndfd, nname)
			return err
		})
	})
	return a, err
}

func (fs *FS) Unlink(ctx context.Context, path string) error {
	return fs.inDir(path, func(dfd int, name string) error {
		return fs.fds.removeName(dfd, name, func() error { return unix.Unlinkat(dfd, name, 0) })
	})
}

// UnlinkStat is Unlink that gives the attributes the object had
// (layer.StatUnlinker).
func (fs *FS) UnlinkStat(ctx context.Context, path string) (a layer.Attr, err error) {
	err = fs.inDir(path, func(dfd int, name string) error {
		if a, err = fs.lstatAt(dfd, name); err != nil {
			return err
		}
		return fs.fds.removeName(dfd, name, func() error { return unix.Unlinkat(dfd, name, 0) })
	})
	return a, err
}

func (fs *FS) Rmdir(ctx context.Context, path string) error {
	defer fs.dirs.invalidate(path)
	return fs.inDir(path, func(dfd int, name string) error {
		return unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
	})
}

func (fs *FS) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	// Either name may be a directory that moves or is replaced.
	defer fs.dirs.invalidate(oldpath, newpath)
	return fs.inDir(oldpath, func(odfd int, oname string) error {
		return fs.inDir(newpath, func(ndfd int, nname string) error {
			rename := func() error { return renameat2(odfd, oname, ndfd, nname, uint(flags)) }
			if flags&layer.RenameExchange != 0 {
				return rename()
			}
			// The target's name goes, perhaps its last.
			return fs.fds.removeName(ndfd, nname, rename)
		})
	})
}

// The xattr calls use the *xattrat system calls (Linux 6.13+), which work on
// dirfd/name without following a final symlink.
func (fs *FS) Getxattr(ctx context.Context, path, attr string, dest []byte) (n int, err error) {
	err = fs.inDir(path, func(dfd int, name string) error {
		n, err = getxattrat(dfd, name, attr, dest)
		return err
	})
	return n, err
}

func (fs *FS) Setxattr(ctx context.Context, path, attr string, value []byte, flags int) error {
	if attr == "system.posix_acl_default" {
		defer fs.dirs.invalidate(path) // its absence may be kept (hasDefaultACL)
	}
	return fs.inDir(path, func(dfd int, name string) error {
		return setxattrat(dfd, name, attr, value, flags)
	})
}

func (fs *FS) Listxattr(ctx context.Context, path string, dest []byte) (n int, err error) {
	err = fs.inDir(path, func(dfd int, name string) error {
		n, err = listxattrat(dfd, name, dest)
		return err
	})
	return n, err
}

func (fs *FS) Removexattr(ctx context.Context, path, attr string) error {
	if attr == "system.posix_acl_default" {
		defer fs.dirs.invalidate(path)
	}
	return fs.inDir(path, func(dfd int, name string) error {
		return removexattrat(dfd, name, attr)
	})
}

func (fs *FS) Statfs(ctx context.Context, path string) (layer.Statfs, error) {
	return statfsFd(fs.rootFd)
}

func (fs *FS) SyncDir(ctx context.Context, path string) error {
	fd, err := fs.openIn(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// errno turns a raw syscall result into an error.
func errno(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
