package fusefs

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"cairn/layer"
)

// Options are the mount's options.
type Options struct {
	// AllowOther lets users other than the mounter use the mount; the
	// kernel then checks permissions (default_permissions). Without it
	// only the mounter's uid and gid reach the mount, and the lower file
	// system checks them, as the daemon runs with them (see Mount).
	AllowOther bool
	// Timeouts of the kernel's caches of entries, attributes and missing
	// names. Zero values take the defaults below; negative ones disable.
	EntryTimeout, AttrTimeout, NegativeTimeout time.Duration
	// NoPassthrough disables FUSE passthrough even where it is safe.
	NoPassthrough bool
	// NoXattr answers every xattr request with ENOSYS, after which the
	// kernel stops sending them: a round trip less per write, two less per
	// file of `ls -l`.
	NoXattr bool
	// FsName is shown as the source in /proc/mounts.
	FsName string
	// Debug logs every FUSE request.
	Debug  bool
	Logger *slog.Logger
	// LowerDirs are the directories the stack reads; a mountpoint inside
	// one of them is refused.
	LowerDirs []string
}

// Default cache timeouts.
const (
	DefaultEntryTimeout    = time.Second
	DefaultAttrTimeout     = time.Second
	DefaultNegativeTimeout = time.Second
)

// Server is a mounted stack.
type Server struct {
	*fuse.Server
	Mountpoint  string
	Passthrough bool // files may be handed to the kernel
}

func timeout(d, def time.Duration) *time.Duration {
	switch {
	case d == 0:
		d = def
	case d < 0:
		d = 0
	}
	return &d
}

// CheckMountpoint refuses a mountpoint inside (or equal to) a lower
// directory: the stack would see its own mount.
func CheckMountpoint(mountpoint string, lowers []string) error {
	mp, err := filepath.Abs(mountpoint)
	if err != nil {
		return err
	}
	if r, err := filepath.EvalSymlinks(mp); err == nil {
		mp = r
	}
	for _, l := range lowers {
		ld, err := filepath.Abs(l)
		if err != nil {
			continue
		}
		if r, err := filepath.EvalSymlinks(ld); err == nil {
			ld = r
		}
		if mp == ld || strings.HasPrefix(mp, ld+"/") || ld == "/" {
			return fmt.Errorf("mountpoint %s is inside the lower directory %s: the stack would see itself; choose a mountpoint outside it", mountpoint, l)
		}
	}
	return nil
}

// Mount mounts top at mountpoint and returns once the mount is ready.
func Mount(mountpoint string, top layer.FS, o Options) (*Server, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := CheckMountpoint(mountpoint, o.LowerDirs); err != nil {
		return nil, err
	}
	st := &state{
		top:         top,
		passthrough: !o.NoPassthrough && layer.StackChanges(top)&layer.ChangesData == 0,
		log:         o.Logger,
	}
	ra, err := top.Getattr(context.Background(), "")
	if err != nil {
		return nil, fmt.Errorf("the stack's root cannot be read: %w", err)
	}
	if !ra.IsDir() {
		return nil, fmt.Errorf("the stack's root is not a directory")
	}
	// The root's file system takes the first namespace: its files keep
	// the lower's inode numbers (see inoMap).
	st.root = &node{st: st, id: ra.ID()}
	rootIno := st.inos.ino(st.root.id)
	fsname := o.FsName
	if fsname == "" {
		fsname = "cairn"
	}
	mopts := fuse.MountOptions{
		AllowOther:    o.AllowOther,
		FsName:        fsname,
		Name:          "cairn",
		MaxWrite:      1 << 20,
		MaxReadAhead:  1 << 20,
		EnableLocks:   true,
		DisableXAttrs: o.NoXattr,
		DirectMount:   true,
		Debug:         o.Debug,
		Logger:        log.New(&slogWriter{o.Logger}, "", 0),
		// FUSE asks for security.capability before every write; the
		// answer is always "none" for us, so let go-fuse give it.
		IgnoreSecurityLabels: true,
		// The lower file system drops suid/sgid and file capabilities on
		// write, truncate and chown by itself; saying so spares a
		// GETXATTR security.capability round trip before those.
		ExtraCapabilities: fuse.CAP_HANDLE_KILLPRIV_V2,
		// A bug in a layer must not take the mount down: the request
		// fails with EIO and the operator gets the stack.
		PanicHandler: func(v any) fuse.Status {
			o.Logger.Error("panic in a layer; the request failed with EIO", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			return fuse.EIO
		},
	}
	// default_permissions: the kernel checks modes, owners and the sticky
	// bit against the attributes we report, for every caller. Other users
	// need it. Without allow_other, the kernel lets only processes with the
	// daemon's own uid and gid in, and the lower file system makes the same
	// checks on the daemon's requests (root passes them, as it would
	// natively). Leaving it out then saves a round trip per create and
	// unlink: each one invalidates the parent directory's attributes, and
	// default_permissions makes the kernel fetch them again (GETATTR)
	// before the next permission check.
	if o.AllowOther {
		mopts.Options = append(mopts.Options, "default_permissions")
	}
	opts := &fs.Options{
		MountOptions:    mopts,
		EntryTimeout:    timeout(o.EntryTimeout, DefaultEntryTimeout),
		AttrTimeout:     timeout(o.AttrTimeout, DefaultAttrTimeout),
		NegativeTimeout: timeout(o.NegativeTimeout, DefaultNegativeTimeout),
		RootStableAttr:  &fs.StableAttr{Mode: syscall.S_IFDIR, Ino: rootIno},
		Logger:          log.New(&slogWriter{o.Logger}, "", 0),
	}
	// fs.Mount, with the raw file system wrapped (see rawFS).
	srv, err := fuse.NewServer(&rawFS{fs.NewNodeFS(st.root, opts), st}, mountpoint, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	return &Server{Server: srv, Mountpoint: mountpoint, Passthrough: st.passthrough}, nil
}

// slogWriter carries go-fuse's log lines into slog.
type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	w.l.Debug(strings.TrimRight(string(p), "\n"), "from", "go-fuse")
	return len(p), nil
}

// Unmount unmounts mountpoint, lazily if it is busy and lazy is set.
func Unmount(mountpoint string, lazy bool) error {
	flags := 0
	if lazy {
		flags = syscall.MNT_DETACH
	}
	err := syscall.Unmount(mountpoint, flags)
	if err == syscall.EPERM && os.Geteuid() != 0 {
		args := []string{"-u", mountpoint}
		if lazy {
			args = []string{"-u", "-z", mountpoint}
		}
		return runFusermount(args)
	}
	return err
}
