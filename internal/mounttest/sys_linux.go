package mounttest

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// Linux's calls under this package's names; the tests that mount run on
// Linux only, and sys_other.go lets the package build elsewhere.

const mntDetach = syscall.MNT_DETACH

func memfd(name string) (int, error) { return unix.MemfdCreate(name, 0) }

func mountTmpfs(dir string, flags uintptr, size string) error {
	return syscall.Mount("cairn-test", dir, "tmpfs", flags, "size="+size+",mode=0755")
}
