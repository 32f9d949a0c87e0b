package fs

import "cairnfs.dev/cairn/third_party/gofuse/fuse"

func setBlocks(out *fuse.Attr) {
}
