package local

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// struct xattr_args of the *xattrat system calls.
type xattrArgs struct {
	value uint64
	size  uint32
	flags uint32
}

func bufPtr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&b[0]))
}

func getxattrat(dfd int, path, attr string, dest []byte) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return 0, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return 0, err
	}
	args := xattrArgs{value: uint64(bufPtr(dest)), size: uint32(len(dest))}
	n, _, e := unix.Syscall6(unix.SYS_GETXATTRAT, uintptr(dfd), uintptr(unsafe.Pointer(p)),
		unix.AT_SYMLINK_NOFOLLOW, uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	return int(n), errno(e)
}

func setxattrat(dfd int, path, attr string, value []byte, flags int) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return err
	}
	args := xattrArgs{value: uint64(bufPtr(value)), size: uint32(len(value)), flags: uint32(flags)}
	_, _, e := unix.Syscall6(unix.SYS_SETXATTRAT, uintptr(dfd), uintptr(unsafe.Pointer(p)),
		unix.AT_SYMLINK_NOFOLLOW, uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	return errno(e)
}

func listxattrat(dfd int, path string, dest []byte) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return 0, err
	}
	n, _, e := unix.Syscall6(unix.SYS_LISTXATTRAT, uintptr(dfd), uintptr(unsafe.Pointer(p)),
		unix.AT_SYMLINK_NOFOLLOW, bufPtr(dest), uintptr(len(dest)), 0)
	return int(n), errno(e)
}

func removexattrat(dfd int, path, attr string) error {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return err
	}
	_, _, e := unix.Syscall6(unix.SYS_REMOVEXATTRAT, uintptr(dfd), uintptr(unsafe.Pointer(p)),
		unix.AT_SYMLINK_NOFOLLOW, uintptr(unsafe.Pointer(a)), 0, 0)
	return errno(e)
}
