package acl

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/pathmatch"
	"cairnfs.dev/cairn/registry"
)

// Class is a class of operations, or a set of them (layer.Class).
type Class = layer.Class

const (
	Read    = layer.ClassRead
	Write   = layer.ClassWrite
	Create  = layer.ClassCreate
	Delete  = layer.ClassDelete
	Rename  = layer.ClassRename
	Setattr = layer.ClassSetattr
	Xattr   = layer.ClassXattr
	Exec    = layer.ClassExec
	All     = layer.ClassAll
)

// Rule is one rule: it applies to a caller, an operation class and a path
// when each of its conditions holds (an empty condition always holds).
type Rule struct {
	Allow bool
	Paths *pathmatch.Set // nil: every path
	Uids  []uint32
	Gids  []uint32 // the caller's group or a supplementary group
	// Procs are programs: a path, or a name looked up in PATH when the
	// rules are loaded (Resolve). A caller matches when the file the kernel
	// executed for it (/proc/PID/exe) is one of them: same device and inode.
	Procs []string
	Ops   Class  // 0: every class
	Where string // where the rule was written, for logs

	progs []fileID // Procs resolved
}

// Rules are evaluated in order; the first rule that applies decides, and
// Default (allow or not) when none does.
//
// Reading implies execution: an execution that the rules allow is refused
// when reading the file is refused, unless the rule that allows it names
// exec in its ops. (A program that runs can be read back from its memory,
// /proc/PID/mem, by its user: the kernel protects only programs that the
// mode bits make unreadable.)
type Rules struct {
	List    []Rule
	Default bool

	once sync.Once
	err  error
}

// fileID is a file's identity: its device and inode.
type fileID struct{ dev, ino uint64 }

// Resolve finds the file of every program that the rules' Procs name, once;
// FromRegistry calls it (rules built by hand are resolved when first used).
// A program that cannot be found is an error, and its rule matches no one.
func (rs *Rules) Resolve() error {
	rs.once.Do(func() {
		var errs []error
		for i := range rs.List {
			r := &rs.List[i]
			r.progs = nil
			for _, p := range r.Procs {
				id, err := program(p)
				if err != nil {
					errs = append(errs, fmt.Errorf("rule at %s: %w", r.Where, err))
					continue
				}
				r.progs = append(r.progs, id)
			}
		}
		rs.err = errors.Join(errs...)
	})
	return rs.err
}

// program resolves a program name to its file: a name without a slash is
// looked up in PATH, as a shell does; symbolic links are followed.
func program(p string) (fileID, error) {
	path := p
	if !strings.Contains(p, "/") {
		lp, err := exec.LookPath(p)
		if err != nil {
			return fileID{}, fmt.Errorf("program %q is not in PATH: name it by its path", p)
		}
		path = lp
	}
	f, err := os.Open(path)
	if err != nil {
		return fileID{}, fmt.Errorf("program %q: %w", p, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileID{}, fmt.Errorf("program %q: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fileID{}, fmt.Errorf("program %q: %s is not a regular file", p, path)
	}
	// For a script the kernel runs its interpreter: /proc/PID/exe is the
	// interpreter's, and a rule naming the script would match no one.
	var head [2]byte
	if n, _ := f.ReadAt(head[:], 0); n == 2 && string(head[:]) == "#!" {
		return fileID{}, fmt.Errorf("program %q: %s is a script, and a process running it is its interpreter: name the interpreter (which matches every script it runs)", p, path)
	}
	return fileID{uint64(st.Dev), st.Ino}, nil
}

// who is a caller as the rules see it during one operation: what is read
// from /proc about it is read at most once.
type who struct {
	*layer.Caller
	exe      fileID
	exeKnown bool
	exeRead  bool
}

func (w *who) program() (fileID, bool) {
	if !w.exeRead {
		w.exeRead = true
		w.exe, w.exeKnown = procExe(w.Pid)
	}
	return w.exe, w.exeKnown
}

// Decide says whether c may do an operation of class k on path, and which
// rule said so.
func (rs *Rules) Decide(c *layer.Caller, k Class, path string) (bool, string) {
	return rs.decide(&who{Caller: c}, k, path)
}

func (rs *Rules) decide(w *who, k Class, path string) (bool, string) {
	allow, r := rs.first(w, k, path)
	if k == Exec && allow && (r == nil || r.Ops&Exec == 0) {
		// Allowed by the default or by a rule that does not name exec:
		// only if reading is allowed too.
		if read, rr := rs.first(w, Read, path); !read {
			return false, where(rr) + " (refusing to read refuses to execute, unless a rule allows exec by name)"
		}
	}
	return allow, where(r)
}

// first returns the decision of the first rule that applies (nil: the
// default's).
func (rs *Rules) first(w *who, k Class, path string) (bool, *Rule) {
	rs.Resolve()
	for i := range rs.List {
		r := &rs.List[i]
		// Cheap tests first: groups and programs read /proc.
		if (r.Ops == 0 || r.Ops&k != 0) && (len(r.Uids) == 0 || slices.Contains(r.Uids, w.Uid)) &&
			(r.Paths == nil || r.Paths.Contains(path)) && r.caller(w) {
			return r.Allow, r
		}
	}
	return rs.Default, nil
}

func where(r *Rule) string {
	if r == nil {
		return "default"
	}
	return r.Where
}

// caller tests the conditions on the caller.
func (r *Rule) caller(w *who) bool {
	if len(r.Uids) > 0 && !slices.Contains(r.Uids, w.Uid) {
		return false
	}
	if len(r.Gids) > 0 && !slices.ContainsFunc(r.Gids, w.InGroup) {
		return false
	}
	if len(r.Procs) > 0 {
		exe, ok := w.program()
		return ok && slices.Contains(r.progs, exe)
	}
	return true
}

// Gains reports whether c could, under the name to, do something it cannot
// do under from. With dir, the object is a directory, and what lies below it
// must also be judged alike by every rule that can apply to c.
func (rs *Rules) Gains(c *layer.Caller, from, to string, dir func() bool) bool {
	return rs.gains(&who{Caller: c}, from, to, dir)
}

func (rs *Rules) gains(w *who, from, to string, dir func() bool) bool {
	for k := Class(1); k <= All; k <<= 1 {
		was, _ := rs.decide(w, k, from)
		if now, _ := rs.decide(w, k, to); now && !was {
			return true
		}
	}
	for i := range rs.List {
		r := &rs.List[i]
		if r.Paths != nil && !r.Paths.SameBelow(from, to) && r.caller(w) && dir() {
			return true
		}
	}
	return false
}

var errFixed = errors.New("the rules are fixed (reload = false): remount to change them, or set reload = true")

// FromRegistry turns a layer's [[rule]] tables into Rules.
func FromRegistry(rules registry.Rules, allow bool) (*Rules, error) {
	rs := &Rules{Default: allow}
	var errs []error
	for _, x := range rules {
		r := Rule{Allow: x.Values.String("action") == "allow", Paths: x.Paths, Where: x.Where}
		for _, u := range x.Values.List("users") {
			id, err := registry.UserID(u)
			r.Uids, errs = append(r.Uids, id), append(errs, err)
		}
		for _, g := range x.Values.List("groups") {
			id, err := registry.GroupID(g)
			r.Gids, errs = append(r.Gids, id), append(errs, err)
		}
		r.Procs = x.Values.List("procs")
		for _, o := range x.Values.List("ops") {
			k, err := class(o)
			if err != nil {
				errs = append(errs, fmt.Errorf("rule at %s: %w", x.Where, err))
				continue
			}
			r.Ops |= k
		}
		rs.List = append(rs.List, r)
	}
	errs = append(errs, rs.Resolve())
	return rs, errors.Join(errs...)
}

func class(s string) (Class, error) { return layer.ParseClass(s) }
