package local

import (
	"container/list"
	"sync"

	"golang.org/x/sys/unix"
)

// fdCache bounds the descriptors that open files hold, so that one process
// holding many files open through the mount cannot use up the daemon's
// descriptors and make everyone else's open fail with EMFILE. At most max
// open files hold a descriptor; past that, the least recently used one is
// closed, and reopened on its next use from a file handle
// (name_to_handle_at, open_by_handle_at), which reaches the same inode even
// after renames. With kernel passthrough the kernel keeps its own reference
// to the file, so a passed-through file that the daemon does not use costs
// the daemon no descriptor at all.
//
// A file keeps its descriptor (it is "pinned") when closing it would lose
// something a reopen cannot give back: a lock (POSIX and flock locks
// belong to the open file description), an inode with no name left (an
// unlinked file that is still open lives only as long as a descriptor),
// or a lower that gives no handles. Unlink and rename through this layer
// reopen and pin the files of an inode before they remove its last name.
// A file unlinked behind the layer's back while its descriptor was closed
// is gone: its next use fails with ESTALE.
//
// open_by_handle_at needs CAP_DAC_READ_SEARCH: a daemon without it (not
// root) keeps every descriptor, as before.
type fdCache struct {
	mu       sync.Mutex
	max      int       // open files that may hold a descriptor that can be closed
	lru      list.List // of *File holding such a descriptor, most recent first
	closed   map[fileKey][]*File
	removing map[fileKey]int // inodes whose name an unlink or rename removes now
	// unchecked: removals under way that did not stat their name (no
	// descriptor was closed when they began); trim closes none meanwhile.
	unchecked int
	handles   bool           // reopening by handle works here
	mounts    map[int]int    // mount id -> a descriptor on it, for open_by_handle_at
	inoDevs   map[uint64]int // device -> its mount's descriptor if it opens objects by inode number, else -1 (see find.go)
}

type fileKey struct{ dev, ino uint64 }

// nofile is the process's soft limit of open descriptors.
func nofile() int {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) != nil || rl.Cur > 1<<30 {
		return 1 << 30
	}
	return int(rl.Cur)
}

// init sets the bound from the daemon's descriptor limit (half of it: a
// quarter is for directories (dirCache), the rest for the FUSE device and
// short-lived descriptors) and finds out whether handles can be opened.
func (c *fdCache) init(rootFd, limit int) {
	c.max = max(limit/2, 16)
	dir, h, mnt, ok := rootMount(rootFd)
	if !ok {
		return
	}
	fd, err := openByHandleAt(dir, h, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		unix.Close(dir)
		return
	}
	unix.Close(fd)
	c.handles, c.mounts = true, map[int]int{mnt: dir}
}

// rootMount opens the root directory for open_by_handle_at, which wants a
// descriptor that is not O_PATH, and gives its handle and its mount's id.
func rootMount(rootFd int) (int, fileHandle, int, bool) {
	dir, err := unix.Openat(rootFd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fileHandle{}, 0, false
	}
	h, mnt, err := nameToHandleAt(dir, "", atEmptyPath)
	if err != nil {
		unix.Close(dir)
		return -1, fileHandle{}, 0, false
	}
	return dir, h, mnt, true
}

// addMount registers the mount of a new root directory (see FS.SetAtime).
func (c *fdCache) addMount(rootFd int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.handles {
		return
	}
	if dir, _, mnt, ok := rootMount(rootFd); ok {
		if _, dup := c.mounts[mnt]; dup {
			unix.Close(dir)
		} else {
			c.mounts[mnt] = dir
		}
	}
}

// add registers a newly opened file.
func (c *fdCache) add(f *File) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.handles {
		f.pinned = true
		return
	}
	f.elem = c.lru.PushFront(f)
	c.trim(f)
}

// get returns f's descriptor, reopening it if the cache closed it; put
// must follow. With pin set, the file keeps its descriptor from now on.
func (f *File) get(pin bool) (int, error) {
	c := &f.fs.fds
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.fd < 0 {
		if f.released {
			return -1, unix.EBADF
		}
		fd, err := openByHandleAt(f.mountFd, f.handle, f.reopenFlags())
		if err != nil {
			return -1, err
		}
		f.fd = fd
		c.forgetClosed(f)
		if !f.pinned {
			f.elem = c.lru.PushFront(f)
			c.trim(f)
		}
	} else if f.elem != nil {
		c.lru.MoveToFront(f.elem)
	}
	if pin && !f.pinned {
		c.pin(f)
	}
	f.busy++
	return f.fd, nil
}

func (f *File) put() {
	c := &f.fs.fds
	c.mu.Lock()
	f.busy--
	c.mu.Unlock()
}

// reopenFlags are the file's open flags without those that act only when
// a file is opened by name.
func (f *File) reopenFlags() int {
	return f.flags&^(unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC|unix.O_NOCTTY|unix.O_NOFOLLOW|oPath) | unix.O_CLOEXEC
}

// pin keeps f's descriptor (c.mu held; f holds one).
func (c *fdCache) pin(f *File) {
	f.pinned = true
	if f.elem != nil {
		c.lru.Remove(f.elem)
		f.elem = nil
	}
}

// trim closes the descriptors of the least recently used files past the
// bound, sparing keep and the files in use (c.mu held).
func (c *fdCache) trim(keep *File) {
	if c.unchecked > 0 {
		return // the bound is passed for the moment: see removeName
	}
	e := c.lru.Back()
	for c.lru.Len() > c.max && e != nil {
		f := e.Value.(*File)
		e = e.Prev()
		if f != keep && f.busy == 0 {
			c.closeFd(f)
		}
	}
}

// closeFd closes f's descriptor, or pins it if a reopen could not reach the
// same file (c.mu held).
func (c *fdCache) closeFd(f *File) {
	var st unix.Stat_t
	if unix.Fstat(f.fd, &st) != nil || st.Nlink == 0 {
		c.pin(f)
		return
	}
	key := fileKey{uint64(st.Dev), st.Ino}
	if c.removing[key] > 0 {
		return // its name is going: leave it for now
	}
	if !f.hasHandle {
		h, mnt, err := nameToHandleAt(f.fd, "", atEmptyPath)
		if err != nil {
			c.pin(f)
			return
		}
		mfd, ok := c.mountFd(mnt, f.fd, uint32(st.Mode))
		if !ok {
			c.pin(f)
			return
		}
		f.handle, f.mountFd, f.hasHandle = h, mfd, true
	}
	c.lru.Remove(f.elem)
	f.elem = nil
	if err := unix.Close(f.fd); err != nil && f.lateErr == nil {
		f.lateErr = err
	}
	f.fd, f.key = -1, key
	if c.closed == nil {
		c.closed = make(map[fileKey][]*File)
	}
	c.closed[key] = append(c.closed[key], f)
}

// mountFd gives a descriptor of the mount with id mnt, on which fd is, for
// open_by_handle_at: the root directory's for the root's mount; for a file
// system mounted inside the root, one more descriptor of the first file
// (regular or directory) met on it, kept until Close (c.mu held).
func (c *fdCache) mountFd(mnt, fd int, mode uint32) (int, bool) {
	if m, ok := c.mounts[mnt]; ok {
		return m, true
	}
	if t := mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
		return -1, false
	}
	m, err := unix.Open(fdPath(fd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false
	}
	c.mounts[mnt] = m
	return m, true
}

// forgetClosed removes f from the closed files (c.mu held).
func (c *fdCache) forgetClosed(f *File) {
	fs := c.closed[f.key]
	for i, g := range fs {
		if g == f {
			fs = append(fs[:i], fs[i+1:]...)
			break
		}
	}
	if len(fs) == 0 {
		delete(c.closed, f.key)
	} else {
		c.closed[f.key] = fs
	}
}

// release drops f for good and returns the error of a late close.
func (c *fdCache) release(f *File) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f.released = true
	err := f.lateErr
	if f.fd < 0 {
		c.forgetClosed(f)
		return err
	}
	if f.elem != nil {
		c.lru.Remove(f.elem)
		f.elem = nil
	}
	if e := unix.Close(f.fd); err == nil {
		err = e
	}
	f.fd = -1
	return err
}

// removeName runs remove, which takes a name away from the object that
// dirfd/name is, after reopening and pinning the files of that object whose
// descriptor was closed when the name may be its last (a closed descriptor
// could not be reopened afterwards). If the object still has a name after
// all (remove failed, or another link was made meanwhile), the files go
// back under the bound.
func (c *fdCache) removeName(dirfd int, name string, remove func() error) error {
	if !c.handles {
		return remove()
	}
	// No descriptor closed, and none closed until remove is done: nothing
	// to reopen, and no stat of the name (on a network lower, a round trip
	// per unlink).
	c.mu.Lock()
	if len(c.closed) == 0 {
		c.unchecked++
		c.mu.Unlock()
		err := remove()
		c.mu.Lock()
		c.unchecked--
		c.mu.Unlock()
		return err
	}
	c.mu.Unlock()
	var st unix.Stat_t
	if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return remove()
	}
	key := fileKey{uint64(st.Dev), st.Ino}
	c.mu.Lock()
	if c.removing == nil {
		c.removing = make(map[fileKey]int)
	}
	c.removing[key]++
	// With other names left, and no other removal under way that could
	// take them meanwhile, nothing needs reopening.
	var reopened []*File
	if st.Nlink <= 1 || c.removing[key] > 1 {
		for _, f := range append([]*File(nil), c.closed[key]...) {
			if fd, err := openByHandleAt(f.mountFd, f.handle, f.reopenFlags()); err == nil {
				f.fd = fd
				c.forgetClosed(f)
				f.pinned = true
				reopened = append(reopened, f)
			}
		}
	}
	c.mu.Unlock()
	err := remove()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.removing[key]--; c.removing[key] == 0 {
		delete(c.removing, key)
	}
	for _, f := range reopened {
		if f.released || f.fd < 0 || unix.Fstat(f.fd, &st) != nil || st.Nlink == 0 {
			continue
		}
		f.pinned = false
		f.elem = c.lru.PushFront(f)
	}
	if len(reopened) > 0 {
		c.trim(nil)
	}
	return err
}

// close releases the mount descriptors.
func (c *fdCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.mounts {
		unix.Close(m)
	}
	c.mounts, c.inoDevs = nil, nil
}

// handleOf gives a file handle of fd, an open file of type typ (S_IFDIR or
// S_IFREG), and the descriptor of its mount to reopen it with
// (open_by_handle_at); false where handles do not work here.
func (c *fdCache) handleOf(fd int, typ uint32) (fileHandle, int, bool) {
	if !c.handles {
		return fileHandle{}, -1, false
	}
	h, mnt, err := nameToHandleAt(fd, "", atEmptyPath)
	if err != nil {
		return fileHandle{}, -1, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.mountFd(mnt, fd, typ)
	return h, m, ok
}
