package union

import (
	"context"
	"io"
	"strings"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// ReadDir is the merged stream, read whole.
func (u *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	d, err := u.OpenDir(ctx, path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return layer.ReadDirAll(ctx, d, plus)
}

// maxSeen bounds the names a listing remembers of its earlier branches;
// past it, a name of a later branch is looked up in the earlier ones.
const maxSeen = 1 << 16

// OpenDir merges the streams of the directory's branches, first first
// (layer.MergeDirs), as resolve would resolve each name, without asking
// for each: a name is listed once, as the first branch that has it shows
// it, and not at all if that is a whiteout. A branch's names are
// remembered (up to maxSeen) while it is read, so that a later branch's
// are left out without a lookup; a listing that was sought into a later
// branch, or whose earlier branches hold more names, looks them up there.
// A directory with a directory of its name on a later branch (down to an
// opaque one, a whiteout or a non-directory) shows one link, as overlayfs
// shows merged directories. Temporary entries and the index are left out.
// A copy shows its original's identity; only directories marked impure
// (that received a copy) are asked for their files' origins.
func (u *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	br, err := u.dirBranches(ctx, path)
	if err != nil {
		return nil, err
	}
	l := &merging{u: u, path: path, br: br, seen: map[string]struct{}{}, impure: map[int]bool{}}
	return layer.MergeDirs(layer.Merge{N: len(br), Open: l.open, Keep: l.keep, Restart: l.restart}), nil
}

// merging is the state of a merged listing.
type merging struct {
	u      *FS
	path   string
	br     []int
	seen   map[string]struct{} // names of the branches read so far
	full   bool                // seen stopped at maxSeen
	impure map[int]bool        // by branch: the directory received a copy
}

func (l *merging) restart() { clear(l.seen); l.full = false }

// open opens branch k's stream; a later branch that cannot be listed is
// left out.
func (l *merging) open(ctx context.Context, k int) (layer.Dir, error) {
	i := l.br[k]
	d, err := layer.OpenDir(ctx, l.u.b[i].FS, l.path)
	if err != nil {
		if k == 0 {
			return nil, err
		}
		l.u.branchErr(i, l.path, err)
		return emptyDir{}, nil
	}
	if _, ok := l.impure[i]; !ok && l.u.writable(i) {
		_, err := l.u.meta[i].Get(ctx, l.path, "impure")
		l.impure[i] = err == nil
	}
	return d, nil
}

func (l *merging) keep(ctx context.Context, k int, e *layer.DirEntry, whole bool) (bool, error) {
	u, i := l.u, l.br[k]
	p := layer.Join(l.path, e.Name)
	if isTmp(e.Name) {
		if u.writable(i) && !u.checking && !strings.HasPrefix(e.Name, u.ownTmp) {
			// Left by a daemon that crashed in a copy-up.
			u.remove(ctx, i, p)
		}
		return false, nil
	}
	if l.path == "" && e.Name == indexDir {
		return false, nil
	}
	if k > 0 {
		if whole && !l.full {
			if _, ok := l.seen[e.Name]; ok {
				return false, nil
			}
		} else {
			for _, j := range l.br[:k] {
				if _, err := u.b[j].FS.Getattr(ctx, p); err == nil {
					return false, nil // shown, or hidden, by an earlier branch
				}
			}
		}
	}
	if k < len(l.br)-1 && !l.full {
		if len(l.seen) >= maxSeen {
			l.full = true
		} else {
			l.seen[e.Name] = struct{}{}
		}
	}
	if u.isWhiteoutEntry(ctx, i, p, e) {
		return false, nil
	}
	if a := e.Attr; a != nil {
		layer.TagBranch(a, i, len(u.b))
		if a.IsDir() && l.merged(ctx, k, p) {
			a.Nlink = 1
		}
	}
	if l.impure[i] {
		a := e.Attr
		if a == nil {
			a = &layer.Attr{Mode: e.Mode}
		}
		if s := u.origin(ctx, i, p, a); s != nil {
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
	return true, nil
}

// merged reports whether the directory p of branch k has a directory of
// its name on a later branch that the merge reaches.
func (l *merging) merged(ctx context.Context, k int, p string) bool {
	for _, j := range l.br[k+1:] {
		a, err := l.u.b[j].FS.Getattr(ctx, p)
		if err != nil {
			continue
		}
		if isWhiteout(&a) || !a.IsDir() {
			return false
		}
		return !l.u.opaque(ctx, l.br[k], p)
	}
	return false
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

// emptyDir is the stream of a branch left out.
type emptyDir struct{}

func (emptyDir) Next(context.Context, bool) (layer.DirEntry, uint64, error) {
	return layer.DirEntry{}, 0, io.EOF
}
func (emptyDir) Seek(context.Context, uint64) error { return nil }
func (emptyDir) Close() error                       { return nil }
