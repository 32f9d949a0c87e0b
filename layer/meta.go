package layer

import (
	"bytes"
	"context"
	"os"
	"syscall"
)

// Meta keeps a layer's side data on the objects of its lower: a recorded
// chain of transformations, an opaque mark, a replica's dirty flag. Each
// value is an extended attribute of the lower object, under a name that
// belongs to the layer ("trusted.cairn.NAME.KEY" when the daemon runs as
// root, "user.cairn.NAME.KEY" otherwise, which Linux does not allow on
// symbolic links and device nodes). Being part of the object, side data
// moves with its renames, is shared by its hard links, goes with its last
// unlink, never keeps a directory from being removed, and needs no repair
// after a crash (each Set is one atomic setxattr). A lower without
// extended attributes gives EOPNOTSUPP.
//
// The values are the layer's own: the layer embeds MetaBase instead of
// Base, which hides them from the layers and users above (listxattr leaves
// them out, getxattr says ENODATA, setxattr and removexattr EPERM). Get,
// Set and Remove run as the stack's own operations (AsSelf). Side data
// that belongs to no one object (a journal, lost+found) stays in files of
// the layer's own, which the layer hides from listings.
type Meta struct {
	lower  FS
	prefix string
}

// NewMeta gives the layer called name side data on lower's objects.
func NewMeta(lower FS, name string) *Meta {
	ns := "user."
	if os.Geteuid() == 0 {
		ns = "trusted."
	}
	return &Meta{lower: lower, prefix: ns + "cairn." + name + "."}
}

// Prefix is the attribute name prefix the layer's values are kept under.
func (m *Meta) Prefix() string { return m.prefix }

// Owns reports whether the xattr name is one of the layer's values.
func (m *Meta) Owns(name string) bool {
	return len(name) > len(m.prefix) && name[:len(m.prefix)] == m.prefix
}

// Get returns the value of key on path's object (ENODATA if it has none).
func (m *Meta) Get(ctx context.Context, path, key string) ([]byte, error) {
	ctx = AsSelf(ctx)
	for {
		n, err := m.lower.Getxattr(ctx, path, m.prefix+key, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = m.lower.Getxattr(ctx, path, m.prefix+key, buf)
		if err == syscall.ERANGE {
			continue // it grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// Set stores v as key on path's object.
func (m *Meta) Set(ctx context.Context, path, key string, v []byte) error {
	return m.lower.Setxattr(AsSelf(ctx), path, m.prefix+key, v, 0)
}

// Remove drops key from path's object (ENODATA if it has none).
func (m *Meta) Remove(ctx context.Context, path, key string) error {
	return m.lower.Removexattr(AsSelf(ctx), path, m.prefix+key)
}

// MetaBase is Base for a layer that keeps side data with Meta: it forwards
// every operation, and keeps the layer's values away from the layers and
// users above.
type MetaBase struct {
	Base
	Meta *Meta
}

func (b *MetaBase) Getxattr(ctx context.Context, path, name string, dest []byte) (int, error) {
	if b.Meta.Owns(name) {
		return 0, ENOATTR
	}
	return b.Lower.Getxattr(ctx, path, name, dest)
}

func (b *MetaBase) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	if b.Meta.Owns(name) {
		return syscall.EPERM
	}
	return b.Lower.Setxattr(ctx, path, name, value, flags)
}

func (b *MetaBase) Removexattr(ctx context.Context, path, name string) error {
	if b.Meta.Owns(name) {
		return syscall.EPERM
	}
	return b.Lower.Removexattr(ctx, path, name)
}

// Listxattr leaves the layer's values out of the list.
func (b *MetaBase) Listxattr(ctx context.Context, path string, dest []byte) (int, error) {
	var all []byte
	for {
		n, err := b.Lower.Listxattr(ctx, path, nil)
		if err != nil {
			return 0, err
		}
		all = make([]byte, n)
		n, err = b.Lower.Listxattr(ctx, path, all)
		if err == syscall.ERANGE {
			continue
		}
		if err != nil {
			return 0, err
		}
		all = all[:n]
		break
	}
	var out []byte
	for _, name := range bytes.SplitAfter(all, []byte{0}) {
		if len(name) > 1 && !b.Meta.Owns(string(name[:len(name)-1])) {
			out = append(out, name...)
		}
	}
	if len(dest) == 0 {
		return len(out), nil
	}
	if len(dest) < len(out) {
		return 0, syscall.ERANGE
	}
	return copy(dest, out), nil
}
