//go:build !linux

package fusefs

import (
	"os"
	"os/exec"
	"syscall"

	"cairnfs.dev/cairn/third_party/gofuse/fuse"
	"golang.org/x/sys/unix"
)

// The BSDs' FUSE (macFUSE on macOS, fusefs on FreeBSD): what Linux's offers
// and they do not is off here (sys_linux.go; docs/portability.md).

// ParseMountFlags' flags: Linux's mount(2) values, as cairn's own bits here;
// they reach the mount helper (mount_macfuse, mount_fusefs) as the words
// they were given (directMountFlags).
const (
	msRdonly      = 0x1
	msNosuid      = 0x2
	msNodev       = 0x4
	msNoexec      = 0x8
	msSynchronous = 0x10
	msDirsync     = 0x80
	msNoatime     = 0x400
	msNodiratime  = 0x800
	msSilent      = 0x8000
	msRelatime    = 0x200000
	msStrictatime = 0x1000000
	msLazytime    = 0x2000000
)

const directMountFlags = false

// extraCaps: CAP_HANDLE_KILLPRIV_V2 and CAP_SETXATTR_EXT are Linux's (go-fuse
// has neither on macOS; FreeBSD's fusefs offers neither).
const extraCaps = fuse.CAP_DONT_MASK

// setxattrFlags: no extended SETXATTR flags here.
func setxattrFlags(in *fuse.SetXAttrIn) uint32 { return 0 }

const setxattrACLKillSGID = 1

// kernelPassthrough: no FUSE passthrough in macFUSE or fusefs: every file is
// served by the daemon.
const kernelPassthrough = false

func registerBackingFd(srv *fuse.Server, fd int) (int32, syscall.Errno) { return 0, syscall.ENOSYS }

func unregisterBackingFd(srv *fuse.Server, id int32) syscall.Errno { return syscall.ENOSYS }

// Unmount unmounts mountpoint; lazy forces it (MNT_FORCE: the BSDs have no
// lazy detach). A user who may not unmount with unmount(2) runs umount(8),
// which macOS lets the mount's owner use.
func Unmount(mountpoint string, lazy bool) error {
	flags := 0
	if lazy {
		flags = unix.MNT_FORCE
	}
	err := unix.Unmount(mountpoint, flags)
	if err == syscall.EPERM && os.Geteuid() != 0 {
		return exec.Command("umount", mountpoint).Run()
	}
	return err
}

// oTmpfile is open(2)'s O_TMPFILE (Linux only: FUSE_TMPFILE never comes elsewhere).
const oTmpfile = 0
