package fusefs

import (
	"os"
	"syscall"

	"cairnfs.dev/cairn/third_party/gofuse/fuse"
	"golang.org/x/sys/unix"
)

// What the Linux kernel's FUSE offers and the BSDs' do not, under names of
// this package (sys_other.go has the other platforms' answers;
// docs/portability.md says what each platform keeps).

// mount(2)'s flags, which ParseMountFlags gives and go-fuse passes to
// mount(2) itself (DirectMountFlags).
const (
	msRdonly      = syscall.MS_RDONLY
	msNodev       = syscall.MS_NODEV
	msNosuid      = syscall.MS_NOSUID
	msNoexec      = syscall.MS_NOEXEC
	msSynchronous = syscall.MS_SYNCHRONOUS
	msDirsync     = syscall.MS_DIRSYNC
	msNoatime     = syscall.MS_NOATIME
	msNodiratime  = syscall.MS_NODIRATIME
	msRelatime    = syscall.MS_RELATIME
	msStrictatime = syscall.MS_STRICTATIME
	msLazytime    = unix.MS_LAZYTIME
	msSilent      = syscall.MS_SILENT
)

// directMountFlags: go-fuse mounts with mount(2) and the flags above (as
// root); elsewhere the options go as words to the mount helper.
const directMountFlags = true

// extraCaps are the capabilities Mount asks of the kernel (see Mount).
const extraCaps = fuse.CAP_HANDLE_KILLPRIV_V2 | fuse.CAP_DONT_MASK | fuse.CAP_SETXATTR_EXT

// setxattrFlags are SETXATTR's extended flags (CAP_SETXATTR_EXT).
func setxattrFlags(in *fuse.SetXAttrIn) uint32 { return in.SetXAttrFlags }

const setxattrACLKillSGID = fuse.SETXATTR_ACL_KILL_SGID

// kernelPassthrough: the kernel takes backing files (Linux 6.9+; whether
// this one does, the first registration says).
const kernelPassthrough = true

func registerBackingFd(srv *fuse.Server, fd int) (int32, syscall.Errno) {
	return srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
}

func unregisterBackingFd(srv *fuse.Server, id int32) syscall.Errno {
	return srv.UnregisterBackingFd(id)
}

// Unmount unmounts mountpoint, lazily if it is busy and lazy is set.
func Unmount(mountpoint string, lazy bool) error {
	flags := 0
	if lazy {
		flags = syscall.MNT_DETACH
	}
	err := syscall.Unmount(mountpoint, flags)
	if err == syscall.EPERM && os.Geteuid() != 0 {
		args := []string{"-u", mountpoint}
		if lazy {
			args = []string{"-u", "-z", mountpoint}
		}
		return runFusermount(args)
	}
	return err
}

// oTmpfile is open(2)'s O_TMPFILE (Linux only: FUSE_TMPFILE never comes elsewhere).
const oTmpfile = unix.O_TMPFILE
