package layer

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

// procComm returns a process's name. It keeps /proc/PID/comm open per pid and
// reads it again each time (a process changes its name when it execs); a
// read fails once the process is gone, and the pid is then looked up anew.
func procComm(pid uint32) string {
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
