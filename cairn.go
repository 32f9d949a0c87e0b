// Package cairn runs a cairn stack in-process: Open takes a spec, as
// `cairn mount` does (a spec file, or the inline form such as
// "zstd,null:/srv/data"), builds the stack with the same checks, and
// returns it to be used as a Go library, through an API in the manner of
// package os (OpenFile, Mkdir, Rename, Chmod, ...) or as an io/fs.FS (FS),
// with no FUSE mount and no daemon.
//
// Names are slash-separated paths inside the stack, as io/fs takes them:
// "a/b.txt"; "." (or "") is the stack's root; a leading "/" is allowed and
// means the same root. Symbolic links are followed inside the stack, as
// the kernel follows them through a mount (an absolute target is taken from
// the stack's root, never from the host's).
//
// The stack acts for the caller that Options gives (by default this
// process): that identity is what acl rules judge and snoop records, and
// it owns what is created when the process runs as root. Permission bits are
// not checked again here: through a mount the kernel checks them; in-process
// the lower file system checks them for this process, as it would for any
// program.
//
// Errors are *fs.PathError (*os.LinkError for Rename) wrapping the errno,
// so errors.Is(err, fs.ErrNotExist) works.
package cairn

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	_ "cairnfs.dev/cairn/layers/all" // every layer type a spec may name
	"cairnfs.dev/cairn/registry"
	"cairnfs.dev/cairn/spec"
)

// Options configure Open.
type Options struct {
	// Secrets gives the secret (passphrase or key) of each layer that
	// needs one (crypt), by the layer's name in the spec. A layer with
	// none here takes it from its own options (passfile, extpass); a
	// terminal is never asked.
	Secrets map[string][]byte
	// Caller is the identity the stack acts for (acl, snoop, the owner
	// of new objects when running as root). Nil: this process, with its
	// umask.
	Caller *layer.Caller
	// NoClaim leaves the stack's lowers unclaimed. By default Open claims
	// them as `cairn mount` does, so that a mount or an fsck of the same
	// lowers is refused while the stack is open.
	NoClaim bool
}

// Stack is a stack opened in-process. Its methods may be called from
// several goroutines.
type Stack struct {
	top  layer.FS
	st   *spec.Stack
	ctx  context.Context
	once sync.Once
	err  error
}

// Open parses and checks the spec, as `cairn check` does (every mistake
// reported with its file:line:column), builds the stack and claims its
// lowers. Close it when done.
func Open(specArg string, o Options) (*Stack, error) {
	var s *spec.Spec
	var err error
	if spec.LooksInline(specArg) {
		s, err = spec.ParseInline(specArg)
	} else {
		s, err = spec.Load(specArg)
	}
	if err != nil {
		return nil, err
	}
	for _, name := range s.Order {
		l := s.Layers[name]
		t := l.TypeInfo()
		if t == nil || t.Secret == nil || l.Values == nil {
			continue
		}
		if b, ok := o.Secrets[name]; ok {
			l.Values[registry.SecretKey] = append([]byte(nil), b...)
		}
	}
	st, err := s.Build()
	if err != nil {
		return nil, err
	}
	c := o.Caller
	if c == nil {
		self := *layer.Self()
		self.Umask = processUmask()
		c = &self
	}
	ctx := layer.WithCaller(context.Background(), c)
	if !o.NoClaim {
		if err := layer.ClaimStack(ctx, st.Top); err != nil {
			st.Close()
			return nil, err
		}
	}
	return &Stack{top: st.Top, st: st, ctx: ctx}, nil
}

// New wraps a stack built with the layer packages (the top layer of it).
// Close closes every layer of it.
func New(top layer.FS, caller *layer.Caller) *Stack {
	if caller == nil {
		self := *layer.Self()
		self.Umask = processUmask()
		caller = &self
	}
	return &Stack{top: top, ctx: layer.WithCaller(context.Background(), caller)}
}

// Layer is the stack's top layer, for what the layer API offers beyond
// this package.
func (s *Stack) Layer() layer.FS { return s.top }

// Close closes the stack (every layer of it, top first) and lets go of its
// lowers. Files still open are closed first by their own Close, or not at
// all: close them before.
func (s *Stack) Close() error {
	s.once.Do(func() {
		if s.st != nil {
			s.err = s.st.Close()
		} else {
			s.err = layer.CloseStack(s.top)
		}
	})
	return s.err
}

// processUmask reads this process's umask without changing it (from
// /proc/self/status; 022 where that cannot be read).
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Umask:"); ok {
				if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
					return uint32(m)
				}
			}
		}
	}
	return 0o022
}

// ---- names ---------------------------------------------------------------

// maxLinks is how many symbolic links one name may go through (Linux's
// MAXSYMLINKS).
const maxLinks = 40

// clean turns a name into a layer path ("" is the root), or false.
func clean(name string) (string, bool) {
	name = strings.TrimPrefix(name, "/")
	if name == "" || name == "." {
		return "", true
	}
	if !fs.ValidPath(name) {
		return "", false
	}
	return name, true
}

// resolve follows the symbolic links of name's directories (and of name
// itself when follow is set) and gives the layer path of what it names.
func (s *Stack) resolve(op, name string, follow bool) (string, error) {
	p, ok := clean(name)
	if !ok {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	links := 0
	var done []string
	rest := strings.Split(p, "/")
	if p == "" {
		rest = nil
	}
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		cur := strings.Join(append(done, c), "/")
		if len(rest) == 0 && !follow {
			done = append(done, c)
			break
		}
		a, err := s.top.Getattr(s.ctx, cur)
		if err != nil {
			if len(rest) == 0 && errors.Is(err, syscall.ENOENT) {
				done = append(done, c) // a name to create
				break
			}
			return "", &fs.PathError{Op: op, Path: name, Err: errno(err)}
		}
		if a.Mode&unix.S_IFMT != unix.S_IFLNK {
			if len(rest) > 0 && !a.IsDir() {
				return "", &fs.PathError{Op: op, Path: name, Err: syscall.ENOTDIR}
			}
			done = append(done, c)
			continue
		}
		if links++; links > maxLinks {
			return "", &fs.PathError{Op: op, Path: name, Err: syscall.ELOOP}
		}
		target, err := s.top.Readlink(s.ctx, cur)
		if err != nil {
			return "", &fs.PathError{Op: op, Path: name, Err: errno(err)}
		}
		if strings.HasPrefix(target, "/") {
			done = nil
		}
		var parts []string
		for _, t := range strings.Split(target, "/") {
			if t != "" {
				parts = append(parts, t)
			}
		}
		rest = append(parts, rest...)
	}
	return strings.Join(done, "/"), nil
}

// errno is the errno err carries (EIO when it carries none).
func errno(err error) error {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return layer.Errno(err)
}

func pathErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	return &fs.PathError{Op: op, Path: name, Err: errno(err)}
}

// ---- the os-like API -------------------------------------------------------

// OpenFile opens name with flag (os.O_RDONLY, os.O_CREATE, ...) and, for
// a new file, perm (less the caller's umask), as os.OpenFile does.
func (s *Stack) OpenFile(name string, flag int, perm fs.FileMode) (*File, error) {
	p, err := s.resolve("open", name, flag&os.O_EXCL == 0 || flag&os.O_CREATE == 0)
	if err != nil {
		return nil, err
	}
	a, err := s.top.Getattr(s.ctx, p)
	switch {
	case err == nil && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EEXIST}
	case err == nil && a.IsDir():
		if flag&(os.O_WRONLY|os.O_RDWR) != 0 {
			return nil, &fs.PathError{Op: "open", Path: name, Err: syscall.EISDIR}
		}
		return &File{s: s, name: name, path: p, dir: true}, nil
	case err == nil:
		f, err := s.top.Open(s.ctx, p, flag&^(os.O_CREATE|os.O_EXCL))
		if err != nil {
			return nil, pathErr("open", name, err)
		}
		return newFile(s, name, p, f, flag), nil
	case errors.Is(err, syscall.ENOENT) && flag&os.O_CREATE != 0:
		f, _, err := s.top.Create(s.ctx, p, flag&^os.O_CREATE|os.O_EXCL, uint32(perm.Perm())|modeBits(perm))
		if errors.Is(err, syscall.EEXIST) && flag&os.O_EXCL == 0 {
			// Made meanwhile: open it.
			return s.OpenFile(name, flag&^os.O_CREATE, perm)
		}
		if err != nil {
			return nil, pathErr("open", name, err)
		}
		return newFile(s, name, p, f, flag), nil
	default:
		return nil, pathErr("open", name, err)
	}
}

// modeBits are the set-id and sticky bits of m, as a mode's.
func modeBits(m fs.FileMode) uint32 {
	var b uint32
	if m&fs.ModeSetuid != 0 {
		b |= unix.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		b |= unix.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		b |= unix.S_ISVTX
	}
	return b
}

// Create creates or truncates name (mode 0666 less the umask).
func (s *Stack) Create(name string) (*File, error) {
	return s.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
}

// ReadFile reads the whole of name.
func (s *Stack) ReadFile(name string) ([]byte, error) {
	f, err := s.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.readAll()
}

// WriteFile writes data to name, creating it with perm if need be.
func (s *Stack) WriteFile(name string, data []byte, perm fs.FileMode) error {
	f, err := s.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err1 := f.Close(); err == nil {
		err = err1
	}
	return err
}

// Mkdir makes directory name with perm (less the umask).
func (s *Stack) Mkdir(name string, perm fs.FileMode) error {
	p, err := s.resolve("mkdir", name, false)
	if err != nil {
		return err
	}
	_, err = s.top.Mkdir(s.ctx, p, uint32(perm.Perm())|modeBits(perm))
	return pathErr("mkdir", name, err)
}

// MkdirAll makes name and the directories above it that are missing.
func (s *Stack) MkdirAll(name string, perm fs.FileMode) error {
	p, ok := clean(name)
	if !ok {
		return &fs.PathError{Op: "mkdir", Path: name, Err: fs.ErrInvalid}
	}
	if p == "" {
		return nil
	}
	if fi, err := s.Stat(p); err == nil {
		if fi.IsDir() {
			return nil
		}
		return &fs.PathError{Op: "mkdir", Path: name, Err: syscall.ENOTDIR}
	}
	if i := strings.LastIndex(p, "/"); i > 0 {
		if err := s.MkdirAll(p[:i], perm); err != nil {
			return err
		}
	}
	err := s.Mkdir(p, perm)
	if err != nil {
		if fi, serr := s.Lstat(p); serr == nil && fi.IsDir() {
			return nil
		}
	}
	return err
}

// Remove removes the file or empty directory name.
func (s *Stack) Remove(name string) error {
	p, err := s.resolve("remove", name, false)
	if err != nil {
		return err
	}
	err = s.top.Unlink(s.ctx, p)
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EPERM) {
		if a, aerr := s.top.Getattr(s.ctx, p); aerr == nil && a.IsDir() {
			err = s.top.Rmdir(s.ctx, p)
		}
	}
	return pathErr("remove", name, err)
}

// RemoveAll removes name and everything below it; a missing name is no
// error.
func (s *Stack) RemoveAll(name string) error {
	p, ok := clean(name)
	if !ok {
		return &fs.PathError{Op: "removeall", Path: name, Err: fs.ErrInvalid}
	}
	if p == "" {
		return &fs.PathError{Op: "removeall", Path: name, Err: fs.ErrInvalid}
	}
	fi, err := s.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		ents, err := s.ReadDir(p)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := s.RemoveAll(p + "/" + e.Name()); err != nil {
				return err
			}
		}
	}
	if err := s.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// Rename renames (moves) oldname to newname, replacing what newname names
// as rename(2) does.
func (s *Stack) Rename(oldname, newname string) error {
	op, err := s.resolve("rename", oldname, false)
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: errno(err)}
	}
	np, err := s.resolve("rename", newname, false)
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: errno(err)}
	}
	if err := s.top.Rename(s.ctx, op, np, 0); err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: errno(err)}
	}
	return nil
}

// Symlink makes newname a symbolic link to oldname.
func (s *Stack) Symlink(oldname, newname string) error {
	p, err := s.resolve("symlink", newname, false)
	if err != nil {
		return &os.LinkError{Op: "symlink", Old: oldname, New: newname, Err: errno(err)}
	}
	if _, err := s.top.Symlink(s.ctx, oldname, p); err != nil {
		return &os.LinkError{Op: "symlink", Old: oldname, New: newname, Err: errno(err)}
	}
	return nil
}

// Link makes newname a hard link to oldname.
func (s *Stack) Link(oldname, newname string) error {
	op, err := s.resolve("link", oldname, false)
	if err == nil {
		var np string
		if np, err = s.resolve("link", newname, false); err == nil {
			_, err = s.top.Link(s.ctx, op, np)
		}
	}
	if err != nil {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: errno(err)}
	}
	return nil
}

// Readlink gives the target of the symbolic link name.
func (s *Stack) Readlink(name string) (string, error) {
	p, err := s.resolve("readlink", name, false)
	if err != nil {
		return "", err
	}
	t, err := s.top.Readlink(s.ctx, p)
	return t, pathErr("readlink", name, err)
}

// Stat describes what name names, following a final symbolic link.
func (s *Stack) Stat(name string) (fs.FileInfo, error) { return s.stat("stat", name, true) }

// Lstat describes name itself, a symbolic link included.
func (s *Stack) Lstat(name string) (fs.FileInfo, error) { return s.stat("lstat", name, false) }

func (s *Stack) stat(op, name string, follow bool) (fs.FileInfo, error) {
	p, err := s.resolve(op, name, follow)
	if err != nil {
		return nil, err
	}
	a, err := s.top.Getattr(s.ctx, p)
	if err != nil {
		return nil, pathErr(op, name, err)
	}
	return newInfo(baseName(p), a), nil
}

func (s *Stack) setattr(op, name string, in *layer.SetAttr) error {
	p, err := s.resolve(op, name, true)
	if err != nil {
		return err
	}
	_, err = s.top.Setattr(s.ctx, p, in)
	return pathErr(op, name, err)
}

// Chmod sets name's permission bits (and set-id and sticky bits).
func (s *Stack) Chmod(name string, mode fs.FileMode) error {
	return s.setattr("chmod", name, &layer.SetAttr{Valid: layer.SetMode, Mode: uint32(mode.Perm()) | modeBits(mode)})
}

// Chown sets name's owner and group; -1 leaves one as it is.
func (s *Stack) Chown(name string, uid, gid int) error {
	in := &layer.SetAttr{}
	if uid >= 0 {
		in.Valid |= layer.SetUid
		in.Uid = uint32(uid)
	}
	if gid >= 0 {
		in.Valid |= layer.SetGid
		in.Gid = uint32(gid)
	}
	if in.Valid == 0 {
		return nil
	}
	return s.setattr("chown", name, in)
}

// Chtimes sets name's access and modification times; a zero time leaves
// that one as it is.
func (s *Stack) Chtimes(name string, atime, mtime time.Time) error {
	in := &layer.SetAttr{}
	if !atime.IsZero() {
		in.Valid |= layer.SetAtime
		in.Atime = unix.NsecToTimespec(atime.UnixNano())
	}
	if !mtime.IsZero() {
		in.Valid |= layer.SetMtime
		in.Mtime = unix.NsecToTimespec(mtime.UnixNano())
	}
	if in.Valid == 0 {
		return nil
	}
	return s.setattr("chtimes", name, in)
}

// Truncate sets name's size.
func (s *Stack) Truncate(name string, size int64) error {
	if size < 0 {
		return &fs.PathError{Op: "truncate", Path: name, Err: syscall.EINVAL}
	}
	return s.setattr("truncate", name, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)})
}

// ReadDir lists directory name, sorted by name, as os.ReadDir does.
func (s *Stack) ReadDir(name string) ([]fs.DirEntry, error) {
	p, err := s.resolve("readdir", name, true)
	if err != nil {
		return nil, err
	}
	return s.readDir(name, p)
}

func baseName(p string) string {
	if p == "" {
		return "."
	}
	return p[strings.LastIndex(p, "/")+1:]
}

// String names the stack for messages.
func (s *Stack) String() string { return fmt.Sprintf("cairn stack %T", s.top) }
