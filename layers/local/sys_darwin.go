package local

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

const beneathFlag = 0 // macOS 15's O_RESOLVE_BENEATH is not in x/sys: openWalk alone

// <sys/stat.h>'s, which x/sys leaves out for macOS.
const (
	utimeNow  = -1
	utimeOmit = -2
)

// utimensFd: macOS's futimens is libc's only; futimes takes microseconds,
// and the omitted times are the file's own.
func utimensFd(fd int, ts [2]unix.Timespec) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	now := unix.NsecToTimespec(time.Now().UnixNano())
	cur := [2]unix.Timespec{st.Atim, st.Mtim}
	var tv [2]unix.Timeval
	for i, t := range ts {
		switch t.Nsec {
		case utimeOmit:
			t = cur[i]
		case utimeNow:
			t = now
		}
		tv[i] = unix.NsecToTimeval(unix.TimespecToNsec(t))
	}
	return unix.Futimes(fd, tv[:])
}

func fallocate(fd int, mode uint32, off, length int64) error { return syscall.EOPNOTSUPP }

// mknodat: macOS has no mknodat; devices and FIFOs are not made.
func mknodat(dfd int, name string, mode uint32, rdev uint64) error { return syscall.EOPNOTSUPP }

// renameat2: renameatx_np's RENAME_EXCL and RENAME_SWAP are RENAME_NOREPLACE
// and RENAME_EXCHANGE; there is no whiteout.
func renameat2(odfd int, oname string, ndfd int, nname string, flags uint) error {
	if flags == 0 {
		return unix.Renameat(odfd, oname, ndfd, nname)
	}
	var x uint32
	if flags&layer.RenameNoreplace != 0 {
		x |= unix.RENAME_EXCL
	}
	if flags&layer.RenameExchange != 0 {
		x |= unix.RENAME_SWAP
	}
	if flags&^(layer.RenameNoreplace|layer.RenameExchange) != 0 {
		return syscall.EINVAL
	}
	return unix.RenameatxNp(odfd, oname, ndfd, nname, x)
}

func statfsFd(fd int) (layer.Statfs, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return layer.Statfs{}, err
	}
	return layer.Statfs{
		Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
		Files: st.Files, Ffree: st.Ffree,
		Bsize: uint32(st.Iosize), Frsize: st.Bsize, NameLen: 255,
	}, nil
}

// xattrFlags: macOS's XATTR_CREATE and XATTR_REPLACE have other values.
func xattrFlags(fd int, attr string, flags int) (int, error) {
	x := 0
	if flags&layer.XattrCreate != 0 {
		x |= unix.XATTR_CREATE
	}
	if flags&layer.XattrReplace != 0 {
		x |= unix.XATTR_REPLACE
	}
	return x, nil
}
