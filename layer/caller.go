package layer

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Caller is the identity of the process that made a request.
type Caller struct {
	Uid, Gid uint32
	Pid      uint32
	// Umask is the caller's umask, still to be applied to the mode of the
	// object a Create, Mkdir or Mknod makes: the bottom layer applies it
	// unless a default ACL of the new object's directory takes its place,
	// as every Linux file system does. 0 when the mode is final.
	Umask uint32

	once     sync.Once
	groups   []uint32
	commOnce sync.Once
	comm     string
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c *Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the caller carried by ctx, or this process's identity when
// there is none (in-process use).
func CallerOf(ctx context.Context) *Caller {
	if c, ok := ctx.Value(callerKey{}).(*Caller); ok {
		return c
	}
	return Self()
}

var self struct {
	once sync.Once
	c    *Caller
}

// Self is the identity of this process.
func Self() *Caller {
	self.once.Do(func() {
		self.c = &Caller{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), Pid: uint32(os.Getpid())}
	})
	return self.c
}

// Groups returns the caller's supplementary groups. FUSE does not send them;
// they are read once from /proc/PID/status, and are empty if the process is
// gone.
func (c *Caller) Groups() []uint32 {
	c.load()
	return c.groups
}

// Comm returns the caller's process name ("" if the process is gone, and
// for pid 0, the kernel). It is read once per Caller, from a descriptor of
// /proc/PID/comm kept open per pid (see procComm).
func (c *Caller) Comm() string {
	c.commOnce.Do(func() { c.comm = procComm(c.Pid) })
	return c.comm
}

func (c *Caller) load() {
	c.once.Do(func() {
		f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.Pid))
		if err != nil {
			return
		}
		defer f.Close()
		s := bufio.NewScanner(f)
		for s.Scan() {
			line := s.Text()
			if v, ok := strings.CutPrefix(line, "Groups:"); ok {
				for _, g := range strings.Fields(v) {
					if n, err := strconv.ParseUint(g, 10, 32); err == nil {
						c.groups = append(c.groups, uint32(n))
					}
				}
				return
			}
		}
	})
}

// InGroup reports whether gid is the caller's group or one of its
// supplementary groups.
func (c *Caller) InGroup(gid uint32) bool {
	if c.Gid == gid {
		return true
	}
	for _, g := range c.Groups() {
		if g == gid {
			return true
		}
	}
	return false
}
