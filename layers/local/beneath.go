package local

import (
	"strings"

	"golang.org/x/sys/unix"
)

// openWalk opens path below the directory dirfd a name at a time, without
// openat2: each directory on the way with openat(O_DIRECTORY|O_NOFOLLOW)
// in the last, the final name with O_NOFOLLOW, so that a symbolic link
// anywhere on the path fails (ELOOP or ENOTDIR, as RESOLVE_NO_SYMLINKS
// does) and a ".." or an absolute path is refused (EXDEV, as
// RESOLVE_BENEATH answers an escape): nothing in the directory, even one
// changing under us, leads outside it. extra is added to every openat
// (FreeBSD's O_RESOLVE_BENEATH, a second guard). It is openBeneath off
// Linux (sys_other.go); on Linux only its test uses it.
func openWalk(dirfd int, path string, flags int, mode uint32, extra int) (int, error) {
	if path == "" {
		path = "."
	}
	if path[0] == '/' {
		return -1, unix.EXDEV
	}
	dir := dirfd
	done := func() {
		if dir != dirfd {
			unix.Close(dir)
		}
	}
	defer done()
	for {
		name, rest, more := strings.Cut(path, "/")
		if name == ".." {
			return -1, unix.EXDEV
		}
		if !more {
			return openatRetry(dir, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC|extra, mode)
		}
		path = rest
		if name == "" || name == "." {
			continue
		}
		fd, err := openatRetry(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|extra, 0)
		if err != nil {
			return -1, err
		}
		done()
		dir = fd
	}
}

// openatRetry is openat, again after EINTR. FreeBSD answers O_NOFOLLOW on
// a symbolic link with EMLINK, which no open gives otherwise: ELOOP, as
// Linux and macOS say.
func openatRetry(dirfd int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags, mode)
		if err == unix.EMLINK && flags&unix.O_NOFOLLOW != 0 {
			err = unix.ELOOP
		}
		if err != unix.EINTR {
			return fd, err
		}
	}
}
