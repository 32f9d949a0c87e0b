package crypt

import (
	"strings"
	"sync"
	"time"

	"cairnfs.dev/cairn/layer"
)

// The name cache (after pefs's directory cache): for each directory met, its
// lower path and IV, and the names of it already encrypted or decrypted in
// both directions. Name encryption is deterministic for a given IV, so
// entries stay right while the directory's contents change: only a rename
// or removal of the directory itself (through this layer) makes them wrong,
// and drops the directory and everything below it: every cached path under
// it, whether the directory itself is cached or not (a directory can stay
// cached after its parent left the cache). The cache is bounded: past
// maxDirs directories or maxNames names it starts again empty.
//
// A directory's entry is made from its parent's, outside the lock; a drop
// in between (a rename or rmdir of an ancestor) would leave an entry that
// describes a directory that is gone. gen counts drops, and addDir keeps an
// entry only if none happened since its caller read gen.
//
// On a lower shared with other machines (cairn mount -shared), which rename,
// remove and remake directories behind this one, an entry is used only
// after a stat of its lower path shows the same directory (identity and
// birth time: an IV belongs to one directory for its whole life, and the
// lower path runs through the encoded names of every ancestor, so a
// replaced ancestor makes it fail too), and is read again after sharedTTL
// (a lower that reuses inode numbers and records no generation or birth
// time could otherwise show a remade directory as the old one). One stat
// instead of reading every ancestor's IV file again on each operation.

type dirEntry struct {
	lower string // the directory's lower path
	iv    []byte
	// shared lowers: the directory's identity and birth time, and when
	// its IV was read
	id    layer.ID
	btime layer.Time
	read  time.Time
	enc   map[string]string // plaintext name -> encoded name
	dec   map[string]string // lower name -> plaintext name
}

type nameCache struct {
	// shared: the lower is shared with other machines (cairn mount
	// -shared): entries are checked before use (see above). Set before
	// the layer serves.
	shared   bool
	mu       sync.Mutex
	dirs     map[string]*dirEntry // by plaintext path
	names    int
	gen      uint64 // drops so far
	maxDirs  int
	maxNames int
}

func newNameCache(maxDirs, maxNames int) *nameCache {
	return &nameCache{dirs: map[string]*dirEntry{}, maxDirs: maxDirs, maxNames: maxNames}
}

// sharedTTL is how long a shared lower's directory entry is used before
// its IV is read again.
const sharedTTL = time.Second

func (c *nameCache) dir(path string) *dirEntry {
	c.mu.Lock()
	d := c.dirs[path]
	c.mu.Unlock()
	return d
}

// generation returns the count of drops, for addDir.
func (c *nameCache) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// forget drops d, the entry of path, if it is still there, and not the
// entries below it (each is checked on its own).
func (c *nameCache) forget(path string, d *dirEntry) {
	c.mu.Lock()
	if c.dirs[path] == d {
		delete(c.dirs, path)
	}
	c.mu.Unlock()
}

// addDir makes the entry of a directory and caches it unless a drop
// happened after gen was read. a are the directory's attributes, for a
// shared lower (nil: the entry is not cached there).
func (c *nameCache) addDir(path, lower string, iv []byte, a *layer.Attr, gen uint64) *dirEntry {
	d := &dirEntry{lower: lower, iv: iv, enc: map[string]string{}, dec: map[string]string{}}
	if c.shared {
		if a == nil {
			return d
		}
		d.id, d.btime, d.read = a.ID(), a.Btime, time.Now()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return d
	}
	if len(c.dirs) >= c.maxDirs {
		c.dirs = map[string]*dirEntry{}
		c.names = 0
	}
	c.dirs[path] = d
	return d
}

// encoded returns a cached encoded name.
func (c *nameCache) encoded(d *dirEntry, name string) (string, bool) {
	c.mu.Lock()
	e, ok := d.enc[name]
	c.mu.Unlock()
	return e, ok
}

// decoded returns a cached plaintext name of a lower name.
func (c *nameCache) decoded(d *dirEntry, lname string) (string, bool) {
	c.mu.Lock()
	n, ok := d.dec[lname]
	c.mu.Unlock()
	return n, ok
}

// add records a pair; lname is "" when only the encoded name is known.
func (c *nameCache) add(d *dirEntry, name, enc, lname string) {
	c.mu.Lock()
	if c.names >= c.maxNames {
		for _, e := range c.dirs {
			e.enc, e.dec = map[string]string{}, map[string]string{}
		}
		c.names = 0
	}
	if _, ok := d.enc[name]; !ok {
		d.enc[name] = enc
		c.names++
	}
	if lname != "" {
		if _, ok := d.dec[lname]; !ok {
			d.dec[lname] = name
			c.names++
		}
	}
	c.mu.Unlock()
}

// drop forgets the directory at path and everything below it.
func (c *nameCache) drop(path string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	if path == "" {
		c.dirs = map[string]*dirEntry{}
		c.names = 0
		return
	}
	prefix := path + "/"
	for p := range c.dirs {
		if p == path || strings.HasPrefix(p, prefix) {
			delete(c.dirs, p)
		}
	}
}
