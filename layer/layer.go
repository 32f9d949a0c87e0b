// Package layer is cairn's stacking interface: the operations of a POSIX
// file system, expressed over paths, with no dependency on FUSE.
//
// A layer is an FS. It wraps one lower FS (most layers) or several (fan-out
// layers such as union, replica and shard). Following Wrapfs, a layer that
// changes nothing is a few lines: embed Base, which forwards every operation
// to the lower layer, and override only the hooks that make the layer
// different. Open files are File values; BaseFile forwards likewise.
//
// Paths are relative to the layer's root, slash-separated, without a leading
// slash; the root itself is "". Errors are syscall.Errno values where the
// errno matters (ENOENT, EEXIST, ...); any other error reaches the
// application as EIO.
//
// The identity of the calling process travels in the context: see CallerOf.
package layer

import (
	"context"
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// FS is one layer of a stack.
type FS interface {
	// Getattr returns the attributes of path without following a final
	// symbolic link (lstat). It is also the lookup operation.
	Getattr(ctx context.Context, path string) (Attr, error)
	// Setattr changes the attributes selected by in.Valid.
	Setattr(ctx context.Context, path string, in *SetAttr) (Attr, error)
	// ReadDir lists a directory, without "." and "..". With plus set, the
	// entries carry their attributes where the layer can give them cheaply.
	ReadDir(ctx context.Context, path string, plus bool) ([]DirEntry, error)

	// Open opens an existing file. flags are open(2) flags.
	Open(ctx context.Context, path string, flags int) (File, error)
	// Create creates and opens a regular file (O_CREAT is implied).
	Create(ctx context.Context, path string, flags int, mode uint32) (File, Attr, error)
	Mkdir(ctx context.Context, path string, mode uint32) (Attr, error)
	// Mknod creates a device, FIFO or socket; mode includes the type bits.
	Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (Attr, error)
	Symlink(ctx context.Context, target, path string) (Attr, error)
	Readlink(ctx context.Context, path string) (string, error)
	// Link makes newpath a hard link to oldpath.
	Link(ctx context.Context, oldpath, newpath string) (Attr, error)
	Unlink(ctx context.Context, path string) error
	Rmdir(ctx context.Context, path string) error
	// Rename takes renameat2 flags: RENAME_NOREPLACE, RENAME_EXCHANGE.
	Rename(ctx context.Context, oldpath, newpath string, flags uint32) error

	// Getxattr copies the value into dest and returns its size; with an
	// empty dest it returns the size only (ERANGE if dest is too small).
	Getxattr(ctx context.Context, path, name string, dest []byte) (int, error)
	Setxattr(ctx context.Context, path, name string, value []byte, flags int) error
	// Listxattr returns the NUL-separated names, with getxattr's size rules.
	Listxattr(ctx context.Context, path string, dest []byte) (int, error)
	Removexattr(ctx context.Context, path, name string) error

	Statfs(ctx context.Context, path string) (Statfs, error)
	// SyncDir makes the directory's entries durable (fsync of a directory).
	SyncDir(ctx context.Context, path string) error

	// Tmpfile creates and opens a regular file with no name in directory
	// dir (open(2) with O_TMPFILE): flags and mode as Create's, without
	// O_TMPFILE. The file is gone at its last Release unless LinkFile gave
	// it a name. A layer that cannot answers EOPNOTSUPP and masks
	// FSTmpfile from its FSCaps.
	Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (File, Attr, error)
	// LinkFile makes newpath a hard link to the open file f, one of this
	// layer's files, which may have no name (a Tmpfile's): linkat(2) of
	// /proc/self/fd/N.
	LinkFile(ctx context.Context, f File, newpath string) (Attr, error)

	// GetFlags returns the inode flags of the regular file or directory
	// path (FS_IOC_GETFLAGS, lsattr(1): FS_IMMUTABLE_FL, FS_APPEND_FL, ...).
	GetFlags(ctx context.Context, path string) (uint32, error)
	// SetFlags sets them (FS_IOC_SETFLAGS, chattr(1)); the lower enforces
	// what they mean. A layer that a flag would break refuses to set it
	// with EOPNOTSUPP.
	SetFlags(ctx context.Context, path string, flags uint32) error

	// Lowers returns the layers this one stacks over (none for a bottom
	// layer). Tools walk the stack through it.
	Lowers() []FS
	// Changes declares what this layer itself changes; see Changes.
	Changes() Changes
	// Close releases the layer's own resources (not its lowers').
	Close() error
}

// File is an open file of a layer.
type File interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	// WriteAt writes p at off. A file opened with O_APPEND writes at its end
	// whatever off says.
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Getattr(ctx context.Context) (Attr, error)
	Setattr(ctx context.Context, in *SetAttr) (Attr, error)
	// Flush is called on each close(2) of a descriptor.
	Flush(ctx context.Context) error
	Fsync(ctx context.Context, datasync bool) error
	// Release is the last close: the File is not used afterwards.
	Release(ctx context.Context) error
	// Allocate is fallocate(2).
	Allocate(ctx context.Context, off, length int64, mode uint32) error
	// Lseek serves SEEK_DATA and SEEK_HOLE.
	Lseek(ctx context.Context, off int64, whence int) (int64, error)
	// CopyFileRange copies to dst, which is a File of the same layer.
	CopyFileRange(ctx context.Context, offIn int64, dst File, offOut int64, n int64, flags uint32) (int64, error)

	// Getlk, Setlk and Setlkw are POSIX byte-range locks (fcntl); with
	// LockFlock set in flags, Setlk and Setlkw are flock(2) locks. The
	// FUSE frontend does not call them: the kernel keeps a mount's locks
	// (docs/DEVELOPING.md, "The FUSE frontend").
	Getlk(ctx context.Context, owner uint64, lk *Lock, flags uint32) (Lock, error)
	Setlk(ctx context.Context, owner uint64, lk *Lock, flags uint32, wait bool) error

	// PassthroughFd returns a new descriptor of the lower file whose bytes
	// are exactly this file's bytes, so the kernel may do the I/O itself;
	// the caller closes it (it shares the file's open file description,
	// which it keeps alive, locks included, while open). Only a file whose
	// Caps has CapPassthrough is asked.
	PassthroughFd() (int, bool)

	// Caps says what the kernel may do with this open file (see Caps). A
	// wrapper forwards its lower file's (BaseFile does) and takes away what
	// it changes: a layer that changes a file's bytes never says
	// CapPassthrough, whatever its lower file says.
	Caps() Caps
}

// Caps are what the kernel may do with one open file, decided per file:
// the frontend acts on them at open, so one stack can pass some files
// through and transform others.
type Caps uint8

const (
	// CapPassthrough: the file's bytes are exactly those of the descriptor
	// PassthroughFd gives; the kernel may read and write it itself.
	CapPassthrough Caps = 1 << iota
	// CapKeepCache: the file changes only through this stack (its layer
	// keeps state on that assumption, such as the sizes and names a crypt
	// layer caches): when it is not passed through, the kernel may keep its
	// cached pages from one open to the next instead of reading them again
	// through the stack after every open. Changes made through the mount
	// keep the kernel's cache right by themselves.
	CapKeepCache
	// CapDirectIO: every read and write must reach the layer (no page cache).
	CapDirectIO
	// CapNoFlush: the file's Flush does nothing its user could see (a
	// file opened read-only, whose close reports nothing): the kernel need
	// not send it at each close(2), a round trip less per open. A wrapper
	// whose Flush does something of its own takes it away.
	CapNoFlush
)

// FSCaps are the things a layer (with what is below it) can do that not
// every file system can. A layer says what it can do with the optional
// FSCapser interface; FSCapsOf carries the set up the stack.
type FSCaps uint16

const (
	FSXattr           FSCaps = 1 << iota // extended attributes
	FSHardLinks                          // link(2)
	FSSymlinks                           // symlink(2)
	FSMknod                              // devices, FIFOs and sockets
	FSRenameNoReplace                    // renameat2 RENAME_NOREPLACE
	FSRenameExchange                     // renameat2 RENAME_EXCHANGE
	FSRenameWhiteout                     // renameat2 RENAME_WHITEOUT
	FSTmpfile                            // open(2) O_TMPFILE (Tmpfile, LinkFile)
	// FSWriteback: the layer works under the kernel's writeback cache
	// (a mount's Writeback option): writes reach it late, in larger
	// pieces and in another order than the application made them,
	// through any file of the object open for writing, by a request
	// that carries no caller (the kernel's own), and the kernel sets
	// the mtime and ctime itself (a SETATTR at close). A layer whose
	// guarantees need the caller or the order of each write(2) masks it.
	FSWriteback
	// FSXattrCache: the layer answers getxattr the same to every caller
	// and from what it stores, so that the frontend may remember that a
	// file lacks a common xattr until the file changes through the mount
	// (fusefs/xattrcache.go). A layer that judges callers (acl) or must
	// see each call (snoop) masks it.
	FSXattrCache
	FSAll FSCaps = 1<<iota - 1
)

var fsCapNames = []string{"extended attributes", "hard links", "symbolic links", "mknod",
	"rename NOREPLACE", "rename EXCHANGE", "rename WHITEOUT", "O_TMPFILE", "the writeback cache"}

func (c FSCaps) String() string {
	s := ""
	for i, n := range fsCapNames {
		if c&(1<<i) != 0 {
			if s != "" {
				s += ", "
			}
			s += n
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// FSCapser is an optional interface of FS: FSCaps says what the layer,
// with its lowers, can do. A layer that cannot do something masks it from
// its lower's set: `return layer.FSCapsOf(fs.Lower) &^ layer.FSHardLinks`.
type FSCapser interface {
	FSCaps() FSCaps
}

// FSCapsOf is what fs can do: its FSCaps if it has the method, else the
// intersection of its lowers' (a fan-out layer can do what all its lowers
// can), else (a bottom layer) everything.
func FSCapsOf(fs FS) FSCaps {
	if c, ok := fs.(FSCapser); ok {
		return c.FSCaps()
	}
	c := FSAll
	for _, l := range fs.Lowers() {
		c &= FSCapsOf(l)
	}
	return c
}

// Changes says what a layer changes on its way down. The frontend uses it to
// decide when kernel passthrough and caching are safe; `cairn explain`
// prints it.
type Changes uint8

const (
	ChangesNames     Changes = 1 << iota // file names differ below
	ChangesData                          // file contents differ below
	ChangesAttrs                         // sizes, modes or times differ below
	ChangesPlacement                     // objects are spread over several lowers
)

func (c Changes) String() string {
	if c == 0 {
		return "nothing"
	}
	s := ""
	for i, n := range []string{"names", "data", "attributes", "placement"} {
		if c&(1<<i) != 0 {
			if s != "" {
				s += ", "
			}
			s += n
		}
	}
	return s
}

// StackChanges is the union of what fs and every layer below it change.
func StackChanges(fs FS) Changes {
	c := fs.Changes()
	for _, l := range fs.Lowers() {
		c |= StackChanges(l)
	}
	return c
}

// Walk calls fn for fs and every layer below it, depth first, each once.
func Walk(fs FS, fn func(FS)) {
	seen := map[FS]bool{}
	var walk func(FS)
	walk = func(f FS) {
		if seen[f] {
			return
		}
		seen[f] = true
		for _, l := range f.Lowers() {
			walk(l)
		}
		fn(f)
	}
	walk(fs)
}

// CloseStack closes fs and every layer below it, each before its lowers
// (a layer that shares a lower with another, before both), so that a
// layer's Close may still use its lowers: release the files it keeps open
// there, or write a last record (replica seals its replicas).
func CloseStack(fs FS) error {
	var order []FS
	Walk(fs, func(f FS) { order = append(order, f) })
	var errs []error
	for i := len(order) - 1; i >= 0; i-- {
		if err := order[i].Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Time is a timestamp with nanoseconds.
type Time = unix.Timespec

// Attr are a file's attributes, as stat(2) gives them.
//
// Dev, Branch and Ino together name the object (see ID): Dev and Ino are the
// lower file system's device and inode numbers (local sets them from stat),
// and Branch tells apart the lowers of fan-out layers, which may hold equal
// (Dev, Ino) pairs. Layers that change nothing else carry the three as they
// come. The frontend makes the st_ino an application sees from them. Gen
// tells apart two objects that had the same (Dev, Ino) one after the other
// (the lower reused a freed inode number): local sets it from the file's
// birth time where the lower records one (0 where it does not).
type Attr struct {
	Ino     uint64
	Dev     uint64
	Branch  uint64 // see TagBranch; 0 below every fan-out layer
	Gen     uint64 // the generation of Ino (see above)
	Size    uint64
	Blocks  uint64 // 512-byte blocks
	Atime   Time
	Mtime   Time
	Ctime   Time
	Mode    uint32 // type bits and permissions
	Nlink   uint32
	Uid     uint32
	Gid     uint32
	Rdev    uint64
	Blksize uint32
	Btime   Time // the birth time, where the lower records one (zero where not): statx's stx_btime
}

// ID names one object of a stack: equal IDs are the same object (hard
// links share one), different IDs are different objects while both exist.
// Gen is the generation: an object made after another one's inode number
// was freed and reused has another ID (where the lower tells them apart).
type ID struct{ Dev, Branch, Ino, Gen uint64 }

// ID is the object's identity.
func (a *Attr) ID() ID { return ID{Dev: a.Dev, Branch: a.Branch, Ino: a.Ino, Gen: a.Gen} }

// TagBranch marks a as coming through lower i of a fan-out layer with n
// lowers, so that objects of different lowers never share an ID, even when
// two lowers are one file system. Fan-out layers over fan-out layers nest
// the tags: each level is one digit (1..n) in base n+1, so the tag stays
// unique along every path down the stack.
func TagBranch(a *Attr, i, n int) {
	a.Branch = a.Branch*uint64(n+1) + uint64(i+1)
}

// IsDir, IsRegular and IsSymlink test the type bits.
func (a *Attr) IsDir() bool     { return a.Mode&unix.S_IFMT == unix.S_IFDIR }
func (a *Attr) IsRegular() bool { return a.Mode&unix.S_IFMT == unix.S_IFREG }
func (a *Attr) IsSymlink() bool { return a.Mode&unix.S_IFMT == unix.S_IFLNK }

// SetAttrMask selects the fields of SetAttr to apply.
type SetAttrMask uint32

const (
	SetMode SetAttrMask = 1 << iota
	SetUid
	SetGid
	SetSize
	SetAtime    // to SetAttr.Atime
	SetMtime    // to SetAttr.Mtime
	SetAtimeNow // to the current time
	SetMtimeNow
)

// SetAttr is a setattr request (chmod, chown, truncate, utimensat).
type SetAttr struct {
	Valid SetAttrMask
	Mode  uint32 // permission bits only
	Uid   uint32
	Gid   uint32
	Size  uint64
	Atime Time
	Mtime Time
}

// Inode flags (GetFlags, SetFlags) that layers judge; the others are
// FS_IOC_GETFLAGS's too, carried as they come.
const (
	FlagImmutable uint32 = 0x10       // FS_IMMUTABLE_FL: chattr +i
	FlagAppend    uint32 = 0x20       // FS_APPEND_FL: chattr +a
	FlagCasefold  uint32 = 0x40000000 // FS_CASEFOLD_FL: chattr +F, names match without case
)

// DirEntry is one name in a directory.
type DirEntry struct {
	Name string
	Mode uint32 // type bits; 0 if unknown
	Ino  uint64 // on the directory's own device and branch (as getdents says)
	// Attr is set when ReadDir was asked for attributes and had them.
	Attr *Attr
}

// Statfs is statfs(2).
type Statfs struct {
	Blocks, Bfree, Bavail uint64
	Files, Ffree          uint64
	Bsize, Frsize         uint32
	NameLen               uint32
}

// Lock is a byte-range lock, as fcntl(F_GETLK) gives it.
type Lock struct {
	Start uint64
	End   uint64 // inclusive; ^uint64(0) means to the end of the file
	Type  uint32 // F_RDLCK, F_WRLCK, F_UNLCK
	Pid   uint32
}

// LockFlock in Setlk's flags marks a flock(2) lock.
const LockFlock = 1

// Errno extracts the errno an error stands for: the Errno itself, or EIO for
// any other error. nil gives 0.
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

var errInvalidSeek = syscall.EINVAL

// Exclusive is an optional interface of FS: a layer that keeps what it has
// learnt of its lowers (the union: where each name is) and sees their
// changes only when it makes them says so, as overlayfs does: changes made
// to its lowers behind its back are undefined. The frontend then lets the
// kernel keep names, attributes and directory listings until they change
// through the mount, instead of for a second (see IsExclusive).
type Exclusive interface {
	Exclusive() bool
}

// ChangeReporter is an optional interface of FS: a layer that changes
// objects by itself, not in answer to an operation (the codecs' fold at
// rest rewrites a file some seconds after its last close: its blocks
// change), takes the function to call, with the object's identity (as its
// Attr gives it), after such a change. The frontend then makes the kernel
// fetch the object's attributes again, which it may otherwise keep for a
// day (IsExclusive). Called before the stack serves.
type ChangeReporter interface {
	ReportChanges(changed func(ID))
}

// XattrReplacer is an optional interface of FS: a layer for which setting
// or removing an xattr may replace the object at the path with another
// (chains: a pushed or popped chain rewrites the file and renames the new
// one over it). The frontend then asks, after such a change, whether the
// name still shows the same object (see ReplacesOnXattr).
type XattrReplacer interface {
	ReplacesOnXattr() bool
}

// ReplacesOnXattr reports whether any layer of the stack fs is an
// XattrReplacer that says so.
func ReplacesOnXattr(fs FS) bool {
	found := false
	Walk(fs, func(l FS) {
		if r, ok := l.(XattrReplacer); ok && r.ReplacesOnXattr() {
			found = true
		}
	})
	return found
}

// IsExclusive reports whether nothing below fs changes but through the
// stack: a layer that is Exclusive says so itself (a union, a local
// directory); any other layer is when all its lowers are (a snoop over a
// union, a replica over local directories).
func IsExclusive(fs FS) bool {
	if e, ok := fs.(Exclusive); ok {
		return e.Exclusive()
	}
	ls := fs.Lowers()
	if len(ls) == 0 {
		return false
	}
	for _, l := range ls {
		if !IsExclusive(l) {
			return false
		}
	}
	return true
}

// FdLender is a File that can lend the descriptor PassthroughFd would
// duplicate, for the length of a call, and only while its PassthroughFd
// would give one. Closing a duplicate is not free: on a FUSE or network
// lower (GlusterFS, ceph-fuse, NFS) every close(2) is a FLUSH round trip.
type FdLender interface {
	// LendFd calls fn with the file's descriptor, which fn must not
	// close or keep, and reports whether it did.
	LendFd(fn func(fd int)) bool
}

// LendFd calls fn with a descriptor of f's lower file whose bytes are
// f's (see PassthroughFd): f's own when f lends it (FdLender), else a
// duplicate closed after fn. It reports whether fn was called.
func LendFd(f File, fn func(fd int)) bool {
	if l, ok := f.(FdLender); ok {
		return l.LendFd(fn)
	}
	fd, ok := f.PassthroughFd()
	if !ok {
		return false
	}
	defer syscall.Close(fd)
	fn(fd)
	return true
}

// StatUnlinker is an FS whose Unlink can also give the attributes of the
// object it took a name from (as a stat just before would): for a layer
// that needs them (a transform forgets a file's state with its last name),
// one stat of the name fewer, which on a network lower is a round trip.
type StatUnlinker interface {
	UnlinkStat(ctx context.Context, path string) (Attr, error)
}
