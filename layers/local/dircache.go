package local

import (
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// dirCache keeps O_PATH descriptors of recently used directories, so that an
// operation on a file does not walk its directory's path again (pefs and
// gocryptfs keep directory descriptors for the same reason). It is bounded:
// at most size descriptors (dirCacheSize, or a quarter of the descriptor
// limit if that is less), each kept at most dirCacheTTL (the kernel's own
// caches of names and attributes last about as long).
//
// A cached descriptor names a directory object, not a path. A rename or
// rmdir through this layer therefore drops the entries of the directory it
// touches and of everything below it, and a descriptor opened while one ran
// is not kept. A directory renamed by someone else, behind the layer's
// back, is still reached under its old name until its entry expires, as
// the kernel's name cache would. No name is ever resolved from a cached
// descriptor other than one final component without following symlinks, so
// the cache opens no way out of the root that the directory's owner does
// not already have.
type dirCache struct {
	size    int  // set before use
	off     bool // nothing is kept (Share: other machines rename directories)
	mu      sync.Mutex
	m       map[string]*dirEnt
	byFd    map[int]*dirEnt // the entries of m, by descriptor
	renames uint64          // counts invalidations; an open that spans one is not kept
}

type dirEnt struct {
	fd    int
	refs  int // users, plus one while in the map
	since time.Time
	// noDefACL: the directory was found to have no default ACL (see
	// FS.hasDefaultACL); an entry lives a second at most, and a change of
	// the directory's ACL through the layer drops it.
	noDefACL bool
}

const (
	dirCacheSize = 256
	dirCacheTTL  = time.Second
)

// get returns a descriptor of dir, from the cache or from open, and the
// function to call when done with it.
func (c *dirCache) get(dir string, open func() (int, error)) (int, func(), error) {
	now := time.Now()
	c.mu.Lock()
	if e := c.m[dir]; e != nil {
		if now.Sub(e.since) < dirCacheTTL {
			e.refs++
			c.mu.Unlock()
			return e.fd, func() { c.release(e) }, nil
		}
		c.drop(dir, e)
	}
	gen := c.renames
	c.mu.Unlock()

	fd, err := open()
	if err != nil {
		return -1, nil, err
	}
	e := &dirEnt{fd: fd, refs: 1, since: now}
	c.mu.Lock()
	if gen == c.renames && c.m[dir] == nil && !c.off {
		if c.m == nil {
			c.m = make(map[string]*dirEnt)
			c.byFd = make(map[int]*dirEnt)
		}
		if len(c.m) >= c.size {
			c.evict(now)
		}
		c.m[dir] = e
		c.byFd[fd] = e
		e.refs++
	}
	c.mu.Unlock()
	return fd, func() { c.release(e) }, nil
}

func (c *dirCache) release(e *dirEnt) {
	c.mu.Lock()
	e.refs--
	if e.refs == 0 {
		unix.Close(e.fd)
	}
	c.mu.Unlock()
}

// drop removes an entry from the map (c.mu held).
func (c *dirCache) drop(dir string, e *dirEnt) {
	delete(c.m, dir)
	delete(c.byFd, e.fd)
	e.refs--
	if e.refs == 0 {
		unix.Close(e.fd)
	}
}

// evict makes room: expired entries go, and if none had expired, any one
// (c.mu held).
func (c *dirCache) evict(now time.Time) {
	victim := ""
	for d, e := range c.m {
		if now.Sub(e.since) >= dirCacheTTL {
			c.drop(d, e)
		} else {
			victim = d
		}
	}
	if len(c.m) >= c.size {
		c.drop(victim, c.m[victim])
	}
}

// invalidate drops the entries of the directories at paths and below them:
// they are being renamed, replaced or removed.
func (c *dirCache) invalidate(paths ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renames++
	for d, e := range c.m {
		for _, p := range paths {
			if p == "" || d == p || strings.HasPrefix(d, p+"/") {
				c.drop(d, e)
				break
			}
		}
	}
}

// close drops every entry.
func (c *dirCache) close() { c.invalidate("") }

// share turns the cache off and drops what it holds (FS.Share).
func (c *dirCache) share() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off = true
	for dir, e := range c.m {
		c.drop(dir, e)
	}
}

// noDefaultACL reports whether the directory of the cached descriptor fd
// is known to have no default ACL.
func (c *dirCache) noDefaultACL(fd int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.byFd[fd]
	return e != nil && e.noDefACL
}

// setNoDefaultACL notes that the directory of fd has no default ACL, if fd
// is a cached descriptor.
func (c *dirCache) setNoDefaultACL(fd int) {
	c.mu.Lock()
	if e := c.byFd[fd]; e != nil {
		e.noDefACL = true
	}
	c.mu.Unlock()
}
