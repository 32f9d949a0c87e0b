package fusefs

import (
	"context"
	"syscall"

	"cairnfs.dev/cairn/third_party/gofuse/fs"
	"cairnfs.dev/cairn/third_party/gofuse/fuse"
	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// statx(2). The kernel answers a statx that asks only for the basic fields
// as a stat, from its cache or with FUSE_GETATTR (Getattr), so that path
// stays as it is. It sends FUSE_STATX when a caller asks for more (the birth
// time: stat(1), xfstests' stat_test) and its cache is stale, and keeps the
// birth time of the reply. The reply also carries the file attributes
// (stx_attributes: the inode flags chattr sets, from layer.FS.GetFlags,
// one more layer call, made only then); Linux 6.18 drops them (it copies
// neither stx_attributes nor stx_attributes_mask of the reply: the patch
// "fuse: implement file attributes mask for statx", August 2025, is not in
// it), so a statx through any FUSE mount shows none there.

// statxAttrOf pairs each STATX_ATTR_* that an inode flag gives with that
// flag (FS_*_FL), as the kernel's file systems map them.
var statxAttrOf = [][2]uint64{
	{unix.STATX_ATTR_COMPRESSED, 0x4},    // FS_COMPR_FL
	{unix.STATX_ATTR_IMMUTABLE, 0x10},    // FS_IMMUTABLE_FL
	{unix.STATX_ATTR_APPEND, 0x20},       // FS_APPEND_FL
	{unix.STATX_ATTR_NODUMP, 0x40},       // FS_NODUMP_FL
	{unix.STATX_ATTR_ENCRYPTED, 0x800},   // FS_ENCRYPT_FL
	{unix.STATX_ATTR_VERITY, 0x00100000}, // FS_VERITY_FL
}

// statxAttrsMask are the attributes a stack that serves inode flags
// supports (stx_attributes_mask): those chattr can set through the mount,
// as ext4 says.
const statxAttrsMask = unix.STATX_ATTR_COMPRESSED | unix.STATX_ATTR_IMMUTABLE |
	unix.STATX_ATTR_APPEND | unix.STATX_ATTR_NODUMP

var _ fs.NodeStatxer = (*node)(nil)

// Statx is Getattr with the birth time where the stack has one, and the
// file attributes from the object's inode flags (none, and an empty mask,
// where the stack or the object has no flags: a symlink, a device node, a
// removed file).
func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	a, errno := n.getattr(ctx, f)
	if errno != 0 {
		return errno
	}
	sxTime := func(t layer.Time) fuse.SxTime { return fuse.SxTime{Sec: uint64(t.Sec), Nsec: uint32(t.Nsec)} }
	out.Mask = unix.STATX_BASIC_STATS
	out.Blksize = a.Blksize
	out.Nlink = a.Nlink
	out.Uid, out.Gid = a.Uid, a.Gid
	out.Mode = uint16(a.Mode)
	out.Ino = n.StableAttr().Ino
	out.Size = a.Size
	out.Blocks = a.Blocks
	out.Atime, out.Mtime, out.Ctime = sxTime(a.Atime), sxTime(a.Mtime), sxTime(a.Ctime)
	out.RdevMajor, out.RdevMinor = unix.Major(a.Rdev), unix.Minor(a.Rdev)
	if a.Btime != (layer.Time{}) {
		out.Mask |= unix.STATX_BTIME
		out.Btime = sxTime(a.Btime)
	}
	if t := a.Mode & syscall.S_IFMT; t != syscall.S_IFREG && t != syscall.S_IFDIR {
		return 0
	}
	p, ok := n.path()
	if !ok {
		return 0
	}
	fl, err := n.st.top.GetFlags(callerCtx(ctx), p)
	if err != nil {
		return 0 // no flags here (ENOTTY, EOPNOTSUPP, ENOSYS) or none to read now: no attributes
	}
	out.AttributesMask = statxAttrsMask
	for _, m := range statxAttrOf {
		if uint64(fl)&m[1] != 0 {
			out.Attributes |= m[0]
			out.AttributesMask |= m[0]
		}
	}
	return 0
}
