package local

import "sync/atomic"

// Exclusive says that the directory changes only through this layer
// (layer.Exclusive), so that the kernel may keep its names, attributes and
// listings until they change through the mount: cairn is the only writer
// of the lower that it serves, as overlayfs takes its upper directory to
// be. Not so when the layer's `shared` option is set (other programs write
// into the directory too), when the stack is mounted -shared (Share), or
// when the directory is on a network or FUSE file system (networked), which
// other machines or processes change as a rule. The writeback cache
// (layer.FSWriteback, which a local directory keeps) needs it too: the
// kernel then holds the sizes and times of files it caches as its own.
func (fs *FS) Exclusive() bool {
	return !fs.shared.Load() && !fs.networked
}

// SetShared marks the directory as changed by others too (the layer's
// `shared` option): see Exclusive.
func (fs *FS) SetShared() { fs.shared.Store(true) }

// sharedFlag is FS.shared.
type sharedFlag = atomic.Bool
