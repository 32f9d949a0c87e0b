package crypt

import (
	"context"
	"syscall"

	"cairnfs.dev/cairn/layer"
)

// FSCaps: no O_TMPFILE (EOPNOTSUPP, as on many file systems): an encrypted
// file is made with its header and named when it is made; a file of no
// name would need both at its link. The writeback cache (layer.FSWriteback)
// is kept: its writes come later and larger, page-aligned, through any of
// the object's files open for writing, which share the object's state
// (size, blocks); partial blocks are read and rewritten as for any write,
// and the kernel's reads of partial pages are ordinary reads.
func (fs *FS) FSCaps() layer.FSCaps { return layer.FSCapsOf(fs.Lower) &^ layer.FSTmpfile }

func (fs *FS) Tmpfile(context.Context, string, int, uint32) (layer.File, layer.Attr, error) {
	return nil, layer.Attr{}, syscall.EOPNOTSUPP
}

func (fs *FS) LinkFile(context.Context, layer.File, string) (layer.Attr, error) {
	return layer.Attr{}, syscall.EOPNOTSUPP
}

// GetFlags gives the lower object's inode flags.
func (fs *FS) GetFlags(ctx context.Context, path string) (uint32, error) {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return 0, err
	}
	return fs.Lower.GetFlags(ctx, lp)
}

// SetFlags sets the lower object's inode flags, which the lower enforces
// (immutable: no write, rename or unlink through the layer either), except
// two that would break the layer (EOPNOTSUPP): append-only, since appends
// rewrite the last block of a file in place, and case folding, under which
// distinct encrypted names could be one.
func (fs *FS) SetFlags(ctx context.Context, path string, flags uint32) error {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return err
	}
	return layer.SetFlagsExcept(ctx, fs.Lower, lp, flags, layer.FlagAppend|layer.FlagCasefold)
}
