package acl

import (
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// procExe returns the identity of the file the kernel executed for process
// pid: a stat of /proc/PID/exe, which follows execve. The directory
// /proc/PID is kept open per pid: it stands for that process, not for the
// number, so once the process is gone it answers nothing (and the number,
// if reused, is opened anew), and a stat through it costs no lookup of the
// pid. pid 0 (the kernel) and a process the daemon may not inspect have no
// program.
func procExe(pid uint32) (fileID, bool) {
	if pid == 0 {
		return fileID{}, false
	}
	// Locked throughout: a descriptor closed by another request could
	// otherwise be reused for another directory between lookup and stat.
	exes.Lock()
	defer exes.Unlock()
	if fd, ok := exes.m[pid]; ok {
		if id, ok := statExe(fd); ok {
			return id, true
		}
		unix.Close(fd)
		delete(exes.m, pid)
	}
	fd, err := unix.Open("/proc/"+strconv.FormatUint(uint64(pid), 10), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fileID{}, false
	}
	if len(exes.m) >= 1024 {
		for p, f := range exes.m {
			unix.Close(f)
			delete(exes.m, p)
		}
	}
	exes.m[pid] = fd
	return statExe(fd)
}

func statExe(dirfd int) (fileID, bool) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, "exe", &st, 0); err != nil {
		return fileID{}, false
	}
	return fileID{st.Dev, st.Ino}, true
}

var exes = struct {
	sync.Mutex
	m map[uint32]int
}{m: map[uint32]int{}}
