package acl

import (
	"errors"
	"fmt"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"cairn/layer"
	"cairn/pathmatch"
	"cairn/registry"
)

// Class is a class of operations, or a set of them.
type Class uint16

const (
	Read    Class = 1 << iota // open for reading, read, readdir
	Write                     // open for writing, write, truncate, fallocate, touch
	Create                    // create, mkdir, mknod, symlink, link (the new name)
	Delete                    // unlink, rmdir
	Rename                    // rename (both names)
	Setattr                   // chmod, chown, setting given times
	Xattr                     // get, list, set and remove extended attributes
	Exec                      // execve
	All     = Exec<<1 - 1
)

var classNames = []string{"read", "write", "create", "delete", "rename", "setattr", "xattr", "exec"}

func (k Class) String() string {
	var s []string
	for i, n := range classNames {
		if k&(1<<i) != 0 {
			s = append(s, n)
		}
	}
	return strings.Join(s, "+")
}

// Rule is one rule: it applies to a caller, an operation class and a path
// when each of its conditions holds (an empty condition always holds).
type Rule struct {
	Allow bool
	Paths *pathmatch.Set // nil: every path
	Uids  []uint32
	Gids  []uint32 // the caller's group or a supplementary group
	Procs []string // process names
	Ops   Class    // 0: every class
	Where string   // where the rule was written, for logs
}

// Rules are evaluated in order; the first rule that applies decides, and
// Default (allow or not) when none does.
type Rules struct {
	List    []Rule
	Default bool
}

// Decide says whether c may do an operation of class k on path, and which
// rule said so.
func (rs *Rules) Decide(c *layer.Caller, k Class, path string) (bool, string) {
	for i := range rs.List {
		r := &rs.List[i]
		// Cheap tests first: groups and process names may read /proc.
		if (r.Ops == 0 || r.Ops&k != 0) && (len(r.Uids) == 0 || slices.Contains(r.Uids, c.Uid)) &&
			(r.Paths == nil || r.Paths.Contains(path)) && r.caller(c) {
			return r.Allow, r.Where
		}
	}
	return rs.Default, "default"
}

// caller tests the conditions on the caller.
func (r *Rule) caller(c *layer.Caller) bool {
	return (len(r.Uids) == 0 || slices.Contains(r.Uids, c.Uid)) &&
		(len(r.Gids) == 0 || slices.ContainsFunc(r.Gids, c.InGroup)) &&
		(len(r.Procs) == 0 || slices.Contains(r.Procs, c.Comm()))
}

// Gains reports whether c could, under the name to, do something it cannot
// do under from. With dir, the object is a directory, and what lies below it
// must also be judged alike by every rule that can apply to c.
func (rs *Rules) Gains(c *layer.Caller, from, to string, dir func() bool) bool {
	for k := Class(1); k <= All; k <<= 1 {
		was, _ := rs.Decide(c, k, from)
		if now, _ := rs.Decide(c, k, to); now && !was {
			return true
		}
	}
	for i := range rs.List {
		r := &rs.List[i]
		if r.Paths != nil && !r.Paths.SameBelow(from, to) && r.caller(c) && dir() {
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
			id, err := lookup(u, func(s string) (string, error) { u, err := user.Lookup(s); return uid(u), err })
			r.Uids, errs = append(r.Uids, id), append(errs, err)
		}
		for _, g := range x.Values.List("groups") {
			id, err := lookup(g, func(s string) (string, error) { g, err := user.LookupGroup(s); return gid(g), err })
			r.Gids, errs = append(r.Gids, id), append(errs, err)
		}
		r.Procs = x.Values.List("procs")
		for _, o := range x.Values.List("ops") {
			i := slices.Index(classNames, o)
			if i < 0 {
				errs = append(errs, fmt.Errorf("rule at %s: unknown operation class %q (known: %s)", x.Where, o, strings.Join(classNames, ", ")))
				continue
			}
			r.Ops |= 1 << i
		}
		rs.List = append(rs.List, r)
	}
	return rs, errors.Join(errs...)
}

// lookup takes a number or a name.
func lookup(s string, byName func(string) (string, error)) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return uint32(n), nil
	}
	id, err := byName(s)
	if err != nil {
		return 0, fmt.Errorf("%q is neither a number nor a known name", s)
	}
	n, err := strconv.ParseUint(id, 10, 32)
	return uint32(n), err
}

func uid(u *user.User) string {
	if u == nil {
		return ""
	}
	return u.Uid
}

func gid(g *user.Group) string {
	if g == nil {
		return ""
	}
	return g.Gid
}
