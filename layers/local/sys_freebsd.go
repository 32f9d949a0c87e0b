package local

import (
	"errors"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// beneathFlag: FreeBSD 13's O_RESOLVE_BENEATH on every openat of openWalk,
// a second guard that no lookup leaves the directory.
const beneathFlag = unix.O_RESOLVE_BENEATH

const (
	utimeNow  = unix.UTIME_NOW
	utimeOmit = unix.UTIME_OMIT
)

func utimensFd(fd int, ts [2]unix.Timespec) error {
	_, _, e := unix.Syscall(unix.SYS_FUTIMENS, uintptr(fd), uintptr(unsafe.Pointer(&ts[0])), 0)
	return errno(e)
}

// fallocate: posix_fallocate for mode 0 (which returns its error as its
// value); punching holes and keeping the size are not offered.
func fallocate(fd int, mode uint32, off, length int64) error {
	if mode != 0 {
		return syscall.EOPNOTSUPP
	}
	r, _, e := unix.Syscall(unix.SYS_POSIX_FALLOCATE, uintptr(fd), uintptr(off), uintptr(length))
	if e != 0 {
		return e
	}
	return errno(syscall.Errno(r))
}

func mknodat(dfd int, name string, mode uint32, rdev uint64) error {
	return unix.Mknodat(dfd, name, mode, rdev)
}

// renameat2: FreeBSD's renameat has no flags: EINVAL for any, as Linux
// answers for a file system without them.
func renameat2(odfd int, oname string, ndfd int, nname string, flags uint) error {
	if flags != 0 {
		return syscall.EINVAL
	}
	return unix.Renameat(odfd, oname, ndfd, nname)
}

func statfsFd(fd int) (layer.Statfs, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return layer.Statfs{}, err
	}
	return layer.Statfs{
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: uint64(max(st.Bavail, 0)),
		Files: st.Files, Ffree: uint64(max(st.Ffree, 0)),
		Bsize: uint32(st.Iosize), Frsize: uint32(st.Bsize), NameLen: st.Namemax,
	}, nil
}

// xattrFlags: FreeBSD's extattr calls take no flags: create and replace
// are checked first (not atomically).
func xattrFlags(fd int, attr string, flags int) (int, error) {
	if flags&(layer.XattrCreate|layer.XattrReplace) == 0 {
		return 0, nil
	}
	_, err := unix.Fgetxattr(fd, attr, nil)
	switch {
	case err == nil && flags&layer.XattrCreate != 0:
		return 0, syscall.EEXIST
	case errors.Is(err, layer.ENOATTR) && flags&layer.XattrReplace != 0:
		return 0, layer.ENOATTR
	}
	return 0, nil
}
