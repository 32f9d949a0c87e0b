// Package snoop is Snoopfs: a layer that changes nothing and logs who
// touched what, one JSON line per operation (see Record).
//
// It is built on layer.Hooked, which calls a hook around every operation;
// snoop's hook is After, which filters the operation and queues a record.
// The framework's log sink (logsink) writes the records; when the log cannot keep up and the
// queue is full, operations do not wait: their records are dropped and
// counted, and the count is written to the log as a record of its own
// (op "dropped").
//
// Files under snoop keep kernel passthrough, so snoop sees their open and
// release but not each read and write; with io = true, snoop refuses
// passthrough and logs every read and write too.
//
// Its place in the stack is the user's choice: above a crypt layer it logs
// plaintext names, below it the encrypted ones.
//
// Size (Go lines without tests, comments and blank lines): 196;
// docs/snoop-acl.md compares it with FiST's Snoopfs.
package snoop

import (
	"context"
	"fmt"
	"time"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/logsink"
	"cairnfs.dev/cairn/pathmatch"
	"cairnfs.dev/cairn/registry"
)

// Options configure a snoop layer.
type Options struct {
	// Output is "file" (Log), "stdout" or "syslog".
	Output string
	Log    string
	// SyslogSocket is the unix datagram socket of syslog (default: the
	// system's, /dev/log); tests point it at a socket of their own.
	SyslogSocket string
	// Ops, Paths and Uids filter what is logged; empty means everything.
	// Paths are pathmatch patterns; an operation with two paths (rename,
	// link) is logged if either matches.
	Ops []string
	// Classes filter by class of operation (layer.ClassNames): an
	// operation is logged if one of its classes is named.
	Classes []string
	Paths   []string
	Uids    []string // numbers or user names
	// IO refuses kernel passthrough so that every read and write is logged.
	IO bool
	// Queue is how many records may wait for the writer (default 8192).
	Queue int
}

// FS is a snoop layer.
type FS struct {
	layer.Hooked
	ops     map[string]bool
	classes layer.Class
	paths   *pathmatch.Set
	uids    map[uint32]bool
	log     *logsink.Sink
}

// New stacks a snoop layer over lower.
func New(lower layer.FS, o Options) (*FS, error) {
	fs := &FS{}
	fs.Lower, fs.Hook, fs.NoPassthrough = lower, fs, o.IO
	if len(o.Ops) > 0 {
		fs.ops = map[string]bool{}
		for _, op := range o.Ops {
			if !known(op) {
				return nil, fmt.Errorf("snoop: unknown operation %q in ops (known: %v)", op, layer.OpNames)
			}
			fs.ops[op] = true
		}
	}
	for _, n := range o.Classes {
		k, err := layer.ParseClass(n)
		if err != nil {
			return nil, fmt.Errorf("snoop: classes: %w", err)
		}
		fs.classes |= k
	}
	// The kernel sends no flush for files whose close does nothing
	// (layer.CapNoFlush), unless the log wants flushes.
	first, second := (&layer.Op{Name: "flush"}).Classes()
	fs.Flushes = (fs.ops == nil || fs.ops["flush"]) && (fs.classes == 0 || (first|second)&fs.classes != 0)
	if len(o.Paths) > 0 {
		s, err := pathmatch.NewSet(o.Paths, nil)
		if err != nil {
			return nil, fmt.Errorf("snoop: paths: %w", err)
		}
		fs.paths = s
	}
	if len(o.Uids) > 0 {
		fs.uids = map[uint32]bool{}
		for _, u := range o.Uids {
			uid, err := registry.UserID(u)
			if err != nil {
				return nil, fmt.Errorf("snoop: uids: %w", err)
			}
			fs.uids[uid] = true
		}
	}
	w, err := logsink.New(logsink.Options{Output: o.Output, Path: o.Log, SyslogSocket: o.SyslogSocket, Tag: "cairn-snoop", Queue: o.Queue,
		Dropped: func(n int64) any { return &Record{Time: time.Now(), Op: "dropped", Result: "ok", Count: n} }})
	if err != nil {
		return nil, fmt.Errorf("snoop: %w", err)
	}
	fs.log = w
	return fs, nil
}

// Before lets every operation through.
func (fs *FS) Before(context.Context, *layer.Op) error { return nil }

// After logs the operation if the filters want it.
func (fs *FS) After(ctx context.Context, op *layer.Op) {
	c := layer.CallerOf(ctx)
	if fs.classes != 0 {
		if first, second := op.Classes(); (first|second)&fs.classes == 0 {
			return
		}
	}
	if fs.ops != nil && !fs.ops[op.Name] ||
		fs.uids != nil && !fs.uids[c.Uid] ||
		fs.paths != nil && !fs.paths.Contains(op.Path) && (op.Path2 == "" || !fs.paths.Contains(op.Path2)) {
		return
	}
	res, msg := result(op.Err)
	fs.log.Put(&Record{
		Time: op.Start, Op: op.Name, Path: op.Path, Path2: op.Path2,
		Uid: c.Uid, Gid: c.Gid, Pid: c.Pid, Comm: c.Comm(),
		Result: res, Error: msg, Bytes: op.Bytes, Latency: time.Since(op.Start),
	})
}

// Reopen reopens the log file (after rotation); cairn mount calls it on
// SIGHUP.
func (fs *FS) Reopen() error { return fs.log.Reopen() }

// Close writes what is queued and closes the log.
func (fs *FS) Close() error { return fs.log.Close() }

// Dropped is the number of records dropped so far.
func (fs *FS) Dropped() int64 { return fs.log.Dropped() }

func known(op string) bool {
	for _, n := range layer.OpNames {
		if n == op {
			return true
		}
	}
	return false
}

// FSCaps: no writeback cache (layer.FSWriteback). A record says who made
// each operation; under the cache the kernel sends writes when it writes
// pages back, as itself (from its flusher threads, or the process that
// happens to close or fsync the file), merged and reordered, and sets the
// mtime itself: the log would name the wrong process and user, and miss
// the writes as the application made them.
func (fs *FS) FSCaps() layer.FSCaps {
	return fs.Hooked.FSCaps() &^ (layer.FSWriteback | layer.FSXattrCache)
}
