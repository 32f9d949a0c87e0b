package codec

import (
	"context"

	"cairnfs.dev/cairn/layer"
)

// LockName is the file at the root of the lower that the claim locks (and
// the layer hides): the lock that the other machines of a network file
// system see (docs/distributed.md).
const LockName = ".cairn-codec.lock"

// Reserved hides the claim's lock file and the files of a conversion
// under way (layer.Reserver).
func (fs *Engine) Reserved(lp string) bool { return lp == LockName || fs.reservedConvert(lp) }

// InUseError says that a codec layer's lower files are already served or
// checked by another process: a mount of the same stack, or an fsck.
type InUseError = layer.InUseError

// Claim claims every Claimer of the stack under top (layer.ClaimStack).
func Claim(ctx context.Context, top layer.FS) error { return layer.ClaimStack(ctx, top) }

// Claim takes an exclusive advisory lock (flock) on the layer's lower root
// directory, held until the layer is closed (layer.Claimer). `cairn mount`
// and `cairn fsck` claim their stacks: an fsck of a mounted stack, or a
// second mount of the same files, gets an *InUseError instead of working
// on files that a daemon changes (the engine keeps state in memory: two
// engines on one file corrupt it). A codec layer over a layer that changes
// data (no descriptor to lock) is not locked.
func (fs *FS) Claim(ctx context.Context) error {
	fs.rmu.Lock()
	claimed := fs.release != nil
	fs.rmu.Unlock()
	if claimed {
		return nil
	}
	// The lock file: a regular file, whose lock other clients of a
	// network file system see (the directory's flock is this machine's
	// only); hidden above (Engine.Reserved). Shared with other shared
	// claims (cairn mount -shared): a closed file's state in memory is
	// dropped when the lower file changed (dropStale), so that mounts
	// that take turns read what the other wrote.
	release, err := layer.LockLowerOwn(ctx, fs.Lower, fs.e.kind.Name, LockName, layer.SharedClaim(ctx))
	if err != nil {
		return err
	}
	fs.e.shared = layer.SharedClaim(ctx) // before any file is served
	fs.rmu.Lock()
	fs.release = release // the lock lives until Close calls it
	fs.rmu.Unlock()
	return nil
}
