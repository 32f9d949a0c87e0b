package layer

import (
	"context"
	"io"
)

// Dir is an open directory listing, read as a stream: memory bounded
// whatever the directory's size, attributes only when asked, and a cookie
// per entry that Seek returns to (seekdir/telldir).
type Dir interface {
	// Next returns the next entry, without "." and "..", and its cookie:
	// Seek(cookie) continues after that entry. io.EOF ends the listing.
	// With plus, the entry carries its attributes where the layer can give
	// them cheaply.
	Next(ctx context.Context, plus bool) (DirEntry, uint64, error)
	// Seek continues the listing after the entry whose cookie is off; 0
	// is the start. A cookie stays valid while the directory changes:
	// entries that exist throughout are listed once, not twice, whatever
	// is created and removed meanwhile (where the lower's cookies allow:
	// local's are the lower's own, such as ext4's name hashes).
	Seek(ctx context.Context, off uint64) error
	Close() error
}

// DirOpener is an optional interface of FS: a layer that lists its
// directories as streams (local, the Hooked layers). A layer that changes
// nothing (Changes() == 0) and stacks over one lower lists what its lower
// lists: OpenDir streams the lower's directly. Any other layer without it
// is listed through ReadDir, whole, when the directory is opened.
type DirOpener interface {
	OpenDir(ctx context.Context, path string) (Dir, error)
}

// OpenDir opens path's listing in fs as a stream (see DirOpener).
func OpenDir(ctx context.Context, fs FS, path string) (Dir, error) {
	for {
		if d, ok := fs.(DirOpener); ok {
			return d.OpenDir(ctx, path)
		}
		ls := fs.Lowers()
		if fs.Changes() != 0 || len(ls) != 1 {
			break
		}
		fs = ls[0]
	}
	return ListedDir(fs, path), nil
}

// ListedDir streams path's listing as fs.ReadDir gives it, read whole on
// the first Next (and again after Seek(0)); cookies are positions in it:
// for a layer that streams some directories and lists others.
func ListedDir(fs FS, path string) Dir { return &listedDir{fs: fs, path: path} }

// listedDir streams a listing read whole with ReadDir (on the first Next,
// and again after a Seek to 0); cookies are positions in it.
type listedDir struct {
	fs     FS
	path   string
	ents   []DirEntry
	loaded bool
	plus   bool
	pos    int
}

func (d *listedDir) Next(ctx context.Context, plus bool) (DirEntry, uint64, error) {
	if !d.loaded || plus && !d.plus {
		ents, err := d.fs.ReadDir(ctx, d.path, plus)
		if err != nil {
			return DirEntry{}, 0, err
		}
		d.ents, d.loaded, d.plus = ents, true, plus
	}
	if d.pos >= len(d.ents) {
		return DirEntry{}, 0, io.EOF
	}
	d.pos++
	return d.ents[d.pos-1], uint64(d.pos), nil
}

func (d *listedDir) Seek(ctx context.Context, off uint64) error {
	if off == 0 {
		d.loaded, d.pos = false, 0
		return nil
	}
	if !d.loaded || off > uint64(len(d.ents)) {
		return errInvalidSeek
	}
	d.pos = int(off)
	return nil
}

func (d *listedDir) Close() error { return nil }

// ReadDirAll reads a whole stream: ReadDir for a layer that streams.
func ReadDirAll(ctx context.Context, d Dir, plus bool) ([]DirEntry, error) {
	var out []DirEntry
	for {
		e, _, err := d.Next(ctx, plus)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
}

// MapDir is d with each entry passed through fn, which may change it, or
// leave it out (keep false): the stream of a layer that changes names or
// attributes of its lower's entries (crypt, codec). Cookies are d's.
func MapDir(d Dir, fn func(ctx context.Context, e *DirEntry) (keep bool, err error)) Dir {
	return &mappedDir{Dir: d, fn: fn}
}

type mappedDir struct {
	Dir
	fn func(ctx context.Context, e *DirEntry) (bool, error)
}

func (m *mappedDir) Next(ctx context.Context, plus bool) (DirEntry, uint64, error) {
	for {
		e, cookie, err := m.Dir.Next(ctx, plus)
		if err != nil {
			return e, cookie, err
		}
		keep, err := m.fn(ctx, &e)
		if err != nil {
			return DirEntry{}, 0, err
		}
		if keep {
			return e, cookie, nil
		}
	}
}
