//go:build !linux

package local

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// The *xattrat calls off Linux: through a descriptor of dfd/path, a
// regular file or directory opened without following a symlink (Linux
// refuses user attributes on the other types too: EPERM); the BSDs' fd
// calls (x/sys maps "user." to FreeBSD's user namespace).
func withXattrFd(dfd int, path string, fn func(fd int) error) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, path, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
		return syscall.EPERM
	}
	fd, err := openatRetry(dfd, path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|beneathFlag, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(fd)
}

func getxattrat(dfd int, path, attr string, dest []byte) (n int, err error) {
	err = withXattrFd(dfd, path, func(fd int) (err error) {
		n, err = unix.Fgetxattr(fd, attr, dest)
		return err
	})
	return n, err
}

func setxattrat(dfd int, path, attr string, value []byte, flags int) error {
	return withXattrFd(dfd, path, func(fd int) error {
		x, err := xattrFlags(fd, attr, flags)
		if err != nil {
			return err
		}
		return unix.Fsetxattr(fd, attr, value, x)
	})
}

func listxattrat(dfd int, path string, dest []byte) (n int, err error) {
	err = withXattrFd(dfd, path, func(fd int) (err error) {
		n, err = unix.Flistxattr(fd, dest)
		return err
	})
	return n, err
}

func removexattrat(dfd int, path, attr string) error {
	return withXattrFd(dfd, path, func(fd int) error { return unix.Fremovexattr(fd, attr) })
}
