// Package mux is the smallest fan-out layer: it shows each of its lowers as
// a directory of its root, named by the "names" option ("0", "1", ... by
// default). It proves the layer API for layers over several lowers (union,
// replica and shard build on the same shape) and is handy to browse several
// stacks through one mount.
package mux

import (
	"context"
	"strconv"
	"strings"
	"syscall"

	"cairn/layer"
	"cairn/registry"
)

// FS shows each lower as a top-level directory.
type FS struct {
	layer.NotImplemented
	lowers []layer.FS
	names  []string
	byName map[string]layer.FS
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
	m := &FS{lowers: lowers, names: names, byName: map[string]layer.FS{}}
	for i, n := range names {
		m.byName[n] = lowers[i]
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
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) { return New(l, o.List("names")) },
	})
}

func (m *FS) Lowers() []layer.FS     { return m.lowers }
func (m *FS) Changes() layer.Changes { return layer.ChangesPlacement }

// route splits a path into the lower it lives in and the path there. The
// root itself has no lower.
func (m *FS) route(path string) (layer.FS, string, error) {
	first, rest, _ := strings.Cut(path, "/")
	l, ok := m.byName[first]
	if !ok {
		return nil, "", syscall.ENOENT
	}
	return l, rest, nil
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
	return l.Getattr(ctx, p)
}

func (m *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	if path == "" {
		var out []layer.DirEntry
		for i, n := range m.names {
			e := layer.DirEntry{Name: n, Mode: syscall.S_IFDIR}
			if plus {
				if a, err := m.lowers[i].Getattr(ctx, ""); err == nil {
					e.Attr, e.Ino = &a, a.Ino
				}
			}
			out = append(out, e)
		}
		return out, nil
	}
	l, p, err := m.route(path)
	if err != nil {
		return nil, err
	}
	return l.ReadDir(ctx, p, plus)
}

func (m *FS) Setattr(ctx context.Context, path string, in *layer.SetAttr) (layer.Attr, error) {
	if path == "" {
		return layer.Attr{}, syscall.EPERM
	}
	l, p, err := m.route(path)
	if err != nil {
		return layer.Attr{}, err
	}
	return l.Setattr(ctx, p, in)
}

func (m *FS) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	l, p, err := m.route(path)
	if err != nil {
		return nil, err
	}
	return l.Open(ctx, p, flags)
}

func (m *FS) Create(ctx context.Context, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	return l.Create(ctx, p, flags, mode)
}

func (m *FS) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return layer.Attr{}, err
	}
	return l.Mkdir(ctx, p, mode)
}

func (m *FS) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (layer.Attr, error) {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return layer.Attr{}, err
	}
	return l.Mknod(ctx, p, mode, rdev)
}

func (m *FS) Symlink(ctx context.Context, target, path string) (layer.Attr, error) {
	l, p, err := m.routeEntry(path)
	if err != nil {
		return layer.Attr{}, err
	}
	return l.Symlink(ctx, target, p)
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
	return l.Link(ctx, a, b)
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
		return 0, syscall.ENODATA
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

// Statfs of the root is the first lower's; below, each lower answers.
func (m *FS) Statfs(ctx context.Context, path string) (layer.Statfs, error) {
	if path != "" {
		l, p, err := m.route(path)
		if err != nil {
			return layer.Statfs{}, err
		}
		return l.Statfs(ctx, p)
	}
	return m.lowers[0].Statfs(ctx, "")
}

func (m *FS) SyncDir(ctx context.Context, path string) error {
	if path == "" {
		return nil
	}
	l, p, err := m.route(path)
	if err != nil {
		return err
	}
	return l.SyncDir(ctx, p)
}
