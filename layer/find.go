package layer

import (
	"context"
	"errors"
	"syscall"
)

// Finder is an optional interface of FS: a layer that can find one of its
// objects again from its identity, after everything that knew the object's
// path has forgotten it, wherever it has moved since. It is what file handles
// of a mount need (name_to_handle_at, open_by_handle_at, an NFS export): a
// handle holds the object's identity, not its path.
//
// A layer that changes no names and stacks over one lower finds what its
// lower finds (Find below goes down to it); a layer that changes names
// implements Finder by translating the lower's answers (crypt), and any
// other layer cannot find (file handles of the mount then go stale once the
// kernel has forgotten the object).
type Finder interface {
	// Handle returns what Find needs, besides id, to find the object at
	// path (whose identity is id) again: nil when the identity is enough
	// (a lower that opens objects by inode number), the lower's own file
	// handle otherwise. The caller keeps it as long as it likes; it stays
	// valid while the layer is open.
	Handle(ctx context.Context, path string, id ID) ([]byte, error)
	// Find returns a path of the object with identity id (Dev, Branch and
	// Ino; Gen is 0 when the caller does not know it), given what Handle
	// gave for it (nil when nothing was kept): one of its names, for a
	// file with several links. ESTALE when the object no longer exists or
	// the layer cannot name it (a file whose name the lower no longer
	// remembers), ENOTSUP when the layer cannot find at all.
	Find(ctx context.Context, id ID, h []byte) (string, error)
}

// finder is the layer of fs's stack that answers for fs: fs itself, or the
// lower it forwards to (see Finder); nil when none can. A Finder that also
// has CanFind (a fan-out layer, which finds through its lowers) may say it
// cannot.
func finder(fs FS) Finder {
	for {
		if f, ok := fs.(Finder); ok {
			if c, ok := f.(interface{ CanFind() bool }); ok && !c.CanFind() {
				return nil // a fan-out layer over a lower that cannot
			}
			return f
		}
		ls := fs.Lowers()
		if fs.Changes()&(ChangesNames|ChangesPlacement) != 0 || len(ls) != 1 {
			return nil
		}
		fs = ls[0]
	}
}

// CanFind reports whether fs's stack can find objects by identity (see
// Finder).
func CanFind(fs FS) bool { return finder(fs) != nil }

// Handle is fs's Finder.Handle (through the layers that forward it).
func Handle(ctx context.Context, fs FS, path string, id ID) ([]byte, error) {
	f := finder(fs)
	if f == nil {
		return nil, syscall.ENOTSUP
	}
	return f.Handle(ctx, path, id)
}

// Find is fs's Finder.Find (through the layers that forward it).
func Find(ctx context.Context, fs FS, id ID, h []byte) (string, error) {
	f := finder(fs)
	if f == nil {
		return "", syscall.ENOTSUP
	}
	return f.Find(ctx, id, h)
}

// IsStale reports whether err says that an object cannot be found.
func IsStale(err error) bool {
	return errors.Is(err, syscall.ESTALE) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR)
}

// Search looks for the object with identity id by its inode number in the
// listings of fs's directories, breadth first from dir (the object's last
// known directory, or the root ""), going through at most budget entries:
// how an object is found whose name its lower no longer knows (a file
// opened by handle after the lower dropped its name from its caches). It
// returns the path of the first entry that is the object, ESTALE when none
// was found within the budget.
func Search(ctx context.Context, fs FS, id ID, dir string, budget int) (string, error) {
	queue := []string{dir}
	for len(queue) > 0 && budget > 0 {
		dir, queue = queue[0], queue[1:]
		d, err := OpenDir(ctx, fs, dir)
		if err != nil {
			continue
		}
		for ; budget > 0; budget-- {
			e, _, err := d.Next(ctx, false)
			if err != nil {
				break
			}
			p := Join(dir, e.Name)
			if e.Ino == id.Ino {
				if a, err := fs.Getattr(ctx, p); err == nil && a.Dev == id.Dev && a.Branch == id.Branch && a.Ino == id.Ino {
					d.Close()
					return p, nil
				}
			}
			if e.Mode&syscall.S_IFMT == syscall.S_IFDIR {
				queue = append(queue, p)
			}
		}
		d.Close()
	}
	return "", syscall.ESTALE
}
