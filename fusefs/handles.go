package fusefs

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"

	"cairnfs.dev/cairn/third_party/gofuse/fs"
	"cairnfs.dev/cairn/third_party/gofuse/fuse"

	"cairnfs.dev/cairn/layer"
)

// File handles (name_to_handle_at, open_by_handle_at, NFS exports).
//
// The kernel makes a mount's file handles of the node id and the generation
// (FUSE_EXPORT_SUPPORT). A node id is the object's number (inoMap: the
// lower's inode number in its file system's namespace), so it names the
// object as long as the lower does, whatever its path, and across remounts
// for the root's file system. When the kernel has forgotten the node and
// gets a handle, it asks for the node id's "." (and, for a directory, ".."
// to connect it to the root); the stack finds the object from its identity
// (layer.Find), and LookupNode puts its path into go-fuse's tree, so that it
// is served like any looked-up node. The kernel itself checks the
// generation.
//
// What finding needs besides the identity is kept in known, for the objects
// the kernel met most recently: the lower's handle where the lower does not
// open objects by inode number, and a file's directory, where the file is
// looked for when the lower no longer knows its name (see local's Find).

// knownMax bounds known: past it, the oldest half is dropped.
const knownMax = 1 << 19

// known remembers, by node id, what finding an object again needs besides
// its identity: two generations of maps, the older dropped when the newer is
// full.
type known struct {
	mu       sync.Mutex
	cur, old map[uint64]knownObj
}

type knownObj struct {
	h      string // the stack's layer.Handle, if it gave one
	parent uint64 // a regular file's (or other non-directory's) directory, its node id
}

func (k *known) get(ino uint64) (knownObj, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	o, ok := k.cur[ino]
	if !ok {
		o, ok = k.old[ino]
	}
	return o, ok
}

func (k *known) put(ino uint64, o knownObj) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cur == nil || len(k.cur) >= knownMax {
		k.old, k.cur = k.cur, make(map[uint64]knownObj)
	}
	k.cur[ino] = o
}

// remember keeps what finding the object (id, at path p, node number ino,
// in the directory with node number parent) needs, once the kernel meets it.
func (st *state) remember(ctx context.Context, ino uint64, p string, id layer.ID, isDir bool, parent uint64) {
	if !st.finds || ino&spillBit != 0 {
		return
	}
	if isDir {
		parent = 0 // the lower names a directory it opens by handle
	}
	o, ok := st.known.get(ino)
	if ok && o.parent == parent {
		return
	}
	if !ok {
		h, err := layer.Handle(ctx, st.top, p, id)
		if err != nil || (h == nil && parent == 0) {
			return
		}
		o.h = string(h)
	}
	o.parent = parent
	st.known.put(ino, o)
}

// moved follows the rename of the object with node number ino into the
// directory with node number parent.
func (st *state) moved(ino, parent uint64) {
	if o, ok := st.known.get(ino); ok && o.parent != 0 && o.parent != parent {
		o.parent = parent
		st.known.put(ino, o)
	}
}

// find gives the path of the object with node number ino.
func (st *state) find(ctx context.Context, ino uint64, depth int) (string, syscall.Errno) {
	if ino == st.root.StableAttr().Ino {
		return "", 0
	}
	id, ok := st.inos.id(ino)
	if !ok || depth > 64 {
		return "", syscall.ESTALE
	}
	o, _ := st.known.get(ino)
	p, err := layer.Find(ctx, st.top, id, []byte(o.h))
	if err == nil {
		return p, 0
	}
	if errors.Is(err, syscall.ENOTSUP) {
		return "", syscall.ESTALE // a daemon without CAP_DAC_READ_SEARCH, or a lower without handles
	}
	if !layer.IsStale(err) {
		return "", st.errno("find", "", err)
	}
	// The lower found the object but not its name: look for it in its
	// last known directory, then from the root.
	if o.parent != 0 {
		if dir, errno := st.find(ctx, o.parent, depth+1); errno == 0 {
			if p, err := layer.Search(ctx, st.top, id, dir, searchDir); err == nil {
				return p, 0
			}
		}
	}
	if depth > 0 {
		return "", syscall.ESTALE
	}
	if p, err := layer.Search(ctx, st.top, id, "", searchTree); err == nil {
		return p, 0
	}
	return "", syscall.ESTALE
}

// How many entries find goes through looking for an object whose name the
// lower does not know: in its last known directory, and in the tree.
const (
	searchDir  = 1 << 20
	searchTree = 1 << 16
)

var (
	_ fs.NodeLookupNoder    = (*node)(nil)
	_ fs.NodeLookupParenter = (*node)(nil)
)

// LookupNode serves the kernel's lookup of a node id it has forgotten (of
// "." in it), asked of the root: the object is found by identity and put
// into the tree at its path, each directory on the way a node (one the tree
// has, or a new one that lives while it has children).
func (n *node) LookupNode(ctx context.Context, ino uint64, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	st := n.st
	cctx := callerCtx(ctx)
	p, errno := st.find(cctx, ino, 0)
	if errno != 0 {
		return nil, errno
	}
	if p == "" {
		return nil, syscall.ESTALE // the root is always known
	}
	cur := &st.root.Inode
	names := strings.Split(p, "/")
	for i, name := range names {
		last := i == len(names)-1
		ch := cur.GetChild(name)
		if ch != nil && !last {
			cur = ch
			continue
		}
		sub := strings.Join(names[:i+1], "/")
		a, err := st.top.Getattr(cctx, sub)
		if err != nil {
			return nil, syscall.ESTALE
		}
		id := a.ID()
		if ch == nil || !sameObject(ch, id) {
			num := st.inos.ino(id)
			ch = cur.NewInode(ctx, &node{st: st, id: id}, fs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: num, Gen: id.Gen})
			cur.AddChild(name, ch, true)
		}
		if last {
			if ch.StableAttr().Ino != ino {
				return nil, syscall.ESTALE
			}
			fillAttr(&a, &out.Attr)
			out.Attr.Ino = ino
		}
		cur = ch
	}
	return cur, 0
}

// sameObject reports whether ch is a node of the object id.
func sameObject(ch *fs.Inode, id layer.ID) bool {
	cn, ok := ch.Operations().(*node)
	return ok && cn.id == id
}

// LookupParent serves the kernel's lookup of ".." in a directory it is
// connecting to the root (after LookupNode): its parent in the tree.
func (n *node) LookupParent(ctx context.Context, out *fuse.EntryOut) (*fs.Inode, string, syscall.Errno) {
	name, parent := n.Parent()
	if parent == nil || n.IsRoot() {
		return nil, "", syscall.ESTALE
	}
	pn, ok := parent.Operations().(*node)
	if !ok {
		return nil, "", syscall.ESTALE
	}
	p, ok := pn.path()
	if !ok {
		return nil, "", syscall.ESTALE
	}
	a, err := n.st.top.Getattr(callerCtx(ctx), p)
	if err != nil {
		return nil, "", n.st.errno("lookup", p, err)
	}
	fillAttr(&a, &out.Attr)
	out.Attr.Ino = parent.StableAttr().Ino
	return parent, name, 0
}
