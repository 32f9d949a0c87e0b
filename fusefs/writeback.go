package fusefs

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"cairnfs.dev/cairn/third_party/gofuse/fuse"

	"cairnfs.dev/cairn/layer"
)

// The writeback cache (Options.Writeback, FUSE_WRITEBACK_CACHE). The kernel
// keeps the writes of files that are not passed through in its page cache
// and sends them later, a page run at a time (up to MaxWrite), when it
// writes dirty pages back: at fsync and close (FLUSH waits for them), under
// memory pressure, or after the dirty expiry. It then owns what those writes
// change: a regular file's size, mtime and ctime are the kernel's own while
// it has the inode (it ignores the ones GETATTR gives), and it sends its
// mtime and ctime in a SETATTR at close and fsync. That is right only when
// nothing but the mount changes the lowers (an exclusive stack), which is
// why the option is refused on any other.
//
// It costs FUSE passthrough, for the whole mount: the kernel takes no
// backing file on a connection with the writeback cache (fs/fuse/inode.c,
// process_init_reply, since Linux 6.10: "current design doesn't handle
// them together"). Every file, those a layer would pass through too, is
// then served by the daemon through the kernel's page cache.
//
// What it asks of the daemon (Documentation/filesystems/fuse-io.rst, libfuse's
// passthrough_hp does the same):
//   - the kernel fills the rest of a page partly written from the file
//     itself, by a READ through the file being written, which may have been
//     opened O_WRONLY: such files are opened O_RDWR below (wbOpen);
//   - the kernel places appends itself (the offset of each WRITE is where
//     it put the bytes, at the end of the file as it knows it): files are
//     opened below without O_APPEND, which would put a page written back
//     at the end once more;
//   - a WRITE answered short would lose the rest without an error (the
//     application's write(2) returned long ago): file.Write writes it all
//     or fails;
//   - SEEK_DATA and SEEK_HOLE reach the daemon without the kernel writing
//     its pages back first: the stack would call the bytes still cached a
//     hole. LSEEK is answered ENOSYS, after which the kernel answers them
//     itself, the whole file data up to its size (no holes reported, as
//     POSIX allows);
//   - an open that does not keep the cache (FOPEN_KEEP_CACHE) makes the
//     kernel write every dirty page of the file back first, one WRITE a
//     page: every file keeps it (openFlags);
//   - errors of the lower surface at fsync and close: the kernel records a
//     failed writeback on the file's mapping, and fsync(2) and the next
//     close(2) of a descriptor of the file report it (docs/posix.md).
//
// A file that may not be opened for reading (a mode or an acl rule that
// allows writing only), or not without O_APPEND (an append-only file,
// chattr +a), is opened as asked and served with direct I/O: each write(2)
// is a WRITE, with the kernel's offset, as without the cache.

// wbOpen opens a file with flags through open, under the writeback cache's
// rules: it returns FOPEN_DIRECT_IO for a file opened as asked because the
// lower refused the rules' flags, else 0.
func (st *state) wbOpen(flags uint32, open func(flags uint32) error) (uint32, error) {
	if !st.writeback {
		return 0, open(flags)
	}
	wb := flags &^ syscall.O_APPEND
	if wb&syscall.O_ACCMODE == syscall.O_WRONLY {
		wb = wb&^syscall.O_ACCMODE | syscall.O_RDWR
	}
	err := open(wb)
	if wb == flags || !(errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)) {
		return 0, err
	}
	return fuse.FOPEN_DIRECT_IO, open(flags)
}

// WritebackRefused says why the stack top may not have the kernel's
// writeback cache (nil if it may): its lowers must change only through it
// (layer.IsExclusive, not shared), and every layer must take it
// (layer.FSWriteback).
func WritebackRefused(top layer.FS, shared bool) error {
	if shared || !layer.IsExclusive(top) {
		return errors.New("-writeback: the writeback cache needs an exclusive stack (local lowers that change only through the mount: " +
			"not shared, not on a network or FUSE file system): the kernel keeps the sizes and times of the files it caches as its own, " +
			"and writes their bytes back later")
	}
	if v := writebackVeto(top); v != nil {
		return fmt.Errorf("-writeback: the %s layer refuses the writeback cache (see docs/posix.md, \"Caching\")", layerName(v))
	}
	return nil
}

// writebackVeto is a layer of fs (fs itself or below it) that masks
// FSWriteback while all its lowers have it; nil if fs has it.
func writebackVeto(fs layer.FS) layer.FS {
	if layer.FSCapsOf(fs)&layer.FSWriteback != 0 {
		return nil
	}
	for _, l := range fs.Lowers() {
		if v := writebackVeto(l); v != nil {
			return v
		}
	}
	return fs
}

// layerName is the package of l's type: "snoop" for *snoop.FS.
func layerName(l layer.FS) string {
	n := strings.TrimPrefix(fmt.Sprintf("%T", l), "*")
	n, _, _ = strings.Cut(n, ".")
	return n
}
