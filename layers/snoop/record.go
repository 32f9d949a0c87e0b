package snoop

import (
	"errors"
	"fmt"
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
