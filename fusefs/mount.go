package fusefs

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"syscall"
	"time"

	"cairnfs.dev/cairn/third_party/gofuse/fs"
	"cairnfs.dev/cairn/third_party/gofuse/fuse"

	"cairnfs.dev/cairn/layer"
)

// Options are the mount's options.
type Options struct {
	// AllowOther lets users other than the mounter use the mount; the
	// kernel then checks permissions (default_permissions). Without it
	// only the mounter's uid and gid reach the mount, and the lower file
	// system checks them, as the daemon runs with them (see Mount).
	AllowOther bool
	// Timeouts of the kernel's caches of entries, attributes and missing
	// names. Zero values take the defaults below (ExclusiveTimeout for a
	// stack whose lowers change only through it, whose directory listings
	// the kernel then keeps too, unless AttrTimeout is set); negative
	// ones disable.
	EntryTimeout, AttrTimeout, NegativeTimeout time.Duration
	// NoPassthrough disables FUSE passthrough even where it is safe.
	NoPassthrough bool
	// Shared says that the lowers are shared with other machines (a
	// network file system that other clients change, docs/distributed.md):
	// the kernel keeps no names, attributes or missing names (the
	// timeouts default to 0 instead of 1 s or 24 h; ones set explicitly
	// stay), no directory listings, and no file's pages from one open to
	// the next, so that an open after another client's close sees its
	// bytes (close-to-open). It costs a round trip to the daemon, and
	// through it to the network file system, for every lookup and stat,
	// and a read of the file's bytes again after every open.
	Shared bool
	// NoXattr answers every xattr request with ENOSYS, after which the
	// kernel stops sending them: a round trip less per write, two less per
	// file of `ls -l`.
	NoXattr bool
	// FsName is shown as the source in /proc/mounts.
	FsName string
	// MountFlags are mount(8)'s generic options for the mount (see
	// ParseMountFlags); without them a mount is nodev and nosuid.
	MountFlags []string
	// Debug logs every FUSE request.
	Debug  bool
	Logger *slog.Logger
	// LowerDirs are the directories the stack reads; a mountpoint inside
	// one of them is refused.
	LowerDirs []string
	// Writeback turns on the kernel's writeback cache (fusefs/writeback.go):
	// writes stay in the kernel's page cache and reach the stack later,
	// in large WRITEs, at fsync, close or under memory pressure; errors
	// of the lower then surface at fsync(2) and close(2) rather than
	// write(2) (docs/posix.md). The kernel then passes no file through
	// (NoPassthrough follows). Only for an exclusive stack whose every
	// layer takes it (WritebackRefused): Mount fails otherwise.
	Writeback bool
	// Transport is how requests and replies travel between the kernel
	// and the daemon (see ParseTransport): "dev" reads and writes
	// /dev/fuse; "uring" serves over FUSE over io_uring and fails the
	// mount where the kernel does not offer it (the fuse module's
	// enable_uring parameter is N); "auto" takes io_uring where the
	// kernel offers it. Empty is $CAIRN_FUSE_TRANSPORT, else
	// DefaultTransport.
	Transport string
}

// DefaultTransport is the transport of a mount that names none.
const DefaultTransport = "dev"

// Transports are the values of Options.Transport.
var Transports = []string{"auto", "dev", "uring"}

// ParseTransport turns a transport's name into go-fuse's; empty is
// $CAIRN_FUSE_TRANSPORT, else DefaultTransport.
func ParseTransport(s string) (fuse.Transport, error) {
	if s == "" {
		s = os.Getenv("CAIRN_FUSE_TRANSPORT")
	}
	if s == "" {
		s = DefaultTransport
	}
	switch s {
	case "dev":
		return fuse.TransportDevFuse, nil
	case "auto":
		return fuse.TransportAuto, nil
	case "uring":
		return fuse.TransportIOUring, nil
	}
	return 0, fmt.Errorf("unknown FUSE transport %q (known: %s)", s, strings.Join(Transports, ", "))
}

// Default cache timeouts.
const (
	DefaultEntryTimeout    = time.Second
	DefaultAttrTimeout     = time.Second
	DefaultNegativeTimeout = time.Second
	// ExclusiveTimeout replaces the three for a stack whose lowers change
	// only through it (layer.IsExclusive): the kernel keeps names,
	// attributes and missing names until they change through the mount
	// (or memory runs short), as fuse-overlayfs lets it.
	ExclusiveTimeout = 24 * time.Hour
)

// Server is a mounted stack.
type Server struct {
	*fuse.Server
	Mountpoint  string
	Passthrough bool   // files may be handed to the kernel
	Transport   string // what serves the mount: "io_uring" or "/dev/fuse"
	served      chan struct{}
	st          *state
}

// OpenFiles is the number of files of the mount that the stack has open
// for the kernel: opened and not released yet (the kernel sends RELEASE
// after close(2) returns), or being released.
func (s *Server) OpenFiles() int { return int(s.st.nopen.Load()) }

// Wait waits until the mount is gone and the stack has let go of every
// file the kernel had open (see state.releaseLeft).
func (s *Server) Wait() { <-s.served }

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

// mountFlags are the generic options of mount(8) a cairn mount takes: each
// sets or clears a flag of mount(2).
var mountFlags = map[string]struct {
	set   bool
	flags uintptr
}{
	"ro": {true, msRdonly}, "rw": {false, msRdonly},
	"nodev": {true, msNodev}, "dev": {false, msNodev},
	"nosuid": {true, msNosuid}, "suid": {false, msNosuid},
	"noexec": {true, msNoexec}, "exec": {false, msNoexec},
	"sync": {true, msSynchronous}, "async": {false, msSynchronous},
	"dirsync": {true, msDirsync},
	"noatime": {true, msNoatime}, "atime": {false, msNoatime},
	"nodiratime": {true, msNodiratime}, "diratime": {false, msNodiratime},
	"relatime": {true, msRelatime}, "norelatime": {false, msRelatime},
	"strictatime": {true, msStrictatime}, "nostrictatime": {false, msStrictatime},
	"lazytime": {true, msLazytime}, "nolazytime": {false, msLazytime},
}

// atimeFlags are the flags of mountFlags that say how atimes change.
const atimeFlags = msNoatime | msNodiratime | msRelatime | msStrictatime

// AtimeOf is the atime policy of a mount with flags (from ParseMountFlags),
// as mount(2) decides it: relatime unless noatime, strictatime over both,
// nodiratime beside any of them; a read-only mount changes no atime.
func AtimeOf(flags uintptr) layer.Atime {
	a := layer.Atime{NoDir: flags&msNodiratime != 0}
	switch {
	case flags&msRdonly != 0:
		a.Mode = layer.NoAtime
	case flags&msStrictatime != 0:
		a.Mode = layer.StrictAtime
	case flags&msNoatime != 0:
		a.Mode = layer.NoAtime
	}
	return a
}

// MountFlagNames are the options ParseMountFlags takes, sorted.
func MountFlagNames() []string {
	var n []string
	for k := range mountFlags {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// ParseMountFlags turns mount(8)'s generic options into mount(2) flags,
// from the FUSE default, nodev and nosuid; later options win. dev and suid
// take effect for a mount made by root only (fusermount3 refuses them).
func ParseMountFlags(opts []string) (uintptr, error) {
	flags := uintptr(msNodev | msNosuid)
	for _, o := range opts {
		f, ok := mountFlags[o]
		if !ok {
			return 0, fmt.Errorf("unknown mount option %q (known: %s)", o, strings.Join(MountFlagNames(), ", "))
		}
		if f.set {
			flags |= f.flags
		} else {
			flags &^= f.flags
		}
	}
	return flags, nil
}

// explicitAtime says whether opts name an atime option.
func explicitAtime(opts []string) bool {
	for _, o := range opts {
		if mountFlags[o].flags&atimeFlags != 0 {
			return true
		}
	}
	return false
}

// Mount mounts top at mountpoint and returns once the mount is ready.
func Mount(mountpoint string, top layer.FS, o Options) (*Server, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := CheckMountpoint(mountpoint, o.LowerDirs); err != nil {
		return nil, err
	}
	transport, err := ParseTransport(o.Transport)
	if err != nil {
		return nil, err
	}
	exclusive := layer.IsExclusive(top)
	if o.Writeback {
		if err := WritebackRefused(top, o.Shared); err != nil {
			return nil, err
		}
	}
	st := &state{
		top:           top,
		cacheDirs:     exclusive && o.AttrTimeout == 0 && !o.Shared,
		shared:        o.Shared,
		writeback:     o.Writeback,
		passthrough:   !o.NoPassthrough && !o.Writeback, // the kernel refuses both (writeback.go)
		fscaps:        layer.FSCapsOf(top),
		finds:         layer.CanFind(top),
		xattrReplaces: layer.ReplacesOnXattr(top),
		acl:           o.AllowOther,
		log:           o.Logger,
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
	st.inos.root = st.root.id
	rootIno := st.inos.ino(st.root.id)
	fsname := o.FsName
	if fsname == "" {
		fsname = "cairn"
	}
	// EnableLocks stays off: without CAP_POSIX_LOCKS and CAP_FLOCK_LOCKS the
	// kernel keeps POSIX, OFD and flock locks on the mount's inodes itself,
	// exactly as for ext4 (owners, release on close, ranges, F_GETLK's pid,
	// deadlock detection, waits that a signal interrupts). That is right for
	// a mount that is the only user of its lowers (every lower today); a
	// lower shared with other machines would need them forwarded.
	mopts := fuse.MountOptions{
		AllowOther:    o.AllowOther,
		FsName:        fsname,
		Name:          "cairn",
		MaxWrite:      1 << 20,
		MaxReadAhead:  1 << 20,
		DisableXAttrs: o.NoXattr,
		DirectMount:   true,
		Debug:         o.Debug,
		Logger:        log.New(&slogWriter{o.Logger}, "", 0),
		// POSIX ACLs: the kernel reads them (system.posix_acl_access and
		// _default, served by the stack like any xattr), caches them and
		// checks them with the modes, for every user; it then applies no
		// umask of its own (see CAP_DONT_MASK below). Only with allow_other:
		// the kernel then checks permissions itself (default_permissions),
		// which ACL support would otherwise impose on private mounts too.
		// security.capability and the ACLs are served, not refused: with
		// CAP_HANDLE_KILLPRIV_V2 the kernel no longer asks for
		// security.capability before every write.
		EnableAcl: st.acl,
		// We drop set-id bits ourselves (node.Setattr, killPrivs): the
		// daemon writes to the lower as root, so the lower never does.
		// Saying so also spares a GETXATTR security.capability round trip
		// before every write (the kernel marks inodes S_NOSEC).
		//
		// CAP_DONT_MASK: the kernel sends the mode of a new object
		// without the caller's umask, and the umask beside it; the local
		// layer applies it unless a default ACL replaces it, as ext4 does.
		//
		// CAP_SETXATTR_EXT: a SETXATTR of an access ACL says when the
		// caller may not keep the set-group-ID bit (see node.Setxattr).
		ExtraCapabilities: extraCaps,
		Transport:         transport,
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
	// File handles: the kernel asks for a node it has forgotten by its id
	// (see handles.go), where the stack can find objects by identity.
	if st.finds {
		mopts.ExtraCapabilities |= fuse.CAP_EXPORT_SUPPORT
	}
	if o.Writeback {
		mopts.ExtraCapabilities |= fuse.CAP_WRITEBACK_CACHE
	}
	// A mount that passes nothing through does not ask for passthrough:
	// the kernel then gives it no stacking depth, and another mount may
	// pass its files through (a stack over this mount; the kernel refuses
	// a backing file on a mount that negotiated passthrough, ELOOP).
	if !st.passthrough {
		mopts.DisabledCapabilities |= fuse.CAP_PASSTHROUGH
	}
	flags, err := ParseMountFlags(o.MountFlags)
	if err != nil {
		return nil, err
	}
	// The kernel leaves the atimes of a FUSE mount's inodes to the file
	// system (S_NOATIME): the stack's bottom layers apply the mount's
	// options to the lowers (layer.ApplyAtime), for the reads they make
	// and the passed-through files the kernel reads for them; node.Open
	// touches the files whose reads the kernel may serve from its cache.
	// Where that cannot be done (a daemon that is not root, over a lower
	// mounted otherwise), atime options given fail the mount; the default
	// (relatime) and ro leave the lower's own options in force.
	st.atime = AtimeOf(flags)
	if err := layer.ApplyAtime(top, st.atime); err != nil {
		if explicitAtime(o.MountFlags) {
			return nil, err
		}
		o.Logger.Warn("atimes follow the lower's own mount options", "err", err)
	}
	// go-fuse takes 0 for "the default" (nodev, nosuid): dev,suid with
	// nothing else set gets MS_SILENT, which changes nothing else.
	if flags == 0 {
		flags = msSilent
	}
	mopts.DirectMountFlags = flags
	if os.Geteuid() != 0 || !directMountFlags {
		// fusermount3 takes them as words (and refuses dev and suid).
		mopts.Options = append(mopts.Options, o.MountFlags...)
	}
	if o.AllowOther {
		mopts.Options = append(mopts.Options, "default_permissions")
	}
	entry, attr, negative := DefaultEntryTimeout, DefaultAttrTimeout, DefaultNegativeTimeout
	if exclusive {
		entry, attr, negative = ExclusiveTimeout, ExclusiveTimeout, ExclusiveTimeout
	}
	if o.Shared {
		entry, attr, negative = 0, 0, 0
	}
	if st.fscaps&layer.FSXattrCache != 0 {
		st.xattrTTL = *timeout(o.AttrTimeout, attr)
		if exclusive && o.AttrTimeout == 0 {
			st.xattrTTL = -1 // nothing changes the lowers but the mount
		}
	}
	opts := &fs.Options{
		MountOptions:    mopts,
		EntryTimeout:    timeout(o.EntryTimeout, entry),
		AttrTimeout:     timeout(o.AttrTimeout, attr),
		NegativeTimeout: timeout(o.NegativeTimeout, negative),
		RootStableAttr:  &fs.StableAttr{Mode: syscall.S_IFDIR, Ino: rootIno, Gen: st.root.id.Gen},
		// Report the lower's permission bits exactly: without this, go-fuse
		// turns mode 0000 into 0644 (0755 for directories), and the kernel
		// then lets every user read a file nobody may read.
		NullPermissions: true,
		// The node id is the inode number (inoMap): stable while the lower
		// keeps the object, which file handles of the mount hold.
		ExternalNodeID: true,
		Logger:         log.New(&slogWriter{o.Logger}, "", 0),
	}
	srv, err := fuse.NewServer(&rawFS{RawFileSystem: fs.NewNodeFS(st.root, opts), st: st}, mountpoint, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	st.srv = srv
	// Layers that change objects by themselves say so (layer.ChangeReporter):
	// the kernel then fetches their attributes again.
	layer.Walk(top, func(l layer.FS) {
		if r, ok := l.(layer.ChangeReporter); ok {
			r.ReportChanges(st.changed)
		}
	})
	served := make(chan struct{})
	go func() {
		srv.Serve()
		st.releaseLeft()
		close(served)
	}()
	if err := srv.WaitMount(); err != nil {
		srv.Unmount()
		return nil, fmt.Errorf("mount %s: %w", mountpoint, err)
	}
	if o.Writeback && srv.KernelSettings().Flags64()&fuse.CAP_WRITEBACK_CACHE == 0 {
		srv.Unmount()
		return nil, fmt.Errorf("mount %s: -writeback: the kernel offers no writeback cache to FUSE", mountpoint)
	}
	if st.passthrough && *opts.AttrTimeout > mappedEvery {
		go st.watchMapped(served)
	}
	// Passthrough, as logged: whether files of this stack can be passed
	// through at all (each file's Caps decide).
	if transport != fuse.TransportDevFuse {
		o.Logger.Info("FUSE transport", "mountpoint", mountpoint, "asked", transport.String(), "serves", srv.Transport().String())
	}
	return &Server{Server: srv, Mountpoint: mountpoint, Passthrough: st.passthrough && layer.StackChanges(top)&layer.ChangesData == 0, Transport: srv.Transport().String(), served: served, st: st}, nil
}

// rawFS hands the node methods what go-fuse's node API leaves out of a
// request: the caller's umask of a create, tmpfile, mkdir or mknod (CAP_DONT_MASK
// leaves it to us, so that a default ACL of the directory can replace it),
// and the flags of a SETXATTR (CAP_SETXATTR_EXT). They travel keyed by the
// request's cancel channel, which belongs to one request while it is served
// (see state.extras). At the end of an OPEN or CREATE, it says how the
// kernel is to read and write the file opened (passthrough.go).
type rawFS struct {
	fuse.RawFileSystem
	st *state
}

func (r *rawFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	s := r.RawFileSystem.Open(cancel, in, out)
	if !r.st.passOpened(cancel, s, out) {
		// The file is released as the kernel would (it never sees it),
		// and the open fails: see passthrough.go.
		r.RawFileSystem.Release(cancel, &fuse.ReleaseIn{InHeader: in.InHeader, Fh: out.Fh, Flags: in.Flags})
		return fuse.Status(syscall.ESTALE)
	}
	return s
}

// Lookup: go-fuse answers a lookup of "." in a node it still has (a file
// handle of a node the kernel forgot, see handles.go) with that node even
// when it has no path: its object was removed (the handle is stale, as on
// ext4), or the kernel's FORGET of it came first and took it out of the
// tree. The lookup's count is given back, and the lookup asked once more:
// a node go-fuse has forgotten is found again (LookupNode).
func (r *rawFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	for try := 0; ; try++ {
		s := r.RawFileSystem.Lookup(cancel, h, name, out)
		if name != "." || !s.Ok() {
			return s
		}
		var a fuse.AttrOut
		if g := r.RawFileSystem.GetAttr(cancel, &fuse.GetAttrIn{InHeader: fuse.InHeader{NodeId: out.NodeId, Caller: h.Caller}}, &a); g.Ok() {
			return s
		}
		r.RawFileSystem.Forget(out.NodeId, 1)
		if try > 0 {
			return fuse.Status(syscall.ESTALE)
		}
	}
}

func (r *rawFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	r.st.extras.Store(cancel, in.Umask)
	defer r.st.extras.Delete(cancel)
	s := r.RawFileSystem.Create(cancel, in, name, out)
	r.st.passOpened(cancel, s, &out.OpenOut) // a new object: no backing file yet
	return s
}

func (r *rawFS) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	r.st.extras.Store(cancel, in.Umask)
	defer r.st.extras.Delete(cancel)
	s := r.RawFileSystem.Tmpfile(cancel, in, out)
	r.st.passOpened(cancel, s, &out.OpenOut) // a new object: no backing file yet
	return s
}

func (r *rawFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	r.st.extras.Store(cancel, in.Umask)
	defer r.st.extras.Delete(cancel)
	return r.RawFileSystem.Mkdir(cancel, in, name, out)
}

func (r *rawFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	if fl := setxattrFlags(in); fl != 0 {
		r.st.extras.Store(cancel, fl)
		defer r.st.extras.Delete(cancel)
	}
	return r.RawFileSystem.SetXAttr(cancel, in, attr, data)
}

func (r *rawFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	r.st.extras.Store(cancel, in.Umask)
	defer r.st.extras.Delete(cancel)
	return r.RawFileSystem.Mknod(cancel, in, name, out)
}

// slogWriter carries go-fuse's log lines into slog.
type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	w.l.Debug(strings.TrimRight(string(p), "\n"), "from", "go-fuse")
	return len(p), nil
}

// changed makes the kernel fetch the attributes of the object id again (a
// layer changed it by itself: layer.ChangeReporter). A number the kernel
// does not know is answered ENOENT, which is nothing to do.
func (st *state) changed(id layer.ID) {
	st.srv.InodeNotify(st.inos.ino(id), -1, 0)
}
