//go:build !linux

package local

import (
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Off Linux there is no openat2, statx, file handle, O_PATH, O_TMPFILE,
// OFD lock or renameat2: the same calls under this package's names
// (sys_linux.go) answer as the platform allows. docs/portability.md says
// what each platform keeps and loses.

// openFlags are the open(2) flags passed on from a caller.
const openFlags = unix.O_ACCMODE | unix.O_APPEND | unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC |
	unix.O_NONBLOCK | unix.O_SYNC | layer.ODsync | layer.ODirect |
	unix.O_DIRECTORY | unix.O_NOFOLLOW

// openBeneath opens path below the directory dirfd a name at a time
// (openWalk): no symlink is followed and no ".." taken, the guarantee
// openat2's RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS gives on Linux; on
// FreeBSD each openat also carries O_RESOLVE_BENEATH (beneathFlag).
func openBeneath(dirfd int, path string, flags int, mode uint32) (int, error) {
	return openWalk(dirfd, path, flags&openFlags, mode&0o7777, beneathFlag)
}

func (fs *FS) lstatAt(dirfd int, name string) (layer.Attr, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return layer.Attr{}, err
	}
	return layer.AttrFromStat(&st), nil
}

// fchmodat2: the BSDs' fchmodat takes AT_SYMLINK_NOFOLLOW (and changes a
// symlink's own mode, where Linux refuses with EOPNOTSUPP).
func fchmodat2(dfd int, name string, mode uint32, flags int) error {
	return unix.Fchmodat(dfd, name, mode, flags)
}

const (
	oPath       = 0 // directories are opened O_RDONLY instead
	atEmptyPath = 0
	fOFDGetlk   = 1
	fOFDSetlk   = 2
	fOFDSetlkw  = 3
)

// No file handles: fdCache keeps every open file's descriptor (as on
// Linux for a daemon that is not root) and layer.Finder is not offered.
type fileHandle struct{}

func nameToHandleAt(dirfd int, path string, flags int) (fileHandle, int, error) {
	return fileHandle{}, 0, syscall.ENOTSUP
}

func openByHandleAt(mountFd int, h fileHandle, flags int) (int, error) {
	return -1, syscall.ENOTSUP
}

func fdPath(fd int) string { return "/dev/fd/" + strconv.Itoa(fd) }

func (fs *FS) initFind() {}

func statFd(fd int) (layer.Attr, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return layer.Attr{}, err
	}
	return layer.AttrFromStat(&st), nil
}

func fdatasync(fd int) error { return unix.Fsync(fd) }

// copyFileRange: not in x/sys off Linux; ENOSYS makes the kernel (and
// layers) copy by reads and writes.
func copyFileRange(rfd int, roff *int64, wfd int, woff *int64, n int, flags int) (int, error) {
	return 0, syscall.ENOSYS
}

// fcntlOFD: POSIX locks on the BSDs belong to the process, so the daemon's
// would not tell its callers apart: ENOSYS, on which macFUSE and FreeBSD's
// fusefs keep byte-range locks in the kernel. flock(2) locks (LockFlock)
// belong to the open file there too, and work.
func fcntlOFD(fd, cmd int, fl *unix.Flock_t) error { return syscall.ENOSYS }

// reopenFd: no /proc/self/fd to open a file anew through.
func reopenFd(fd, flags int) (int, error) { return -1, syscall.ENOTSUP }
