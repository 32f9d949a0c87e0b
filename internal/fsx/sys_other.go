//go:build !linux

package fsx

import (
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	renameNoreplace = 1
	renameExchange  = 2
)

func punchHole(fd int, off, n int64) error { return syscall.EOPNOTSUPP }

func renameat2(from, to string, flags uint) error {
	if flags != 0 {
		return syscall.EINVAL
	}
	return unix.Rename(from, to)
}
