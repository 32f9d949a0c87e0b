// Package acl is Aclfs: access rules beyond the mode bits. Rules allow or
// deny operations by user, group, process name, path and class of
// operation; the first rule that matches decides, and when none does the
// layer's default does. A refused operation gets EACCES (EPERM for chmod,
// chown and setting times, as POSIX says for those).
//
// It is built on layer.Hooked: all of its policing is the hook's Before.
//
// How the rules hold whatever route is taken to a file:
//   - symbolic links are followed by the kernel, so the layer sees, and
//     judges, the path they lead to;
//   - a rename is judged as a rename of both names, a delete of the old
//     one, a create of the new one and a write of a file it replaces;
//   - a rename or a hard link that would give its caller an access the
//     object did not have under its old name fails with EXDEV (mv then
//     copies and deletes, operations that are checked one by one);
//   - a program that may not be read may not be executed either, unless a
//     rule allows exec by name (its memory would give it away);
//   - procs rules match the file the kernel executed (/proc/PID/exe), not
//     the name a process gives itself;
//   - open files are judged at open, as POSIX permissions are, and by the
//     identity that opened them; mmap works on open files;
//   - when the rules may change while mounted (reload = true, SIGHUP), files
//     are not handed to the kernel (no passthrough) and every read, write
//     and fallocate of an open file is judged again by the current rules,
//     under the file's current name, so a descriptor kept across a rule
//     change loses what the new rules take away (pages already in the
//     kernel's cache stay readable).
//
// Size (Go lines without tests, comments and blank lines): 498 (acl.go,
// rules.go, procexe.go, register.go); docs/snoop-acl.md compares it with FiST's Aclfs
// and explains the choices above at length.
package acl

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// FS is an acl layer.
type FS struct {
	layer.Hooked
	rules  atomic.Pointer[Rules]
	reload bool
	log    bool
}

// New stacks an acl layer over lower. With reload, the rules may be
// replaced while the layer is in use (ReloadRules), and open files are
// checked on each read and write.
func New(lower layer.FS, rules *Rules, reload, logDenials bool) *FS {
	fs := &FS{reload: reload, log: logDenials}
	fs.Lower, fs.Hook, fs.NoPassthrough = lower, fs, reload
	if err := rules.Resolve(); err != nil {
		slog.Warn("acl: rules that name a program that cannot be found match no one", "err", err)
	}
	fs.rules.Store(rules)
	return fs
}

// ReloadRules replaces the rules (cairn mount calls it on SIGHUP).
func (fs *FS) ReloadRules(r registry.Rules) error {
	if !fs.reload {
		return errFixed
	}
	rs, err := FromRegistry(r, fs.rules.Load().Default)
	if err != nil {
		return err
	}
	fs.rules.Store(rs)
	return nil
}

// Before judges the operation.
func (fs *FS) Before(ctx context.Context, op *layer.Op) error {
	c := &who{Caller: layer.CallerOf(ctx)}
	rs := fs.rules.Load()
	first, second := op.Classes()
	switch op.Name {
	case "getxattr":
		// ls -l and the kernel ask for ACLs and security labels as they
		// ask for attributes: reading those is not policed.
		if strings.HasPrefix(op.Path2, "system.") || strings.HasPrefix(op.Path2, "security.") {
			return nil
		}
	case "link":
		if err := fs.check(rs, c, op, second, op.Path2); err != nil {
			return err
		}
		return fs.gain(rs, c, op, op.Path, op.Path2, func() bool { return false })
	case "rename":
		// Replacing a file is also a write of it.
		if op.Flags&(layer.RenameExchange|layer.RenameNoreplace) == 0 {
			if _, err := fs.Lower.Getattr(ctx, op.Path2); err == nil {
				second |= Write
			}
		}
		if err := fs.check(rs, c, op, first, op.Path); err != nil {
			return err
		}
		if err := fs.check(rs, c, op, second, op.Path2); err != nil {
			return err
		}
		isDir := func(p string) func() bool {
			return func() bool { a, err := fs.Lower.Getattr(ctx, p); return err != nil || a.IsDir() }
		}
		if err := fs.gain(rs, c, op, op.Path, op.Path2, isDir(op.Path)); err != nil {
			return err
		}
		if op.Flags&layer.RenameExchange != 0 {
			return fs.gain(rs, c, op, op.Path2, op.Path, isDir(op.Path2))
		}
		return nil
	case "read", "write", "fallocate", "copy_file_range":
		if !fs.reload {
			return nil // judged at open; the rules cannot change
		}
		c = &who{Caller: op.Opener} // mmap pages are written back by "uid 0"
		if err := fs.check(rs, c, op, second, op.Path2); err != nil {
			return err
		}
	}
	return fs.check(rs, c, op, first, op.Path)
}

// After does nothing: denials are logged by check.
func (fs *FS) After(context.Context, *layer.Op) {}

func (fs *FS) check(rs *Rules, c *who, op *layer.Op, classes Class, path string) error {
	for k := Class(1); k != 0 && k <= classes; k <<= 1 {
		if classes&k == 0 {
			continue
		}
		if allow, r := rs.decide(c, k, path); !allow {
			err := syscall.EACCES
			if k == Setattr {
				err = syscall.EPERM
			}
			fs.denied(c, op, k, path, r, err)
			return err
		}
	}
	return nil
}

// gain refuses, with EXDEV, a rename or link after which the caller could do
// what it cannot do under the old name.
func (fs *FS) gain(rs *Rules, c *who, op *layer.Op, from, to string, dir func() bool) error {
	if rs.gains(c, from, to, dir) {
		fs.denied(c, op, 0, to, "a new name with other rules", syscall.EXDEV)
		return syscall.EXDEV
	}
	return nil
}

func (fs *FS) denied(c *who, op *layer.Op, k Class, path, rule string, err error) {
	if fs.log {
		slog.Warn("acl: denied", "op", op.Name, "class", k.String(), "path", path, "uid", c.Uid, "gid", c.Gid,
			"pid", c.Pid, "comm", c.Comm(), "rule", rule, "errno", err.(syscall.Errno).Error())
	}
}

// FSCaps: no writeback cache (layer.FSWriteback). Under the cache the
// kernel sets a written file's mtime and ctime itself, by a SETATTR of
// given times at close and fsync (and sends touch as one too): the rules
// would judge it as a setattr of the closing process (or of root, when
// the kernel's flusher sends it), so a caller allowed to write and not to
// setattr would see its close fail, and a rule refusing setattr to some
// would not hold against touch. (Writes themselves are judged at open, or
// by the opener's identity: those would be safe.)
func (fs *FS) FSCaps() layer.FSCaps {
	return fs.Hooked.FSCaps() &^ (layer.FSWriteback | layer.FSXattrCache)
}
