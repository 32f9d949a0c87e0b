package local

import (
	"context"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// withFlagsFd runs fn with a descriptor of path on which the inode flags
// ioctls work: a regular file or directory opened for reading (ENOTTY for
// anything else, which is not opened: a device's open may act).
func (fs *FS) withFlagsFd(path string, fn func(fd int) error) error {
	pfd, err := fs.openIn(path, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
		return unix.ENOTTY
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(fd)
}

// GetFlags is FS_IOC_GETFLAGS on the lower file.
func (fs *FS) GetFlags(ctx context.Context, path string) (fl uint32, err error) {
	err = fs.withFlagsFd(path, func(fd int) error {
		var v uint32
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.FS_IOC_GETFLAGS, uintptr(unsafe.Pointer(&v)))
		fl = v
		return errno(e)
	})
	return fl, err
}

// SetFlags is FS_IOC_SETFLAGS on the lower file: from then on the lower
// enforces immutable and append-only for every open through the stack.
func (fs *FS) SetFlags(ctx context.Context, path string, flags uint32) error {
	return fs.withFlagsFd(path, func(fd int) error {
		v := flags
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.FS_IOC_SETFLAGS, uintptr(unsafe.Pointer(&v)))
		return errno(e)
	})
}
