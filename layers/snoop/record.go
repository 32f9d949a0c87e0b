package snoop

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Record is one line of the log.
type Record struct {
	Time time.Time `json:"time"`
	Op   string    `json:"op"` // a layer.OpNames entry, or "dropped"
	// Path is the path at snoop's depth in the stack ("" is the root);
	// Path2 the second name (rename, link: the new path; symlink: the
	// target; xattrs: the attribute's name).
	Path  string `json:"path"`
	Path2 string `json:"path2,omitempty"`
	Uid   uint32 `json:"uid"`
	Gid   uint32 `json:"gid"`
	Pid   uint32 `json:"pid"`
	Comm  string `json:"comm"` // the process name; "" when it is gone (or pid 0: the kernel)
	// Result is "ok" or the errno name the application got ("ENOENT").
	Result string `json:"result"`
	// Error is the layer's message when it was not an errno (the
	// application got EIO).
	Error   string        `json:"error,omitempty"`
	Bytes   int64         `json:"bytes"`
	Latency time.Duration `json:"latency_ns"`
	// Count is, in a "dropped" record, how many records were dropped.
	Count int64 `json:"count,omitempty"`
}

func result(err error) (string, string) {
	if err == nil {
		return "ok", ""
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n, ""
		}
		return fmt.Sprintf("errno %d", int(e)), ""
	}
	return "EIO", err.Error()
}

// comm returns a process's name. It keeps /proc/PID/comm open per pid and
// reads it again each time (a process changes its name when it execs); a
// read fails once the process is gone, and the pid is then looked up anew.
func comm(pid uint32) string {
	if pid == 0 {
		return ""
	}
	var buf [64]byte
	procs.Lock()
	f := procs.m[pid]
	procs.Unlock()
	if f != nil {
		if n, _ := f.ReadAt(buf[:], 0); n > 0 {
			return strings.TrimSuffix(string(buf[:n]), "\n")
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	n, _ := f.ReadAt(buf[:], 0)
	procs.Lock()
	if old := procs.m[pid]; old != nil {
		old.Close()
	}
	if len(procs.m) >= 1024 {
		for p, g := range procs.m {
			g.Close()
			delete(procs.m, p)
		}
	}
	procs.m[pid] = f
	procs.Unlock()
	return strings.TrimSuffix(string(buf[:n]), "\n")
}

var procs = struct {
	sync.Mutex
	m map[uint32]*os.File
}{m: map[uint32]*os.File{}}
