package local

import (
	"fmt"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

var _ layer.AtimeSetter = (*FS)(nil)

// SetAtime makes every access through the layer change atimes as a says,
// as the lower file system does for a mount with those options: the kernel
// decides, from the flags of the mount a descriptor was opened through. So
// when the directory's own mount says otherwise, the layer reaches the
// directory through a private bind mount of it with a's options
// (open_tree(OPEN_TREE_CLONE) and mount_setattr: a mount attached nowhere,
// that no one else sees and that goes with the last descriptor opened
// through it). Every descriptor the layer opens from then on is on it: the
// files it reads and lists, and the ones it hands to the kernel for
// passthrough, whose reads and mappings the kernel makes through the same
// mount. Making such a mount takes CAP_SYS_ADMIN (root); without it,
// SetAtime fails unless the directory's mount already behaves as a says.
//
// The bind mount takes the mounts inside the directory with it, as they are
// when SetAtime runs. It is called before the layer serves anything.
func (fs *FS) SetAtime(a layer.Atime) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fs.rootFd, &st); err != nil {
		return fmt.Errorf("local: %s: %w", fs.root, err)
	}
	if a.Mode == layer.NoAtime {
		a.NoDir = true // the same thing
	}
	if atimeOf(st.Flags) == a {
		return nil
	}
	fd := fs.rootFd
	if !fs.private {
		var err error
		fd, err = unix.OpenTree(fs.rootFd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("local: %s is mounted %s; reading it %s takes a private bind mount of it, which needs CAP_SYS_ADMIN (root): %w",
				fs.root, atimeOf(st.Flags), a, err)
		}
	}
	attr := unix.MountAttr{Attr_clr: unix.MOUNT_ATTR__ATIME | unix.MOUNT_ATTR_NODIRATIME}
	switch a.Mode {
	case layer.NoAtime:
		attr.Attr_set = unix.MOUNT_ATTR_NOATIME
	case layer.StrictAtime:
		attr.Attr_set = unix.MOUNT_ATTR_STRICTATIME
	default:
		attr.Attr_set = unix.MOUNT_ATTR_RELATIME
	}
	if a.NoDir {
		attr.Attr_set |= unix.MOUNT_ATTR_NODIRATIME
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		if fd != fs.rootFd {
			unix.Close(fd)
		}
		return fmt.Errorf("local: setting %s on a private bind mount of %s: %w", a, fs.root, err)
	}
	if fd != fs.rootFd {
		// Descriptors opened so far stay on the directory's own mount;
		// the cached directories are dropped so that every later open
		// starts from the new root.
		old := fs.rootFd
		fs.rootFd, fs.private = fd, true
		fs.dirs.invalidate("")
		fs.fds.addMount(fd)
		unix.Close(old)
		// Find opens objects on the root's mount, and takes their names
		// relative to it: the new one's.
		fs.fds.mu.Lock()
		fs.fds.inoDevs = nil
		fs.fds.mu.Unlock()
		fs.initFind()
	}
	return nil
}

// atimeOf reads the atime options of a mount from statfs's flags.
func atimeOf(flags int64) layer.Atime {
	a := layer.Atime{Mode: layer.StrictAtime, NoDir: flags&unix.ST_NODIRATIME != 0}
	switch {
	case flags&unix.ST_NOATIME != 0:
		a.Mode, a.NoDir = layer.NoAtime, true
	case flags&unix.ST_RELATIME != 0:
		a.Mode = layer.Relatime
	}
	return a
}
