package crypt

import (
	"context"
	"crypto/rand"
	"log/slog"
	"sync"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Content is crypt's content encryption as a layer.Transform: it seals
// the bytes of each file it is given in the file of the same path below,
// in the format of docs/crypt.md, and leaves names to whoever applies it
// (the crypt layer encrypts them; a chain keeps them).
type Content struct {
	Lower layer.FS
	c     *content
	log   *slog.Logger

	mu        sync.Mutex
	files     map[layer.ID]*fileState // open files, by lower identity (device, branch, inode)
	pending   map[string]bool         // journals left by a crash (journal.go), by path
	root      layer.ID                // the lower root's identity: its device and branch name journals
	noJournal bool
}

var _ layer.Transform = (*Content)(nil)

// NewContent makes the content encryption of the volume whose configuration
// is cfg and master key master, storing files in lower. Only o.Rand,
// o.Logger and o.NoJournal apply.
func NewContent(lower layer.FS, cfg *Config, master []byte, o Options) (*Content, error) {
	if err := cfg.CheckMasterKey(master); err != nil {
		return nil, err
	}
	if o.Rand == nil {
		o.Rand = rand.Reader
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	c, err := newContent(cfg.Cipher, keep(subkey(master, "content", 32)), cfg.BlockSize, o.Rand)
	if err != nil {
		return nil, err
	}
	t := &Content{Lower: lower, c: c, log: o.Logger, files: map[layer.ID]*fileState{}, noJournal: o.NoJournal}
	if a, err := lower.Getattr(context.Background(), ""); err == nil {
		t.root = a.ID()
	}
	t.loadPending(context.Background())
	return t, nil
}

// Stat gives the plaintext size of a regular file from its size below (no
// read: every block but the last is full).
func (fs *Content) Stat(ctx context.Context, lp string, a *layer.Attr) error {
	if a.IsRegular() {
		a.Size, _ = fs.c.plainSize(a.Size)
	}
	return nil
}

// Truncate sets the plaintext size of the file at lp.
func (fs *Content) Truncate(ctx context.Context, lp, path string, size int64) error {
	f, err := fs.open(ctx, lp, path, unix.O_WRONLY)
	if err != nil {
		return err
	}
	_, err = f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)})
	if rerr := f.Release(ctx); err == nil {
		err = rerr
	}
	return err
}

// Settle has nothing to do: writes reach the lower file at once.
func (fs *Content) Settle(ctx context.Context, id layer.ID) error { return nil }

// Forget has nothing to do: a file's state lives while it is open.
func (fs *Content) Forget(ctx context.Context, id layer.ID) {}

// Close has nothing to do: nothing is kept open between opens.
func (fs *Content) Close() error { return nil }

// Reserved: the journal directory at the root of the lower is the
// transform's own (layer.Reserver).
func (fs *Content) Reserved(lp string) bool { return lp == journalDir }
