//go:build !linux

package fs

import "cairnfs.dev/cairn/third_party/gofuse/fuse"

func (b *rawBridge) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	return fuse.ENOSYS
}
