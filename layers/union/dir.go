package union

import (
	"context"
	"strings"

	"golang.org/x/sys/unix"

	"cairn/layer"
)

// ReadDir merges the listings of the directory's branches, first first:
// a name is listed once, as the first branch that has it shows it, and not
// at all if that is a whiteout. Temporary entries are left out.
func (u *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	br, err := u.dirBranches(ctx, path)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []layer.DirEntry
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
				if u.writable(i) && !strings.HasPrefix(e.Name, u.ownTmp) {
					// Left by a daemon that crashed in a copy-up.
					u.remove(ctx, i, layer.Join(path, e.Name))
				}
				continue
			}
			if seen[e.Name] {
				continue
			}
			seen[e.Name] = true
			if e.Mode&unix.S_IFMT == unix.S_IFCHR || e.Mode == 0 {
				a := e.Attr
				if a == nil {
					x, err := u.b[i].FS.Getattr(ctx, layer.Join(path, e.Name))
					if err != nil {
						continue
					}
					a = &x
				}
				if isWhiteout(a) {
					continue
				}
			}
			if k > 0 && e.Mode&unix.S_IFMT == unix.S_IFDIR || plus {
				// A directory of a later branch may be merged with
				// one of a branch before it that lists nothing of
				// that name (it has none): its attributes are its
				// first part's. Ask the union.
				a, err := u.resolve(ctx, layer.Join(path, e.Name))
				if err != nil {
					continue
				}
				e.Attr, e.Ino, e.Mode = &a.a, a.a.Ino, a.a.Mode&unix.S_IFMT
				if !plus {
					e.Attr = nil
				}
			} else if e.Attr != nil {
				layer.TagBranch(e.Attr, i, len(u.b))
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// OpenDir lists the merged directory whole (layer.ListedDir).
func (u *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	if _, err := u.dirBranches(ctx, path); err != nil {
		return nil, err
	}
	return layer.ListedDir(u, path), nil
}
