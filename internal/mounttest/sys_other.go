//go:build !linux

package mounttest

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Off Linux (sys_linux.go): a forced unmount for a lazy one, and no memfd
// or tmpfs mount.
const mntDetach = unix.MNT_FORCE

func memfd(name string) (int, error) { return -1, syscall.ENOTSUP }

func mountTmpfs(dir string, flags uintptr, size string) error { return syscall.ENOTSUP }
