package layer

import (
	"context"
	"syscall"
)

// Transform changes the bytes of regular files one file at a time (FiST's
// data hooks; MonA's transformation): it stores each file it is given in a
// file of the same path in its lower layer, in a form of its own (encoded,
// encrypted), and presents the file's bytes. Names, directories and the
// other kinds of object are not its business: the layer that applies it
// keeps them.
//
// A transform is bound to its lower layer when it is made (a codec engine,
// crypt's content encryption). Applied to every file, it is a layer
// (Transformed); applied to some files, each with its own chain of
// transforms, it is a link of a chain: a transform over a Transformed of
// another transform stores its file through the other.
//
// path is a file's path in the lower layer; name, where given, is the path
// the application knows it by, for messages. A transform keeps what it must
// share between the open files of one stored file by the file's identity
// (Attr.ID), so that hard links and renames keep it.
type Transform interface {
	// Open opens the stored file at path and presents it. flags are
	// open(2)'s: the transform opens its lower file as it needs (readable
	// to rewrite partial blocks, without O_APPEND) and keeps the caller's
	// meaning (O_APPEND, O_TRUNC, the access mode).
	Open(ctx context.Context, path, name string, flags int) (File, error)
	// Create creates the stored file at path with mode (flags as Open's,
	// with O_EXCL) and returns it open, with its presented attributes.
	Create(ctx context.Context, path, name string, flags int, mode uint32) (File, Attr, error)
	// Stat turns the attributes a of the stored regular file at path into
	// the presented ones (its size), in place.
	Stat(ctx context.Context, path string, a *Attr) error
	// Truncate sets the presented size of the file at path.
	Truncate(ctx context.Context, path, name string, size int64) error
	// Settle writes out what the open files of the stored file id hold in
	// memory, before a change of it that a later write of the transform
	// would undo (its times, a file capability). By identity, not by path:
	// a settle may run after a rename (a release is asynchronous), when
	// the path names another file, which may not even be the transform's.
	Settle(ctx context.Context, id ID) error
	// Forget says that the stored file id has lost its last name: the
	// transform must not keep it open.
	Forget(ctx context.Context, id ID)
	// Close releases what the transform keeps (files kept open).
	Close() error
}

// Reserver is implemented by a transform that keeps files of its own in
// its lower layer (crypt's journal of in-place rewrites): Reserved reports
// whether a lower path is one of them. Transformed hides them: listings
// leave them out, a lookup answers ENOENT, and making an object of such a
// name EPERM.
type Reserver interface {
	Reserved(path string) bool
}

// Transformed is a layer that applies one transform to every regular file
// of its lower layer and leaves names and every other object as they are:
// the codec layers, for instance, are a Transformed of their engine. It
// shows the presented sizes in attributes and listings, sends truncation
// to the transform, settles open files before a change of times or of the
// file capability, and tells the transform when a stored file loses its
// last name.
type Transformed struct {
	Base
	T Transform
}

// NewTransformed applies t to every regular file of lower (t's own lower).
func NewTransformed(lower FS, t Transform) *Transformed {
	return &Transformed{Base: Base{Lower: lower}, T: t}
}

func (fs *Transformed) Changes() Changes { return ChangesData | ChangesAttrs }

// Close closes the transform.
func (fs *Transformed) Close() error { return fs.T.Close() }

// FSCaps: no O_TMPFILE, which a transform has no operation for (a file it
// would present from its first byte without a path to store it at).
func (fs *Transformed) FSCaps() FSCaps { return FSCapsOf(fs.Lower) &^ FSTmpfile }

func (fs *Transformed) Tmpfile(context.Context, string, int, uint32) (File, Attr, error) {
	return nil, Attr{}, syscall.EOPNOTSUPP
}

func (fs *Transformed) LinkFile(context.Context, File, string) (Attr, error) {
	return Attr{}, syscall.EOPNOTSUPP
}

// SetFlags refuses append-only and immutable (EOPNOTSUPP). A transform
// rewrites stored files in place (the last block of an append, an index),
// which the lower would refuse for every write under append-only; and it
// holds written bytes in memory and stores them later, so a write through
// a descriptor opened before chattr +i would be taken and then fail, with
// the file's bytes in doubt, where ext4 refuses the write(2) itself. The
// other flags pass: the lower enforces them.
func (fs *Transformed) SetFlags(ctx context.Context, path string, flags uint32) error {
	if fs.reserved(path) {
		return syscall.ENOENT
	}
	return SetFlagsExcept(ctx, fs.Lower, path, flags, FlagAppend|FlagImmutable)
}

// SetFlagsExcept sets path's inode flags in lower unless it would turn on
// one of refuse (EOPNOTSUPP): the SetFlags of a layer that those flags
// would break. Flags already on (set below the layer) may stay.
func SetFlagsExcept(ctx context.Context, lower FS, path string, flags, refuse uint32) error {
	if flags&refuse != 0 {
		cur, err := lower.GetFlags(ctx, path)
		if err != nil {
			return err
		}
		if flags&^cur&refuse != 0 {
			return syscall.EOPNOTSUPP
		}
	}
	return lower.SetFlags(ctx, path, flags)
}

// reserved reports whether path is one of the transform's own files.
func (fs *Transformed) reserved(path string) bool {
	r, ok := fs.T.(Reserver)
	return ok && r.Reserved(path)
}

func (fs *Transformed) stat(ctx context.Context, path string, a *Attr) error {
	if !a.IsRegular() {
		return nil
	}
	return fs.T.Stat(ctx, path, a)
}

func (fs *Transformed) Getattr(ctx context.Context, path string) (Attr, error) {
	if fs.reserved(path) {
		return Attr{}, syscall.ENOENT
	}
	for try := 0; ; try++ {
		a, err := fs.Lower.Getattr(ctx, path)
		if err != nil {
			return a, err
		}
		// ESTALE: path was renamed over between the two looks.
		if err = fs.stat(ctx, path, &a); err != syscall.ESTALE || try == 2 {
			return a, err
		}
	}
}

func (fs *Transformed) Open(ctx context.Context, path string, flags int) (File, error) {
	if fs.reserved(path) {
		return nil, syscall.ENOENT
	}
	return fs.T.Open(ctx, path, path, flags)
}

func (fs *Transformed) Create(ctx context.Context, path string, flags int, mode uint32) (File, Attr, error) {
	if fs.reserved(path) {
		return nil, Attr{}, syscall.EPERM
	}
	return fs.T.Create(ctx, path, path, flags, mode)
}

func (fs *Transformed) ReadDir(ctx context.Context, path string, plus bool) ([]DirEntry, error) {
	d, err := fs.OpenDir(ctx, path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return ReadDirAll(ctx, d, plus)
}

// OpenDir streams the lower's listing with the presented sizes
// (DirOpener).
func (fs *Transformed) OpenDir(ctx context.Context, path string) (Dir, error) {
	ld, err := OpenDir(ctx, fs.Lower, path)
	if err != nil {
		return nil, err
	}
	return MapDir(ld, func(ctx context.Context, e *DirEntry) (bool, error) {
		if fs.reserved(Join(path, e.Name)) {
			return false, nil
		}
		if e.Attr != nil && fs.stat(ctx, Join(path, e.Name), e.Attr) != nil {
			e.Attr = nil // the kernel will ask with a lookup
		}
		return true, nil
	}), nil
}

// setTimes are the changes of times that a later write of the transform
// to the stored file would undo.
const setTimes = SetAtime | SetMtime | SetAtimeNow | SetMtimeNow

func (fs *Transformed) Setattr(ctx context.Context, path string, in *SetAttr) (Attr, error) {
	if in.Valid&SetSize != 0 {
		a, err := fs.Lower.Getattr(ctx, path)
		if err != nil {
			return a, err
		}
		if a.IsDir() {
			return a, syscall.EISDIR
		}
		if !a.IsRegular() {
			return a, syscall.EINVAL
		}
		if err := fs.T.Truncate(ctx, path, path, int64(in.Size)); err != nil {
			return Attr{}, err
		}
		rest := *in
		rest.Valid &^= SetSize
		if rest.Valid == 0 {
			return fs.Getattr(ctx, path)
		}
		in = &rest
	}
	if in.Valid&setTimes != 0 {
		if err := fs.settle(ctx, path); err != nil {
			return Attr{}, err
		}
	}
	a, err := fs.Lower.Setattr(ctx, path, in)
	if err != nil {
		return a, err
	}
	return a, fs.stat(ctx, path, &a)
}

// Setxattr of a file capability settles open files first: the lower file
// system drops security.capability at every write, so a later write of the
// transform (at the file's last close) would remove the capability that
// setcap(8) just set.
func (fs *Transformed) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	if name == "security.capability" {
		if err := fs.settle(ctx, path); err != nil {
			return err
		}
	}
	return fs.Lower.Setxattr(ctx, path, name, value, flags)
}

// settle settles the stored regular file at path (Transform.Settle).
func (fs *Transformed) settle(ctx context.Context, path string) error {
	a, err := fs.Lower.Getattr(ctx, path)
	if err != nil || !a.IsRegular() {
		return nil // the lower operation will say what is wrong
	}
	return fs.T.Settle(ctx, a.ID())
}

func (fs *Transformed) Mkdir(ctx context.Context, path string, mode uint32) (Attr, error) {
	if fs.reserved(path) {
		return Attr{}, syscall.EPERM
	}
	return fs.Lower.Mkdir(ctx, path, mode)
}

func (fs *Transformed) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (Attr, error) {
	if fs.reserved(path) {
		return Attr{}, syscall.EPERM
	}
	return fs.Lower.Mknod(ctx, path, mode, rdev)
}

func (fs *Transformed) Symlink(ctx context.Context, target, path string) (Attr, error) {
	if fs.reserved(path) {
		return Attr{}, syscall.EPERM
	}
	return fs.Lower.Symlink(ctx, target, path)
}

func (fs *Transformed) Link(ctx context.Context, oldpath, newpath string) (Attr, error) {
	if fs.reserved(newpath) {
		return Attr{}, syscall.EPERM
	}
	a, err := fs.Lower.Link(ctx, oldpath, newpath)
	if err != nil {
		return a, err
	}
	return a, fs.stat(ctx, newpath, &a)
}

func (fs *Transformed) Unlink(ctx context.Context, path string) error {
	var a Attr
	var aerr error
	if u, ok := fs.Lower.(StatUnlinker); ok {
		if a, aerr = u.UnlinkStat(ctx, path); aerr != nil {
			return aerr
		}
	} else {
		a, aerr = fs.Lower.Getattr(ctx, path)
		if err := fs.Lower.Unlink(ctx, path); err != nil {
			return err
		}
	}
	if aerr == nil && a.IsRegular() && a.Nlink <= 1 {
		fs.T.Forget(ctx, a.ID())
	}
	return nil
}

func (fs *Transformed) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	if fs.reserved(oldpath) || fs.reserved(newpath) {
		return syscall.EPERM
	}
	a, aerr := fs.Lower.Getattr(ctx, newpath)
	if err := fs.Lower.Rename(ctx, oldpath, newpath, flags); err != nil {
		return err
	}
	if aerr == nil && a.IsRegular() && a.Nlink <= 1 && flags&RenameExchange == 0 {
		fs.T.Forget(ctx, a.ID())
	}
	return nil
}
