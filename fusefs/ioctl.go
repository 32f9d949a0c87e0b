package fusefs

import (
	"context"
	"encoding/binary"
	"syscall"

	"cairnfs.dev/cairn/third_party/gofuse/fs"
)

// The inode flags ioctls (chattr, lsattr; xfs_io chattr). The kernel handles
// them in the VFS (fileattr_get/set), checks ownership and
// CAP_LINUX_IMMUTABLE there, and sends FUSE_IOCTL on a handle it opens for
// the purpose (fuse_priv_ioctl), of a regular file or a directory, with
// FS_IOC_GETFLAGS/SETFLAGS or, for the fsxattr form,
// FS_IOC_FSGETXATTR/FSSETXATTR. Every other ioctl gets ENOTTY.
const (
	iocGetFlags    = 0x80086601 // FS_IOC_GETFLAGS
	iocSetFlags    = 0x40086602 // FS_IOC_SETFLAGS
	iocGetFlags32  = 0x80046601 // FS_IOC32_GETFLAGS
	iocSetFlags32  = 0x40046602 // FS_IOC32_SETFLAGS
	iocFsGetXattr  = 0x801c581f // FS_IOC_FSGETXATTR
	iocFsSetXattr  = 0x401c5820 // FS_IOC_FSSETXATTR
	fsxattrSize    = 28         // struct fsxattr
	flagsSize      = 4
	xflagsCommonFL = 0x10 | 0x20 | 0x08 | 0x80 | 0x40 | 0x02000000 | 0x20000000
	xflagsCommonX  = 0x08 | 0x10 | 0x20 | 0x40 | 0x80 | 0x8000 | 0x200
)

// xflagOf pairs each FS_XFLAG_* of the fsxattr form with its FS_*_FL, as
// the kernel's fileattr_fill_flags and fileattr_fill_xflags do.
var xflagOf = [][2]uint32{
	{0x08, 0x10},         // IMMUTABLE
	{0x10, 0x20},         // APPEND
	{0x20, 0x08},         // SYNC
	{0x40, 0x80},         // NOATIME
	{0x80, 0x40},         // NODUMP
	{0x8000, 0x02000000}, // DAX
	{0x200, 0x20000000},  // PROJINHERIT
}

var _ fs.NodeIoctler = (*node)(nil)

func (n *node) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	switch cmd {
	case iocGetFlags, iocSetFlags, iocGetFlags32, iocSetFlags32, iocFsGetXattr, iocFsSetXattr:
	default:
		return 0, syscall.ENOTTY
	}
	p, ok := n.path()
	if !ok {
		return 0, syscall.ENOENT
	}
	cctx := callerCtx(ctx)
	ne := binary.NativeEndian
	switch cmd {
	case iocGetFlags, iocGetFlags32, iocFsGetXattr:
		fl, err := n.st.top.GetFlags(cctx, p)
		if err != nil {
			return 0, n.st.errno("getflags", p, err)
		}
		if cmd != iocFsGetXattr {
			if len(output) < flagsSize {
				return 0, syscall.EINVAL
			}
			ne.PutUint32(output, fl)
			return 0, 0
		}
		if len(output) < fsxattrSize {
			return 0, syscall.EINVAL
		}
		clear(output[:fsxattrSize])
		var x uint32
		for _, m := range xflagOf {
			if fl&m[1] != 0 {
				x |= m[0]
			}
		}
		ne.PutUint32(output, x) // extent sizes, extents, project: none
		return 0, 0
	}
	var fl uint32
	if cmd != iocFsSetXattr {
		if len(input) < flagsSize {
			return 0, syscall.EINVAL
		}
		fl = ne.Uint32(input)
	} else {
		if len(input) < fsxattrSize {
			return 0, syscall.EINVAL
		}
		// As ext4 does: the flags without an FS_*_FL twin and the extent
		// size hints are ignored, a project id is refused (no project
		// quotas).
		x := ne.Uint32(input)
		if projid := ne.Uint32(input[12:]); projid != 0 {
			return 0, syscall.EOPNOTSUPP
		}
		cur, err := n.st.top.GetFlags(cctx, p)
		if err != nil {
			return 0, n.st.errno("getflags", p, err)
		}
		fl = cur &^ xflagsCommonFL
		for _, m := range xflagOf {
			if x&m[0] != 0 {
				fl |= m[1]
			}
		}
		if fl == cur {
			return 0, 0
		}
	}
	if err := n.st.top.SetFlags(cctx, p, fl); err != nil {
		return 0, n.st.errno("setflags", p, err)
	}
	// The lower changed the ctime: the kernel's cached attributes are stale.
	n.NotifyContent(-1, 0)
	return 0, 0
}
