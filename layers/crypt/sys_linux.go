package crypt

import "golang.org/x/sys/unix"

// protectProcess makes the process non-dumpable.
func protectProcess() {
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}

// adviseNoDump keeps b out of core dumps.
func adviseNoDump(b []byte) { unix.Madvise(b, unix.MADV_DONTDUMP) }

// adviseSequential tells the kernel that fd is read from start to end.
func adviseSequential(fd int) { unix.Fadvise(fd, 0, 0, unix.FADV_SEQUENTIAL) }
