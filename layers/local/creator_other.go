//go:build !linux

package local

import (
	"context"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// creators: the BSDs have no per-thread umask or file-system identity to
// create objects with (creator_linux.go), so asCaller creates them as the
// daemon and then gives them to the caller.
type creators struct{}

func (cs *creators) close() {}

// asCaller runs mk, which creates dfd/name with the mode it is given, with
// the caller's umask applied; when the daemon runs as root and the caller
// is not, the object then gets the caller as owner (its group stays the
// directory's, as the BSDs give every new object). Set-id bits are added
// only after the chown, so that no root-owned set-id file is ever
// executable by the caller. A default ACL of the directory is not
// consulted (the BSDs' ACLs are not POSIX.1e xattrs). The kernel checked
// the caller's right to create (default_permissions).
func (fs *FS) asCaller(ctx context.Context, dfd int, name string, mode uint32, mk func(mode uint32) error) error {
	c := layer.CallerOf(ctx)
	mode &^= c.Umask & 0o777
	chown := fs.asOwner && c.Uid != 0
	if !chown {
		return mk(mode)
	}
	if err := mk(mode &^ 0o6000); err != nil {
		return err
	}
	if err := unix.Fchownat(dfd, name, int(c.Uid), -1, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if unix.Unlinkat(dfd, name, 0) != nil {
			unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
		}
		return err
	}
	if mode&0o6000 != 0 {
		return unix.Fchmodat(dfd, name, mode&0o7777, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}
