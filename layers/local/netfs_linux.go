package local

import "golang.org/x/sys/unix"

// networked reports whether the directory fd is on a file system that
// other machines or processes share as a rule (network and cluster file
// systems, and FUSE, under which GlusterFS, sshfs and the like are): its
// contents change behind the layer's back.
func networked(fd int) bool {
	var s unix.Statfs_t
	if unix.Fstatfs(fd, &s) != nil {
		return true // unknown: the safe answer
	}
	switch uint32(s.Type) {
	case unix.NFS_SUPER_MAGIC, unix.SMB_SUPER_MAGIC, 0xff534d42 /* CIFS */, 0xfe534d42, /* SMB2 */
		unix.CEPH_SUPER_MAGIC, unix.FUSE_SUPER_MAGIC, unix.V9FS_MAGIC, unix.AFS_SUPER_MAGIC,
		unix.AFS_FS_MAGIC, unix.CODA_SUPER_MAGIC, unix.NCP_SUPER_MAGIC, 0x7461636f /* OCFS2 */, 0x01161970, /* GFS2 */
		0x0bd00bd0 /* Lustre */, 0x47504653 /* GPFS */ :
		return true
	}
	return false
}
