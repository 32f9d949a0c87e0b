package layer

import (
	"context"
	"syscall"
)

// FileReopener is an optional interface of File: a file that can open its
// object again, with other flags, from itself rather than from a path, so
// that an object with no name left (removed while open) can still be
// opened, as open_by_handle_at of such a file does on ext4. The new file
// is independent of the old one (either may be released first).
//
// local's files implement it; a layer whose files wrap their lower's
// implements it by wrapping the lower's reopened file (Hooked does), and
// any other layer's files do not (ReopenFile then answers ENOTSUP): a
// wrapper must not forward it as BaseFile forwards the rest, since the
// lower's new file would come out unwrapped.
type FileReopener interface {
	ReopenFile(ctx context.Context, flags int) (File, error)
}

// ReopenFile is f's FileReopener.ReopenFile; ENOTSUP when f has none.
func ReopenFile(ctx context.Context, f File, flags int) (File, error) {
	if r, ok := f.(FileReopener); ok {
		return r.ReopenFile(ctx, flags)
	}
	return nil, syscall.ENOTSUP
}
