// Package readonly is the layer that docs/write-a-layer.md builds: it
// refuses every change to the paths its patterns cover, with EROFS.
package readonly

import (
	"context"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/pathmatch"
	"cairnfs.dev/cairn/registry"
)

// FS is a read-only layer.
type FS struct {
	layer.Hooked
	paths *pathmatch.Set // nil: every path
}

// New stacks a read-only layer over lower; paths are patterns (none: all).
func New(lower layer.FS, paths []string) (*FS, error) {
	fs := &FS{}
	fs.Lower, fs.Hook = lower, fs
	if len(paths) > 0 {
		s, err := pathmatch.NewSet(paths, nil)
		if err != nil {
			return nil, err
		}
		fs.paths = s
	}
	return fs, nil
}

// changes lists the operations that change something.
var changes = map[string]bool{
	"setattr": true, "create": true, "mkdir": true, "mknod": true, "symlink": true,
	"link": true, "unlink": true, "rmdir": true, "rename": true, "setxattr": true,
	"removexattr": true, "fsetattr": true, "fallocate": true,
}

// Before refuses the changes to covered paths.
func (fs *FS) Before(ctx context.Context, op *layer.Op) error {
	change := changes[op.Name] ||
		op.Name == "open" && (op.Flags&unix.O_ACCMODE != unix.O_RDONLY || op.Flags&unix.O_TRUNC != 0)
	if change && (fs.covers(op.Path) || op.Name == "rename" && fs.covers(op.Path2)) {
		return syscall.EROFS
	}
	return nil
}

func (fs *FS) covers(path string) bool { return fs.paths == nil || fs.paths.Contains(path) }

// After has nothing to do.
func (fs *FS) After(context.Context, *layer.Op) {}

func init() {
	registry.Register(registry.Type{
		Name:      "readonly",
		Summary:   "refuses every change (EROFS), to everything or to the paths given",
		MinLowers: 1, MaxLowers: 1,
		Options: []registry.Option{
			{Name: "paths", Kind: registry.List, Help: "patterns of the paths to protect (default: all)"},
		},
		New: func(l []layer.FS, o registry.Values) (layer.FS, error) {
			return New(l[0], o.List("paths"))
		},
	})
}
