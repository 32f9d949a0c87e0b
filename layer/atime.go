package layer

import (
	"context"
	"errors"
	"syscall"
)

// Atime is how reading through a stack changes the access times of the
// files and directories in its lowers: mount(8)'s atime options, which a
// mount of the stack takes as any file system's mount does.
type Atime struct {
	Mode AtimeMode
	// NoDir (nodiratime): listing a directory leaves its atime alone.
	NoDir bool
}

// AtimeMode is the rule by which a read changes a file's atime.
type AtimeMode uint8

const (
	// Relatime (the default of mount(2)): a read sets the atime when it is
	// not later than the mtime or the ctime, or is a day old.
	Relatime AtimeMode = iota
	// NoAtime: no read changes an atime.
	NoAtime
	// StrictAtime: every read sets the atime.
	StrictAtime
)

func (m AtimeMode) String() string {
	switch m {
	case NoAtime:
		return "noatime"
	case StrictAtime:
		return "strictatime"
	}
	return "relatime"
}

func (a Atime) String() string {
	if a.NoDir && a.Mode != NoAtime { // noatime says it already
		return a.Mode.String() + ",nodiratime"
	}
	return a.Mode.String()
}

// AtimeSetter is a layer that reads a file system of its own (a bottom
// layer, such as local): SetAtime makes its reads, and the kernel's reads
// of the descriptors it hands out (PassthroughFd), change access times as a
// says, whatever the options that file system is mounted with. It is called
// before the stack serves anything (ApplyAtime).
type AtimeSetter interface {
	SetAtime(a Atime) error
}

// ApplyAtime applies a to every AtimeSetter of the stack under top. Layers
// above them need do nothing: the bottom layers' reads are the only ones
// that reach a file system.
func ApplyAtime(top FS, a Atime) error {
	var errs []error
	Walk(top, func(l FS) {
		if s, ok := l.(AtimeSetter); ok {
			if err := s.SetAtime(a); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(errs...)
}

// Toucher is an open file that can change its atime as a read of it would,
// without the data, and says whether it changed: the frontend calls it when
// a file is opened for reading whose reads the kernel may serve from its
// own cache, where no layer sees them. The bottom layer does it (local reads
// a byte through its mount: the kernel changes the atime or not by the
// mount's rule, see AtimeSetter); a file that wraps one lower file forwards
// it (BaseFile does, and crypt's and codec's files, whose own caches a read
// may not get past either).
type Toucher interface {
	TouchAtime(ctx context.Context) bool
}

// TouchAtime touches f's atime if f is a Toucher (see Toucher) and says
// whether it changed.
func TouchAtime(ctx context.Context, f File) bool {
	if t, ok := f.(Toucher); ok {
		return t.TouchAtime(ctx)
	}
	return false
}

// OpenNoAtime opens path in fs for a layer's own reads of it (a header, an
// index), which are no one's reads of the file: with O_NOATIME, so that they
// leave its atime alone (a stat must not change it), unless the daemon may
// not (EPERM: another user's file, for a daemon that is not root).
func OpenNoAtime(ctx context.Context, fs FS, path string, flags int) (File, error) {
	f, err := fs.Open(ctx, path, flags|ONoatime)
	if errors.Is(err, syscall.EPERM) {
		return fs.Open(ctx, path, flags)
	}
	return f, err
}
