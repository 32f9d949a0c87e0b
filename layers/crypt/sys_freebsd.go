package crypt

import "golang.org/x/sys/unix"

// adviseNoDump keeps b out of core dumps (MADV_NOCORE).
func adviseNoDump(b []byte) { unix.Madvise(b, unix.MADV_NOCORE) }

// adviseSequential tells the kernel that fd is read from start to end.
func adviseSequential(fd int) { unix.Fadvise(fd, 0, 0, unix.FADV_SEQUENTIAL) }
