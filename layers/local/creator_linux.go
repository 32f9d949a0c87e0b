package local

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// creators run the system calls that create objects (open with O_CREAT,
// mkdirat, mknodat, symlinkat) on OS threads of their own, so that
//   - the new object's mode is exactly what the caller asked for under its
//     own umask (layer.Caller.Umask), whatever the daemon's umask is: each
//     thread has a private fs_struct (unshare(CLONE_FS)), whose umask is
//     set per call, and the lower file system applies it, or a default ACL
//     of the directory instead, as it does for any process;
//   - the object belongs to the caller: the thread takes the caller's
//     fsuid, fsgid and supplementary groups for the call (when the daemon
//     runs as root).
//
// A thread whose identity could not be restored is never reused: its
// goroutine ends while locked to it, and the runtime ends the thread.
type creators struct {
	mu      sync.Mutex
	jobs    chan *job
	quit    chan struct{}
	running int
	closed  bool
}

// maxCreators bounds the threads; more concurrent creates wait for one.
const maxCreators = 16

var errClosed = errors.New("local: the layer is closed")

type job struct {
	c       *layer.Caller
	asOwner bool
	fn      func() error
	done    chan error
}

// run runs fn on a creator thread with c's umask and, if asOwner, c's
// file-system identity.
func (cs *creators) run(c *layer.Caller, asOwner bool, fn func() error) error {
	cs.mu.Lock()
	if cs.closed {
		cs.mu.Unlock()
		return errClosed
	}
	if cs.jobs == nil {
		cs.jobs, cs.quit = make(chan *job), make(chan struct{})
	}
	jobs, quit := cs.jobs, cs.quit
	cs.mu.Unlock()
	j := &job{c: c, asOwner: asOwner, fn: fn, done: make(chan error, 1)}
	select {
	case jobs <- j:
	case <-quit:
		return errClosed
	default:
		// No idle thread: start one if the bound allows, then wait for
		// whichever is free first.
		cs.mu.Lock()
		if cs.running < maxCreators {
			cs.running++
			go cs.work(jobs, quit)
		}
		cs.mu.Unlock()
		select {
		case jobs <- j:
		case <-quit:
			return errClosed
		}
	}
	return <-j.done
}

func (cs *creators) close() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.closed = true
	if cs.quit != nil {
		close(cs.quit)
	}
}

func (cs *creators) work(jobs chan *job, quit chan struct{}) {
	// Never unlocked: the thread's fs_struct is its own from here on, and
	// it ends with this goroutine.
	runtime.LockOSThread()
	defer func() {
		cs.mu.Lock()
		cs.running--
		cs.mu.Unlock()
	}()
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		err = fmt.Errorf("local: cannot give a thread its own umask (unshare CLONE_FS): %w", err)
		select {
		case j := <-jobs:
			j.done <- err
		case <-quit:
		}
		return
	}
	for {
		select {
		case j := <-jobs:
			err, reusable := j.do()
			j.done <- err
			if !reusable {
				return
			}
		case <-quit:
			return
		}
	}
}

// do runs the job on the current (creator) thread and reports whether the
// thread's identity is the daemon's again.
func (j *job) do() (error, bool) {
	unix.Umask(int(j.c.Umask & 0o777))
	if !j.asOwner || j.c.Uid == 0 && j.c.Gid == 0 {
		return j.fn(), true
	}
	// The raw system calls change this thread only (glibc-style all-thread
	// set*id is exactly what we must avoid here).
	if err := setgroups(j.c.Groups()); err != nil {
		return err, setgroups(nil) == nil
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(j.c.Gid), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(j.c.Uid), 0, 0)
	err := j.fn()
	unix.RawSyscall(unix.SYS_SETFSUID, 0, 0, 0)
	unix.RawSyscall(unix.SYS_SETFSGID, 0, 0, 0)
	return err, setgroups(nil) == nil
}

// hasDefaultACL reports whether directory dfd (an O_PATH descriptor) may
// have a default ACL: true unless the lower says it has none (ENODATA) or
// keeps no ACLs (EOPNOTSUPP). It asks getxattrat(2) for "." in dfd, since
// fgetxattr refuses O_PATH descriptors; a kernel older than 6.13 goes
// through /proc/self/fd. The answer "none" is kept with a cached directory
// descriptor (a second at most, dirCache): a create costs no getxattr of
// its directory then, which on a network lower is a round trip.
func (fs *FS) hasDefaultACL(dfd int) bool {
	if fs.dirs.noDefaultACL(dfd) {
		return false
	}
	_, err := getxattrat(dfd, ".", "system.posix_acl_default", nil)
	if err == unix.ENOSYS {
		_, err = unix.Getxattr("/proc/self/fd/"+strconv.Itoa(dfd), "system.posix_acl_default", nil)
	}
	if err == layer.ENOATTR || err == unix.EOPNOTSUPP {
		fs.dirs.setNoDefaultACL(dfd)
		return false
	}
	return true
}

// asCaller runs mk, which creates an object in directory dfd with the mode
// it is given, as the caller: with the caller's umask applied (or a default
// ACL of the directory instead), and owned by the caller when the daemon
// runs as root. When that needs nothing of the thread (see direct), mk runs
// here with the umask applied to the mode; otherwise on a creator thread
// (see creators), which the kernel gives the caller's umask and identity.
func (fs *FS) asCaller(ctx context.Context, dfd int, name string, mode uint32, mk func(mode uint32) error) error {
	c := layer.CallerOf(ctx)
	if fs.direct(c, dfd) {
		return mk(mode &^ (c.Umask & 0o777))
	}
	return fs.creators.run(c, fs.asOwner, func() error { return mk(mode) })
}

// direct reports whether a create by c in directory dfd can run on the
// calling thread, which has the daemon's identity and the process's umask:
// no identity to take (the daemon is not root, or c is root), a process
// umask that takes no bit c's umask leaves (the mode is masked with c's
// umask first), and no default ACL on the directory (the kernel would
// ignore the umask for it, and the mode, masked already, would be wrong).
// Creates take this way for root callers, which saves a hand-off to a
// creator thread and back per create (about a seventh of an untar's time).
// The process umask is read once, by New: a program that widens it later
// only sends more creates to the creator threads; one that narrows it gets
// modes without the bits it added, never more than the caller asked.
func (fs *FS) direct(c *layer.Caller, dfd int) bool {
	if fs.asOwner && (c.Uid != 0 || c.Gid != 0) {
		return false
	}
	if fs.umask&^(c.Umask&0o777) != 0 {
		return false
	}
	return !fs.hasDefaultACL(dfd)
}

func setgroups(g []uint32) error {
	var p unsafe.Pointer
	if len(g) > 0 {
		p = unsafe.Pointer(&g[0])
	}
	_, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(g)), uintptr(p), 0)
	if e != 0 {
		return e
	}
	return nil
}
