package union

import (
	"context"
	"strings"

	"golang.org/x/sys/unix"

	"cairn/layer"
)

// listed is a name of a merged listing.
type listed struct {
	e      layer.DirEntry
	i      int  // the branch that shows it
	hidden bool // a whiteout
	dir    bool
	merged bool // a directory with parts on later branches
	closed bool // no later branch adds to it
	looked bool // its opaque mark was read
}

// ReadDir merges the listings of the directory's branches, first first,
// as resolve would resolve each name, without asking for each: a name is
// listed once, as the first branch that has it shows it, and not at all if
// that is a whiteout; a directory is merged with the later branches'
// directories of its name down to an opaque one, a whiteout or a
// non-directory. Temporary entries and the index are left out. A copy
// shows its original's identity; only directories marked impure (that
// received a copy) are asked for their files' origins.
func (u *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	br, err := u.dirBranches(ctx, path)
	if err != nil {
		return nil, err
	}
	names := map[string]*listed{}
	var order []*listed
	for k, i := range br {
		ents, err := u.b[i].FS.ReadDir(ctx, path, plus)
		if err != nil {
			if k == 0 {
				return nil, err
			}
			u.branchErr(i, path, err) // a lower part that cannot be listed is left out
			continue
		}
		for _, e := range ents {
			if isTmp(e.Name) {
				if u.writable(i) && !u.checking && !strings.HasPrefix(e.Name, u.ownTmp) {
					// Left by a daemon that crashed in a copy-up.
					u.remove(ctx, i, layer.Join(path, e.Name))
				}
				continue
			}
			if path == "" && e.Name == indexDir {
				continue
			}
			p := layer.Join(path, e.Name)
			x := names[e.Name]
			if x == nil {
				x = &listed{e: e, i: i, dir: e.Mode&unix.S_IFMT == unix.S_IFDIR}
				names[e.Name] = x
				x.hidden = u.isWhiteoutEntry(ctx, i, p, &e)
				order = append(order, x)
				continue
			}
			if x.hidden || !x.dir || x.closed {
				continue
			}
			if e.Mode&unix.S_IFMT != unix.S_IFDIR {
				x.closed = true // a whiteout or a non-directory ends the merge
				continue
			}
			if !x.looked {
				x.looked = true
				if u.opaque(ctx, x.i, p) {
					x.closed = true
					continue
				}
			}
			x.merged = true
			if u.opaque(ctx, i, p) {
				x.closed = true
			}
		}
	}
	impure := map[int]bool{}
	for _, i := range br {
		if u.writable(i) {
			_, err := u.meta[i].Get(ctx, path, "impure")
			impure[i] = err == nil
		}
	}
	out := make([]layer.DirEntry, 0, len(order))
	for _, x := range order {
		if x.hidden {
			continue
		}
		e := x.e
		if a := e.Attr; a != nil {
			layer.TagBranch(a, x.i, len(u.b))
			if x.merged {
				a.Nlink = 1
			}
		}
		if impure[x.i] {
			a := e.Attr
			if a == nil {
				a = &layer.Attr{Mode: e.Mode}
			}
			if s := u.origin(ctx, x.i, layer.Join(path, e.Name), a); s != nil {
				s.apply(a)
				if e.Attr != nil {
					e.Attr = a
				}
				e.Ino = s.id.Ino
			}
		}
		if e.Attr != nil {
			e.Ino = e.Attr.Ino
		}
		out = append(out, e)
	}
	return out, nil
}

// isWhiteoutEntry reports whether entry e of branch i, at p, is a whiteout.
func (u *FS) isWhiteoutEntry(ctx context.Context, i int, p string, e *layer.DirEntry) bool {
	if e.Mode != 0 && e.Mode&unix.S_IFMT != unix.S_IFCHR {
		return false
	}
	a := e.Attr
	if a == nil {
		x, err := u.b[i].FS.Getattr(ctx, p)
		if err != nil {
			return false
		}
		a = &x
	}
	return isWhiteout(a)
}

// markImpure marks directory dir of branch i as holding a copy (see
// ReadDir), as overlayfs marks its "impure" directories.
func (u *FS) markImpure(ctx context.Context, i int, dir string) {
	if _, err := u.meta[i].Get(ctx, dir, "impure"); err == nil {
		return
	}
	u.meta[i].Set(layer.AsSelf(ctx), dir, "impure", []byte("y"))
}

// OpenDir lists the merged directory whole (layer.ListedDir).
func (u *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	if _, err := u.dirBranches(ctx, path); err != nil {
		return nil, err
	}
	return layer.ListedDir(u, path), nil
}
