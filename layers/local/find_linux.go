package local

import (
	"context"
	"encoding/binary"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Finding objects by identity (layer.Finder), for file handles of a mount.
//
// The lower's own file handles (name_to_handle_at) reach an object wherever it
// has moved; open_by_handle_at gives a descriptor of it, whose name the kernel
// shows in /proc/self/fd, and that name, beneath the root, is the path. Where
// the lower opens an object from its inode number alone (ext2/3/4: a handle
// of the inode number and generation, generation 0 taking any), the
// identity is the handle and nothing needs keeping, even across remounts of
// the stack; elsewhere (tmpfs, xfs, btrfs) Handle gives the lower's handle,
// with the mount it is on, for the caller to keep.
//
// The kernel knows the name of a directory it opens by handle (it connects it
// to the root), and of any object whose name it still has cached; a file
// opened by handle after the lower's caches were dropped has no name, and
// Find answers ESTALE (the frontend then looks in the file's last known
// directory).

// fileidIno32Gen is FILEID_INO32_GEN, the handle type of ext2/3/4: a 32-bit
// inode number and a 32-bit generation, which takes any generation when 0.
const fileidIno32Gen = 1

// byIno reports the mount descriptor of device dev when its objects open from
// their inode numbers alone (see inoAddressable); fds.mu held.
func (c *fdCache) byIno(dev uint64) (int, bool) {
	m, ok := c.inoDevs[dev]
	return m, ok && m >= 0
}

// inoAddressable finds out, once per device, whether objects of a's device
// open from their inode number alone: h is the lower's handle of the object
// with attributes a, on the mount with descriptor m (fds.mu held).
func (c *fdCache) inoAddressable(h unix.FileHandle, a *layer.Attr, m int) bool {
	if r, ok := c.inoDevs[a.Dev]; ok {
		return r >= 0
	}
	if c.inoDevs == nil {
		c.inoDevs = map[uint64]int{}
	}
	c.inoDevs[a.Dev] = -1
	b := h.Bytes()
	if h.Type() != fileidIno32Gen || len(b) != 8 || a.Ino > 1<<32-1 || binary.NativeEndian.Uint32(b) != uint32(a.Ino) {
		return false
	}
	fd, err := unix.OpenByHandleAt(m, inoHandle(a.Ino), unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Ino != a.Ino || st.Dev != a.Dev {
		return false
	}
	c.inoDevs[a.Dev] = m
	return true
}

// inoHandle is the handle of inode number ino on a lower of type
// fileidIno32Gen, with generation 0 (any).
func inoHandle(ino uint64) unix.FileHandle {
	b := make([]byte, 8)
	binary.NativeEndian.PutUint32(b, uint32(ino))
	return unix.NewFileHandle(fileidIno32Gen, b)
}

// initFind learns whether the root's device opens objects by inode number,
// so that handles of it work in a new process (after a remount) with
// nothing kept.
func (fs *FS) initFind() {
	c := &fs.fds
	if !c.handles {
		return
	}
	a, err := fs.Getattr(context.Background(), "")
	if err != nil {
		return
	}
	h, mnt, err := unix.NameToHandleAt(fs.rootFd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.mounts[mnt]; ok {
		c.inoAddressable(h, &a, m)
	}
}

// Handle is layer.Finder's: nil on a device that opens objects by inode
// number; else the lower's handle of path, after the id of its mount.
func (fs *FS) Handle(ctx context.Context, path string, id layer.ID) ([]byte, error) {
	c := &fs.fds
	if !c.handles || id.Branch != 0 {
		return nil, syscall.ENOTSUP
	}
	c.mu.Lock()
	_, ok := c.byIno(id.Dev)
	c.mu.Unlock()
	if ok {
		return nil, nil
	}
	var h unix.FileHandle
	var mnt int
	var a layer.Attr
	err := fs.inDir(path, func(dfd int, name string) error {
		fd, err := openBeneath(dfd, name, unix.O_PATH|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if a, err = fstatAttr(fd); err != nil {
			return err
		}
		if h, mnt, err = unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH); err != nil {
			return err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		m, ok := c.mountFd(mnt, fd, a.Mode)
		if !ok {
			return syscall.ENOTSUP
		}
		if c.inoAddressable(h, &a, m) {
			h = unix.FileHandle{}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if a.Dev != id.Dev || a.Ino != id.Ino {
		return nil, syscall.ESTALE // another object took the name meanwhile
	}
	if h.Size() == 0 {
		return nil, nil
	}
	b := make([]byte, 8, 8+h.Size())
	binary.NativeEndian.PutUint32(b, uint32(mnt))
	binary.NativeEndian.PutUint32(b[4:], uint32(h.Type()))
	return append(b, h.Bytes()...), nil
}

// Find is layer.Finder's: it opens the object by handle, checks that it is
// the object id names and still has a name, and takes its path from
// /proc/self/fd.
func (fs *FS) Find(ctx context.Context, id layer.ID, h []byte) (string, error) {
	c := &fs.fds
	if !c.handles || id.Branch != 0 {
		return "", syscall.ENOTSUP
	}
	var fh unix.FileHandle
	var m int
	var ok bool
	c.mu.Lock()
	if len(h) >= 8 {
		m, ok = c.mounts[int(binary.NativeEndian.Uint32(h))]
		fh = unix.NewFileHandle(int32(binary.NativeEndian.Uint32(h[4:])), h[8:])
	} else if m, ok = c.byIno(id.Dev); ok {
		fh = inoHandle(id.Ino)
	}
	c.mu.Unlock()
	if !ok {
		return "", syscall.ESTALE
	}
	fd, err := unix.OpenByHandleAt(m, fh, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC)
	if err != nil {
		return "", syscall.ESTALE
	}
	defer unix.Close(fd)
	a, err := fstatAttr(fd)
	if err != nil || a.Dev != id.Dev || a.Ino != id.Ino || (id.Gen != 0 && a.Gen != id.Gen) || a.Nlink == 0 {
		return "", syscall.ESTALE
	}
	name, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return "", syscall.ESTALE
	}
	root, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fs.rootFd))
	if err != nil {
		return "", syscall.ESTALE
	}
	var p string
	switch {
	case name == root:
	case root == "/" && strings.HasPrefix(name, "/"):
		p = name[1:]
	case strings.HasPrefix(name, root+"/"):
		p = name[len(root)+1:]
	default:
		// No name beneath the root the kernel knows of (a file opened by
		// handle after the lower dropped its name from its caches).
		return "", syscall.ESTALE
	}
	// The name must lead to the object: /proc shows names as they were
	// when looked up, and marks removed ones in a way a real name may
	// look like.
	if b, err := fs.Getattr(ctx, p); err != nil || b.Dev != a.Dev || b.Ino != a.Ino {
		return "", syscall.ESTALE
	}
	return p, nil
}

// fstatAttr gives the attributes of the object fd (an O_PATH descriptor
// too) is open on.
func fstatAttr(fd int) (layer.Attr, error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, statxMask, &st); err != nil {
		return layer.Attr{}, err
	}
	return layer.AttrFromStatx(&st), nil
}
