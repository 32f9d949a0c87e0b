package layer

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Layers that keep state of their own in the lower (an index, a journal,
// side data) take part in `cairn fsck` and in the claim that keeps two
// processes from serving one lower, through two optional interfaces of FS,
// which tools find by walking the stack (Walk), as they find Reopener.

// Claimer is a layer whose lower files one process at a time may serve:
// its engine keeps their state in memory. Claim locks the lower for as long
// as the layer is open, or fails with an *InUseError.
type Claimer interface {
	Claim(ctx context.Context) error
}

// InUseError says that another process serves (or checks) a layer's lower.
type InUseError struct {
	Layer string // the layer's type or name, for messages
	Dir   string // its lower directory, if known
}

func (e *InUseError) Error() string {
	where := ""
	if e.Dir != "" {
		where = " in " + e.Dir
	}
	return fmt.Sprintf("the files of the %s layer%s are in use by another cairn process (a mount of this stack or an fsck, here or on another client of the same network file system; only mounts with -shared share it): unmount it first ('cairn umount MOUNTPOINT')", e.Layer, where)
}

// Sharer is an optional interface of FS: a layer that caches what other
// machines may change when its lowers are shared with them (a network
// file system that several machines mount: cairn mount -shared). Share,
// called before the stack serves, makes it stop (ShareStack).
type Sharer interface {
	Share()
}

// ShareStack calls Share on every Sharer of the stack under top.
func ShareStack(top FS) {
	Walk(top, func(l FS) {
		if s, ok := l.(Sharer); ok {
			s.Share()
		}
	})
}

type sharedClaimKey struct{}

// WithSharedClaim marks a claim (ClaimStack) as shared: `cairn mount
// -shared`, for a lower that several machines mount (docs/distributed.md).
// The layers that hold close-to-open consistency between processes that
// serve the same lower (crypt, the codecs) then claim it shared, and
// coexist with other shared claims only; the others claim it exclusively
// as always.
func WithSharedClaim(ctx context.Context) context.Context {
	return context.WithValue(ctx, sharedClaimKey{}, true)
}

// SharedClaim reports whether ctx asks for a shared claim (WithSharedClaim).
func SharedClaim(ctx context.Context) bool {
	v, _ := ctx.Value(sharedClaimKey{}).(bool)
	return v
}

// ClaimStack claims every Claimer of the stack under top, bottom first.
func ClaimStack(ctx context.Context, top FS) error {
	var err error
	Walk(top, func(l FS) {
		if c, ok := l.(Claimer); ok && err == nil {
			err = c.Claim(ctx)
		}
	})
	return err
}

// LockLower takes an exclusive advisory lock (flock) on the root directory
// of lower, held until release is called, for a Claimer. A lower whose
// root gives no descriptor (a layer that changes data) is not locked:
// release is then a no-op. name names the layer in an *InUseError.
//
// A directory's flock is the kernel's own, seen by the processes of this
// machine only, even on a network file system's FUSE client (Linux passes
// the flocks and POSIX locks of regular files to a FUSE file system, not
// those of directories): LockLowerFile also locks a regular file, which
// other clients of a GlusterFS volume see.
func LockLower(ctx context.Context, lower FS, name string) (release func(), err error) {
	return LockLowerFile(ctx, lower, name, "")
}

// LockLowerFile is LockLower that also takes an exclusive flock on the
// regular file file of lower's root (if not ""), a file the layer keeps
// there anyway (crypt's configuration): the claim that two clients of a
// network file system see (docs/distributed.md). A missing file is not
// locked.
func LockLowerFile(ctx context.Context, lower FS, name, file string) (release func(), err error) {
	return LockLowerShared(ctx, lower, name, file, false)
}

// LockLowerShared is LockLowerFile with shared locks (flock's LOCK_SH) if
// shared: the claim of a layer that may serve its lower together with
// other processes that claim it shared (mounts with -shared on several
// clients of a network file system: SharedClaim), and with none that
// claims it exclusively.
func LockLowerShared(ctx context.Context, lower FS, name, file string, shared bool) (release func(), err error) {
	how := unix.LOCK_EX
	if shared {
		how = unix.LOCK_SH
	}
	unlock, err := lockFd(ctx, lower, "", unix.O_RDONLY|unix.O_DIRECTORY, name, how)
	if err != nil || file == "" {
		return unlock, err
	}
	unlockFile, err := lockFd(ctx, lower, file, unix.O_RDONLY, name, how)
	if err != nil {
		unlock()
		return nil, err
	}
	return func() { unlockFile(); unlock() }, nil
}

// LockLowerOwn is LockLowerShared over a lock file of the layer's own:
// file, a path of lower that the claim makes (and its directory) if it is
// missing, for a layer that keeps no regular file at a fixed place of its
// lower otherwise (the codecs, union, shard, chains, replica). The layer
// hides it (not listed, ENOENT on lookup, refused on creation), as it
// hides its other private names. A lower that takes no new file
// (read-only) goes without it: its claim is then the directory's only,
// this machine's. Making it is no change that the layer shows: the times
// of lower's root are put back (replica's seal records them).
func LockLowerOwn(ctx context.Context, lower FS, name, file string, shared bool) (release func(), err error) {
	self := AsSelf(ctx)
	if _, err := lower.Getattr(self, file); errors.Is(err, syscall.ENOENT) {
		makeLockFile(self, lower, file)
	}
	return LockLowerShared(ctx, lower, name, file, shared)
}

// makeLockFile makes the empty file file of lower, and its directory,
// leaving the times of lower's root as they were. Another process (or
// machine) may make it at the same time: EEXIST is theirs.
func makeLockFile(ctx context.Context, lower FS, file string) {
	root, err := lower.Getattr(ctx, "")
	if err != nil {
		return
	}
	made := false
	if dir, _ := Split(file); dir != "" {
		if _, err := lower.Mkdir(ctx, dir, 0o700); err == nil {
			made = true
		}
	}
	if f, _, err := lower.Create(ctx, file, unix.O_RDONLY|unix.O_EXCL, 0o600); err == nil {
		f.Release(ctx)
		made = true
	}
	if made {
		lower.Setattr(ctx, "", &SetAttr{Valid: SetAtime | SetMtime, Atime: root.Atime, Mtime: root.Mtime})
	}
}

// lockFd takes a flock (how: LOCK_EX or LOCK_SH) on path of lower (opened
// with flags).
func lockFd(ctx context.Context, lower FS, path string, flags int, name string, how int) (release func(), err error) {
	d, err := lower.Open(ctx, path, flags)
	if err != nil {
		return func() {}, nil
	}
	fd, ok := d.PassthroughFd()
	if !ok || fd < 0 {
		d.Release(ctx)
		return func() {}, nil
	}
	if err := unix.Flock(fd, how|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		d.Release(ctx)
		if err == unix.EWOULDBLOCK {
			return nil, &InUseError{Layer: name, Dir: LowerDir(lower)}
		}
		return nil, fmt.Errorf("locking the %s layer's lower directory: %w", name, err)
	}
	// The unlock first: a close leaves it to the FUSE release, which the
	// kernel sends without waiting for it, so that another client's mount
	// right after this process ended could still find the file locked.
	return func() { unix.Flock(fd, unix.LOCK_UN); unix.Close(fd); d.Release(context.Background()) }, nil
}

// LowerDir names the directory at the bottom of a chain of one-lower
// layers, for messages ("" if there is none).
func LowerDir(l FS) string {
	if r, ok := bottom(l).(interface{ Root() string }); ok {
		return r.Root()
	}
	return ""
}

// RootMover is a bottom layer that can tell whether its directory is still
// at the path it was opened by (local): one renamed or removed behind the
// stack is still reached through the layer's descriptor, while its path
// names another directory or nothing.
type RootMover interface {
	RootMoved() error
}

// RootMoved asks the bottom layer of a stack of single lowers whether its
// directory moved away from its path (nil: it did not, or it cannot tell).
func RootMoved(l FS) error {
	if r, ok := bottom(l).(RootMover); ok {
		return r.RootMoved()
	}
	return nil
}

// bottom is the layer at the bottom of a stack of single lowers that says
// its directory (Root), or nil.
func bottom(l FS) FS {
	for l != nil {
		if _, ok := l.(interface{ Root() string }); ok {
			return l
		}
		ls := l.Lowers()
		if len(ls) != 1 {
			return nil
		}
		l = ls[0]
	}
	return nil
}

// CheckMode says what a Checker may change.
type CheckMode int

const (
	// CheckOnly changes nothing.
	CheckOnly CheckMode = iota
	// Repair rebuilds what can be rebuilt without losing a byte.
	Repair
	// RepairForce also drops what cannot be read back, keeping a copy.
	RepairForce
)

// Checker is a layer that `cairn fsck` checks: Fsck goes over every file
// the layer keeps state for, repairing as mode allows, calls progress
// before each file and report after it, and sums up.
type Checker interface {
	Fsck(ctx context.Context, mode CheckMode, progress func(done, total int, path string), report func(FileReport)) (CheckSummary, error)
}

// FileReport is what a check found, and changed, in one file.
type FileReport struct {
	Path string
	// Text is the report as fsck prints it (one or more lines).
	Text string
	// Err says the file could not be checked at all.
	Err      error
	OK       bool // consistent and readable
	Repaired bool
	// Dropped says a forced repair gave up data (a copy is in the
	// summary's LostFound).
	Dropped bool
	// Problems and Damaged count what is left: inconsistencies a repair
	// would fix, and data that cannot be read back.
	Problems, Damaged int
}

// CheckSummary sums up a Checker's run.
type CheckSummary struct {
	// Line is the summary fsck prints for the layer.
	Line string
	// Bad counts the files not OK (or not checked) after the run.
	Bad int
	// Dropped says data was given up; LostFound is where copies are.
	Dropped   bool
	LostFound string
}

// Checkers returns the stack's Checkers, bottom first.
func Checkers(top FS) []Checker {
	var cs []Checker
	Walk(top, func(l FS) {
		if c, ok := l.(Checker); ok {
			cs = append(cs, c)
		}
	})
	return cs
}

// ErrWrongSecret says a passphrase or key does not open a layer's volume
// (crypt's ErrWrongPassphrase and ErrWrongMasterKey match it): cairn exits
// 7 for it, whichever command met it.
var ErrWrongSecret = errors.New("wrong passphrase or key")

// ErrInUse matches an *InUseError with errors.Is.
var ErrInUse = errors.New("in use by another cairn process")

// Is makes errors.Is(err, ErrInUse) true.
func (e *InUseError) Is(target error) bool { return target == ErrInUse }

// Resyncer is a layer whose lowers hold copies of one tree and can fall out
// of step (replica): `cairn resync` calls Resync on every one in the stack,
// with the stack unmounted. It brings them back in step by copying what
// changed (with full, comparing everything), tells progress as objects
// compared out of a total where it knows one, and sums up what it did in
// one line.
type Resyncer interface {
	Resync(ctx context.Context, full bool, progress func(done, total int64)) (string, error)
}
