// Package fault injects faults into the operations that pass through it, in
// the spirit of CharybdeFS and unreliablefs: by [[rule]] (path patterns and
// operation classes or names) it makes an operation fail with an errno,
// wait (a latency), read or write fewer bytes than asked, or hang until a
// timeout, each with a probability or after N operations. It is how
// cairn's replica layer is tested, and how users test their own stacks.
//
// It is built on layer.Hooked: all it does is in the hook's Before. It
// changes nothing when no rule fires, and keeps kernel passthrough unless a
// rule can fire on reads or writes (or the rules may change while mounted:
// reload = true), since the kernel's reads and writes of a passed-through
// file never reach the layer.
package fault

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/pathmatch"
	"cairnfs.dev/cairn/registry"
)

// Rule is one fault: where it applies (Paths, Ops, Names), when it fires
// (After, Probability) and what it does (Delay, Hang, Short, Errno).
type Rule struct {
	Paths *pathmatch.Set // nil: every path
	// Ops are the operation classes it applies to, Names the operations
	// (layer.OpNames); both empty: every operation.
	Ops   layer.Class
	Names []string
	// After: the first After operations the rule applies to pass
	// untouched; it fires from the next one on.
	After int64
	// Probability that it fires on an operation (after After); 0 is 1.
	Probability float64
	// Delay is a latency added before the operation goes down.
	Delay time.Duration
	// Hang holds the operation that long (or until it is interrupted),
	// then fails it with Errno (EIO if none).
	Hang time.Duration
	// Short cuts reads and writes to at most Short bytes.
	Short int64
	// Errno fails the operation. With nothing else set, a rule fails it
	// with EIO.
	Errno syscall.Errno
	Where string // the rule's position in its spec, for logs

	seen atomic.Int64
}

// Rules are tried in order; the first that applies to an operation decides
// (and counts it).
type Rules []*Rule

// FS is a fault layer.
//
// It keeps the writeback cache (layer.FSWriteback, the lower's): a fault
// on a write then reaches the application at fsync or close, as the
// lower's own errors do, which is what a test of a writeback mount wants;
// its rules name paths and operations, never callers, whom the kernel's
// writeback does not carry.
type FS struct {
	layer.Hooked
	rules  atomic.Pointer[Rules]
	reload bool
	log    bool
	fired  atomic.Int64
}

// New stacks a fault layer over lower. With reload the rules may change
// while the layer is in use (SetRules, ReloadRules on SIGHUP), and no file
// is passed through to the kernel.
func New(lower layer.FS, rules Rules, reload, logFaults bool) *FS {
	fs := &FS{reload: reload, log: logFaults}
	fs.Lower, fs.Hook = lower, fs
	fs.NoPassthrough = reload || rules.ioRule() >= 0
	fs.rules.Store(&rules)
	return fs
}

// ioRule is the first rule that may fire on reads or writes of open files
// (-1: none). Any such rule, whatever its paths, keeps every file of the
// layer from the kernel (the registration's NoPassthrough says so to
// cairn explain).
func (rs Rules) ioRule() int {
	for k, r := range rs {
		if r.applies(&layer.Op{Name: "read"}) || r.applies(&layer.Op{Name: "write"}) {
			return k
		}
	}
	return -1
}

// SetRules replaces the rules (tests; a layer built with reload only, for
// a layer without it passes its files through and would miss reads and
// writes).
func (fs *FS) SetRules(rs Rules) error {
	if !fs.reload && rs.ioRule() >= 0 && !fs.NoPassthrough {
		return errFixed
	}
	fs.rules.Store(&rs)
	return nil
}

var errFixed = errors.New("fault: the rules are fixed (reload = false): remount to change them, or set reload = true")

// ReloadRules replaces the rules with the spec's (cairn mount calls it on
// SIGHUP).
func (fs *FS) ReloadRules(r registry.Rules) error {
	if !fs.reload {
		return errFixed
	}
	rs, err := FromRegistry(r)
	if err != nil {
		return err
	}
	return fs.SetRules(rs)
}

// Fired is how many operations the rules have changed so far.
func (fs *FS) Fired() int64 { return fs.fired.Load() }

// Changes: nothing, when no rule fires.
func (fs *FS) Changes() layer.Changes { return 0 }

func (r *Rule) applies(op *layer.Op) bool {
	if r.Ops == 0 && len(r.Names) == 0 {
		return true
	}
	first, second := op.Classes()
	if r.Ops&(first|second) != 0 {
		return true
	}
	for _, n := range r.Names {
		if n == op.Name {
			return true
		}
	}
	return false
}

func (r *Rule) covers(op *layer.Op) bool {
	if r.Paths == nil || r.Paths.Contains(op.Path) {
		return true
	}
	switch op.Name {
	case "rename", "link":
		return r.Paths.Contains(op.Path2)
	}
	return false
}

// Before finds the first rule for the operation and applies it.
func (fs *FS) Before(ctx context.Context, op *layer.Op) error {
	for _, r := range *fs.rules.Load() {
		if !r.applies(op) || !r.covers(op) {
			continue
		}
		if r.seen.Add(1) <= r.After || r.Probability > 0 && rand.Float64() >= r.Probability {
			return nil
		}
		fs.fired.Add(1)
		err := r.apply(ctx, op)
		if fs.log {
			slog.Warn("fault: injected", "op", op.Name, "path", op.Path, "rule", r.Where, "err", err)
		}
		return err
	}
	return nil
}

func (r *Rule) apply(ctx context.Context, op *layer.Op) error {
	if r.Delay > 0 {
		sleep(ctx, r.Delay)
	}
	if r.Hang > 0 {
		sleep(ctx, r.Hang)
		if r.Errno != 0 {
			return r.Errno
		}
		return syscall.EIO
	}
	if r.Short > 0 && (op.Name == "read" || op.Name == "write") && op.Size > r.Short {
		op.Size = r.Short
	}
	if r.Errno == 0 && r.Delay == 0 && r.Short == 0 {
		return syscall.EIO
	}
	if r.Errno != 0 {
		return r.Errno
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// After does nothing.
func (fs *FS) After(context.Context, *layer.Op) {}

// ParseErrno reads an errno by name ("EIO", "ENOSPC") or number.
func ParseErrno(s string) (syscall.Errno, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 4096 {
		return syscall.Errno(n), nil
	}
	for e := syscall.Errno(1); e < 256; e++ {
		if unix.ErrnoName(e) == s {
			return e, nil
		}
	}
	return 0, fmt.Errorf("unknown errno %q (give a name such as EIO, ENOSPC, ETIMEDOUT, or a number)", s)
}

// ParseOp reads an entry of a rule's ops: a class (layer.ClassNames) or an
// operation (layer.OpNames).
func ParseOp(s string) (layer.Class, string, error) {
	if k, err := layer.ParseClass(s); err == nil {
		return k, "", nil
	}
	for _, n := range layer.OpNames {
		if n == s {
			return 0, n, nil
		}
	}
	return 0, "", fmt.Errorf("unknown operation or class %q (classes: read, write, create, delete, rename, setattr, xattr, exec; or an operation: getattr, open, fsync, ...)", s)
}

// ParseProbability reads a probability: a number from 0 to 1, or a
// percentage ("5%").
func ParseProbability(s string) (float64, error) {
	scale := 1.0
	if len(s) > 0 && s[len(s)-1] == '%' {
		s, scale = s[:len(s)-1], 100
	}
	p, err := strconv.ParseFloat(s, 64)
	if err != nil || p != p || p <= 0 || p/scale > 1 {
		return 0, fmt.Errorf("a probability is a number above 0 and at most 1, or a percentage such as \"5%%\", found %q", s)
	}
	return p / scale, nil
}

// FromRegistry turns a layer's [[rule]] tables into Rules.
func FromRegistry(rules registry.Rules) (Rules, error) {
	var rs Rules
	var errs []error
	for _, x := range rules {
		r := &Rule{Paths: x.Paths, Where: x.Where, After: x.Values.Int("after"),
			Delay: x.Values.Duration("delay"), Hang: x.Values.Duration("hang"), Short: x.Values.Int("short")}
		for _, o := range x.Values.List("ops") {
			k, n, err := ParseOp(o)
			if err != nil {
				errs = append(errs, fmt.Errorf("rule at %s: %w", x.Where, err))
			}
			r.Ops |= k
			if n != "" {
				r.Names = append(r.Names, n)
			}
		}
		if e := x.Values.String("errno"); e != "" {
			var err error
			if r.Errno, err = ParseErrno(e); err != nil {
				errs = append(errs, fmt.Errorf("rule at %s: %w", x.Where, err))
			}
		}
		if p := x.Values.String("probability"); p != "" {
			var err error
			if r.Probability, err = ParseProbability(p); err != nil {
				errs = append(errs, fmt.Errorf("rule at %s: %w", x.Where, err))
			}
		}
		rs = append(rs, r)
	}
	return rs, errors.Join(errs...)
}
