package codec

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"cairn/layer"
)

// InUseError says that a codec layer's lower files are already served or
// checked by another process: a mount of the same stack, or an fsck.
type InUseError struct {
	Codec string // the layer's codec
	Dir   string // its lower directory, if known
}

func (e *InUseError) Error() string {
	where := ""
	if e.Dir != "" {
		where = " in " + e.Dir
	}
	return fmt.Sprintf("the files of the %s layer%s are in use by another cairn process (a mount of this stack, or an fsck): unmount it first ('cairn umount MOUNTPOINT')", e.Codec, where)
}

// Claim takes, for every codec layer of the stack under top, an exclusive
// advisory lock (flock) on the layer's lower root directory, held until
// the layer is closed. `cairn mount` and `cairn fsck` claim their stacks:
// an fsck of a mounted stack, or a second mount of the same files, gets an
// *InUseError instead of working on files that a daemon changes (the
// engine keeps state in memory: two engines on one file corrupt it). The
// lock needs a lower directory descriptor: a codec layer over a layer that
// changes data (no descriptor to hand out) is not locked, nor one whose
// lower root cannot be opened.
func Claim(ctx context.Context, top layer.FS) error {
	var err error
	layer.Walk(top, func(l layer.FS) {
		if c, ok := l.(*FS); ok && err == nil {
			err = c.claim(ctx)
		}
	})
	return err
}

func (fs *FS) claim(ctx context.Context) error {
	fs.mu.Lock()
	claimed := fs.claimed != nil
	fs.mu.Unlock()
	if claimed {
		return nil
	}
	d, err := fs.Lower.Open(ctx, "", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil // a lower that has no directory to open (a codec over a codec)
	}
	fd, ok := d.PassthroughFd()
	if !ok || fd < 0 {
		d.Release(ctx)
		return nil
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		d.Release(ctx)
		if err == unix.EWOULDBLOCK {
			return &InUseError{Codec: fs.kind.Name, Dir: lowerDir(fs.Lower)}
		}
		return fmt.Errorf("locking the %s layer's lower directory: %w", fs.kind.Name, err)
	}
	fs.mu.Lock()
	fs.claimed, fs.claimFd = d, fd // the lock lives while fd is open
	fs.mu.Unlock()
	return nil
}

// lowerDir names the directory at the bottom of a chain of one-lower
// layers, for messages.
func lowerDir(l layer.FS) string {
	for l != nil {
		if r, ok := l.(interface{ Root() string }); ok {
			return r.Root()
		}
		ls := l.Lowers()
		if len(ls) != 1 {
			return ""
		}
		l = ls[0]
	}
	return ""
}
