// Package mux is the smallest fan-out layer: it shows each of its lowers as
// a directory of its root, named by the "names" option ("0", "1", ... by
// default). It proves the layer API for layers over several lowers (union,
// replica and shard build on the same shape) and is handy to browse several
// stacks through one mount.
package mux

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/registry"
)

// FS shows each lower as a top-level directory. It keeps the writeback
// cache (layer.FSWriteback) where all its lowers do: it only routes.
type FS struct {
	layer.NotImplemented
	lowers []layer.FS
	names  []string
	byName map[string]int
}

// New builds a mux over lowers; names may be nil.
func New(lowers []layer.FS, names []string) (*FS, error) {
	if len(names) == 0 {
		for i := range lowers {
			names = append(names, strconv.Itoa(i))
		}
	}
	if len(names) != len(lowers) {
		return nil, syscall.EINVAL
	}
	m := &FS{lowers: lowers, names: names, byName: map[string]int{}}
	for i, n := range names {
		m.byName[n] = i
	}
	return m, nil
}

func init() {
	registry.Register(registry.Type{
		Name:      "mux",
		Summary:   "shows each lower as a directory of its root (a fan-out example)",
		MinLowers: 1, MaxLowers: -1,
		Changes: layer.ChangesPlacement,
		Options: []registry.Option{
			{Name: "names", Kind: registry.List, Help: "directory names for the lowers, in order (default 0, 1, ...)"},
		},
		Check: func(o registry.Values, lowers int) error {
			names := o.List("names")
			if len(names) != 0 && len(names) != lowers {
				return &registry.OptionError{Option: "names", Err: fmt.Errorf("%d names for %d lowers: give one name for each layer of over, in order", len(names), lowers)}
			}
			seen := map[string]bool{}
			for _, n := range names {
				if n == "" || n == "." || n == ".." || strings.Contains(n, "/") || seen[n] {
					return &registry.OptionError{Option: "names", Err: fmt.Errorf("%q cannot name a lower: names are distinct, non-empty, and hold no /", n)}
				}
				seen[n] = true
			}
			return nil
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) { return New(l, o.List("names")) },
	})
}

func (m *FS) Lowers() []layer.FS     { return m.lowers }
func (m *FS) Changes() layer.Changes { return layer.ChangesPlacement }

// route splits a path into the lower it lives in and the path there. The
// root itself has no lower.
func (m *FS) route(path string) (layer.FS, string, error) {
	i, rest, err := m.index(path)
	if err != nil {
		return nil, "", err
	}
	return m.lowers[i], rest, nil
}

func (m *FS) index(path string) (int, string, error) {
	first, rest, _ := strings.Cut(path, "/")
	i, ok := m.byName[first]
	if !ok {
		return 0, "", syscall.ENOENT
	}
	return i, rest, nil
}

// Objects of different lowers must never share an identity, even when two
// lowers are one file system: every Attr that comes up is tagged with the
// lower's branch (layer.TagBranch), and so are the open files'.

// attr tags the attributes a lower returned for path:
// m.attr(path)(l.Getattr(ctx, p)).
func (m *FS) attr(path string) func(layer.Attr, error) (layer.Attr, error) {
	return func(a layer.Attr, err error) (layer.Attr, error) {
		if err == nil {
			i, _, _ := m.index(path)
			layer.TagBranch(&a, i, len(m.lowers))
		}
		return a, err
	}
}

func (m *FS) file(path string, f layer.File) layer.File {
	i, _, _ := m.index(path)
	return &fanout.File{BaseFile: layer.BaseFile{Lower: f}, I: i, N: len(m.lowers)}
}

// routeEntry is route for operations that create or remove the named
// entry: the lowers' roots themselves cannot be touched.
func (m *FS) routeEntry(path string) (layer.FS, string, error) {
	if path == "" || !strings.Contains(path, "/") {
		return nil, "", syscall.EPERM
	}
	return m.route(path)
}

func (m *FS) Getattr(ctx context.Context, path string) (layer.Attr, error) {
	if path == "" {
		return layer.Attr{Ino: 1, Mode: syscall.S_IFDIR | 0o555, Nlink: uint32(2 + len(m.lowers)), Blksize: 4096}, nil
	}
	l, p, err := m.route(path)
	if err != nil {
		return layer.Attr{}, err
	}
	a, err := l.Getattr(ctx, p)
	return m.attr(path)(a, err)
}

func (m *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	if path == "" {
		var out []layer.DirEntry
		for i, n := range m.names {
			e := layer.DirEntry{Name: n, Mode: syscall.S_IFDIR}
			if plus {
				if a, err := m.lowers[i].Getattr(ctx, ""); err == nil {
					layer.TagBranch(&a, i, len(m.lowers))
					e.Attr, e.Ino = &a, a.Ino
				}
			}
			out = append(out, e)
		}
		return out, nil
	}
	d, err := m.OpenDir(ctx, path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return layer.ReadDirAll(ctx, d, plus)
}

// OpenDir streams a lower's listing, tagged with its branch; the root's
// (the lowers' names) is listed whole.
func (m *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	if path == "" {
		return layer.ListedDir(m, ""), nil
	}
	i, p, err := m.index(path)
	if err != nil {
		return nil, err
	}
	ld, err := layer.OpenDir(ctx, m.lowers[i], p)
	if err != nil {
		return nil, err
	}
	return layer.MapDir(ld, func(_ context.Context, e *layer.DirEntry) (bool, error) {
		if e.Attr != nil {
			layer.TagBranch(e.Attr, i, len(m.lowers))
		}
		return true, nil
	}), nil
}

func (m *FS) Setattr(ctx context.Context, path string, in *layer.SetAttr) (layer.Attr, error) {
	if path == "" {
		return layer.Attr{}, syscall.EPERM
	}
	l, p, err := m.route(path)
	if err != nil {
		return layer.Attr{}, err
	}
	a, err := l.Setattr(ctx, p, in)
	return m.attr(path)(a, err)
}

func (m *FS) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	l, p, err := m.route(path)
	if err != nil {
		return nil, err
	}
	f, err := l.Open(ctx, p, flags)
	if err != nil {
		return nil, err
	}
	return m.file(path, f), nil
}

func (m *FS) Create(ctx context.Context, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	f, a, err := l.Create(ctx, p, flags, mode)
	if err != nil {
		return nil, a, err
	}
	a, _ = m.attr(path)(a, nil)
	return m.file(path, f), a, nil
}

func (m *FS) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return layer.Attr{}, err
	}
	return m.attr(path)(l.Mkdir(ctx, p, mode))
}

func (m *FS) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (layer.Attr, error) {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return layer.Attr{}, err
	}
	return m.attr(path)(l.Mknod(ctx, p, mode, rdev))
}

func (m *FS) Symlink(ctx context.Context, target, path string) (layer.Attr, error) {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return layer.Attr{}, err
	}
	return m.attr(path)(l.Symlink(ctx, target, p))
}

func (m *FS) Readlink(ctx context.Context, path string) (string, error) {
	l, p, err := m.route(path)
	if err != nil {
		return "", err
	}
	return l.Readlink(ctx, p)
}

// two routes two paths; both must be in the same lower.
func (m *FS) two(a, b string) (layer.FS, string, string, error) {
	la, pa, err := m.routeEntry(a)
	if err != nil {
		return nil, "", "", err
	}
	lb, pb, err := m.routeEntry(b)
	if err != nil {
		return nil, "", "", err
	}
	if la != lb {
		return nil, "", "", syscall.EXDEV
	}
	return la, pa, pb, nil
}

func (m *FS) Link(ctx context.Context, oldpath, newpath string) (layer.Attr, error) {
	l, a, b, err := m.two(oldpath, newpath)
	if err != nil {
		return layer.Attr{}, err
	}
	return m.attr(newpath)(l.Link(ctx, a, b))
}

func (m *FS) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	l, a, b, err := m.two(oldpath, newpath)
	if err != nil {
		return err
	}
	return l.Rename(ctx, a, b, flags)
}

func (m *FS) Unlink(ctx context.Context, path string) error {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return err
	}
	return l.Unlink(ctx, p)
}

func (m *FS) Rmdir(ctx context.Context, path string) error {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return err
	}
	return l.Rmdir(ctx, p)
}

func (m *FS) Getxattr(ctx context.Context, path, name string, dest []byte) (int, error) {
	l, p, err := m.route(path)
	if err != nil {
		return 0, layer.ENOATTR
	}
	return l.Getxattr(ctx, p, name, dest)
}

func (m *FS) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return err
	}
	return l.Setxattr(ctx, p, name, value, flags)
}

func (m *FS) Listxattr(ctx context.Context, path string, dest []byte) (int, error) {
	if path == "" {
		return 0, nil
	}
	l, p, err := m.route(path)
	if err != nil {
		return 0, err
	}
	return l.Listxattr(ctx, p, dest)
}

func (m *FS) Removexattr(ctx context.Context, path, name string) error {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return err
	}
	return l.Removexattr(ctx, p, name)
}

// Statfs of the root sums the lowers' (fanout.Statfs); below, each lower
// answers.
func (m *FS) Statfs(ctx context.Context, path string) (layer.Statfs, error) {
	if path != "" {
		l, p, err := m.route(path)
		if err != nil {
			return layer.Statfs{}, err
		}
		return l.Statfs(ctx, p)
	}
	return fanout.Statfs(ctx, m.lowers)
}

// SyncDir of the root syncs every lower's root.
func (m *FS) SyncDir(ctx context.Context, path string) error {
	if path == "" {
		return fanout.All(fanout.Each(len(m.lowers), true, func(i int) error { return m.lowers[i].SyncDir(ctx, "") }))
	}
	l, p, err := m.route(path)
	if err != nil {
		return err
	}
	return l.SyncDir(ctx, p)
}

// Tmpfile makes the unnamed file in the directory's lower; the root, which
// is mux's own, takes none (EPERM, as for every entry made there).
func (m *FS) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	if dir == "" {
		return nil, layer.Attr{}, syscall.EPERM
	}
	l, p, err := m.route(dir)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	f, a, err := l.Tmpfile(ctx, p, flags, mode)
	if err != nil {
		return nil, a, err
	}
	a, _ = m.attr(dir)(a, nil)
	return m.file(dir, f), a, nil
}

// LinkFile links a file of one lower into the same lower (EXDEV otherwise).
func (m *FS) LinkFile(ctx context.Context, f layer.File, newpath string) (layer.Attr, error) {
	mf, ok := f.(*fanout.File)
	if !ok {
		return layer.Attr{}, syscall.EXDEV
	}
	i, _, err := m.index(newpath)
	if err != nil {
		return layer.Attr{}, err
	}
	l, p, err := m.routeEntry(newpath)
	if err != nil {
		return layer.Attr{}, err
	}
	if i != mf.I {
		return layer.Attr{}, syscall.EXDEV
	}
	return m.attr(newpath)(l.LinkFile(ctx, mf.Lower, p))
}

// GetFlags gives a lower object's flags; the root's are none.
func (m *FS) GetFlags(ctx context.Context, path string) (uint32, error) {
	if path == "" {
		return 0, nil
	}
	l, p, err := m.route(path)
	if err != nil {
		return 0, err
	}
	return l.GetFlags(ctx, p)
}

func (m *FS) SetFlags(ctx context.Context, path string, flags uint32) error {
	if path == "" {
		return syscall.EPERM
	}
	l, p, err := m.route(path)
	if err != nil {
		return err
	}
	return l.SetFlags(ctx, p, flags)
}
