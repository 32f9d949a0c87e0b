package local

import (
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openFlags are the open(2) flags openat2 accepts from a caller; the
// kernel's FUSE requests may carry internal bits that openat2 refuses.
const openFlags = unix.O_ACCMODE | unix.O_APPEND | unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC |
	unix.O_NONBLOCK | unix.O_DSYNC | unix.O_SYNC | unix.O_DIRECT | layer.ONoatime |
	unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_PATH | unix.O_LARGEFILE

// openBeneath opens path below the directory dirfd. A path longer than the
// kernel takes (PATH_MAX, which layers that lengthen names reach before their
// callers do) is opened a piece at a time, each piece beneath the last.
func openBeneath(dirfd int, path string, flags int, mode uint32) (int, error) {
	if path == "" {
		path = "."
	}
	if len(path) >= unix.PathMax {
		cut := strings.LastIndexByte(path[:unix.PathMax-1], '/')
		if cut <= 0 {
			return -1, unix.ENAMETOOLONG
		}
		dfd, err := openBeneath(dirfd, path[:cut], unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return -1, err
		}
		defer unix.Close(dfd)
		return openBeneath(dfd, path[cut+1:], flags, mode)
	}
	flags &= openFlags
	mode &= 0o7777
	for {
		fd, err := unix.Openat2(dirfd, path, &unix.OpenHow{
			Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// statxMask asks for stat's attributes and the birth time, the generation
// (layer.Attr.Gen): a file made after another's inode number was freed and
// reused gets another identity.
const statxMask = unix.STATX_BASIC_STATS | unix.STATX_BTIME

func (fs *FS) lstatAt(dirfd int, name string) (layer.Attr, error) {
	var st unix.Statx_t
	if err := unix.Statx(dirfd, name, unix.AT_SYMLINK_NOFOLLOW, statxMask, &st); err != nil {
		return layer.Attr{}, err
	}
	return layer.AttrFromStatx(&st), nil
}

// fchmodat2 is fchmodat with flags (Linux 6.6+), which can refuse to follow
// a symlink; chmod of a symlink itself gives EOPNOTSUPP, as on any Linux.
func fchmodat2(dfd int, name string, mode uint32, flags int) error {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	_, _, e := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(dfd), uintptr(unsafe.Pointer(p)), uintptr(mode), uintptr(flags), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// The Linux calls that other platforms lack or spell otherwise, under
// names of this package (sys_other.go has the others' answers).

const (
	oPath       = unix.O_PATH
	atEmptyPath = unix.AT_EMPTY_PATH
	utimeOmit   = unix.UTIME_OMIT
	utimeNow    = unix.UTIME_NOW
	fOFDGetlk   = unix.F_OFD_GETLK
	fOFDSetlk   = unix.F_OFD_SETLK
	fOFDSetlkw  = unix.F_OFD_SETLKW
)

type fileHandle = unix.FileHandle

func nameToHandleAt(dirfd int, path string, flags int) (fileHandle, int, error) {
	return unix.NameToHandleAt(dirfd, path, flags)
}

func openByHandleAt(mountFd int, h fileHandle, flags int) (int, error) {
	return unix.OpenByHandleAt(mountFd, h, flags)
}

// fdPath names the object descriptor fd is open on (/proc/self/fd/N).
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// statFd gives the attributes of the file open on fd.
func statFd(fd int) (layer.Attr, error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, statxMask, &st); err != nil {
		return layer.Attr{}, err
	}
	return layer.AttrFromStatx(&st), nil
}

// utimensFd is futimens(2).
func utimensFd(fd int, ts [2]unix.Timespec) error {
	return unix.UtimesNanoAt(fd, "", ts[:], unix.AT_EMPTY_PATH)
}

func fdatasync(fd int) error { return unix.Fdatasync(fd) }

func fallocate(fd int, mode uint32, off, length int64) error {
	return unix.Fallocate(fd, mode, off, length)
}

func copyFileRange(rfd int, roff *int64, wfd int, woff *int64, n int, flags int) (int, error) {
	return unix.CopyFileRange(rfd, roff, wfd, woff, n, flags)
}

// fcntlOFD takes, drops or tests an open file description lock.
func fcntlOFD(fd, cmd int, fl *unix.Flock_t) error { return unix.FcntlFlock(uintptr(fd), cmd, fl) }

// reopenFd opens the object fd is open on again, with flags, whether or not
// it still has a name.
func reopenFd(fd, flags int) (int, error) {
	return unix.Open("/proc/self/fd/"+strconv.Itoa(fd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
}

func mknodat(dfd int, name string, mode uint32, rdev uint64) error {
	return unix.Mknodat(dfd, name, mode, int(rdev))
}

func renameat2(odfd int, oname string, ndfd int, nname string, flags uint) error {
	return unix.Renameat2(odfd, oname, ndfd, nname, flags)
}

func statfsFd(fd int) (layer.Statfs, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return layer.Statfs{}, err
	}
	return layer.Statfs{
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree,
		Bsize: uint32(st.Bsize), Frsize: uint32(st.Frsize), NameLen: uint32(st.Namelen),
	}, nil
}
