package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	Point, Type, Source string
}

// cairnType is the type a cairn mount shows (go-fuse's fuse.NAME).
const cairnType = "fuse.cairn"

// mountAt returns the mount whose mount point is mp (the last one, if
// several are stacked there).
func mountAt(mp string) (mountEntry, bool) {
	abs := absPath(mp)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return mountEntry{}, false
	}
	var found mountEntry
	ok := false
	for _, line := range strings.Split(string(b), "\n") {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
		pre, post, cut := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !cut || len(f) < 5 || len(g) < 2 {
			continue
		}
		if unescapeMount(f[4]) == abs {
			found, ok = mountEntry{Point: abs, Type: g[0], Source: unescapeMount(g[1])}, true
		}
	}
	return found, ok
}

// absPath is mp made absolute, the symbolic links of its directory
// resolved. The last element is not looked at: it may be a mount whose
// server does not answer.
func absPath(mp string) string {
	abs, err := filepath.Abs(mp)
	if err != nil {
		return mp
	}
	dir, base := filepath.Split(abs)
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return filepath.Join(r, base)
	}
	return abs
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// isDead reports a mount whose server is gone: the kernel answers
// ENOTCONN ("Transport endpoint is not connected") to statfs (stat may be
// answered from the kernel's cache). A server that does not answer within
// a second (stopped, or hung) is taken as alive: the probe gives up on it.
func isDead(mp string) bool {
	dead := make(chan bool, 1)
	go func() {
		var st syscall.Statfs_t
		dead <- errors.Is(syscall.Statfs(mp, &st), syscall.ENOTCONN)
	}()
	select {
	case d := <-dead:
		return d
	case <-time.After(time.Second):
		return false
	}
}

// checkMountpointFree refuses a mountpoint where a mount would hide
// something: a dead mount (its process died), a mount already there (a
// second mount would stack silently over it), or, unless nonempty, a
// directory with files in it (hidden while mounted). Each error says what
// to do.
func checkMountpointFree(mp string, nonempty bool) error {
	if m, ok := mountAt(mp); ok {
		if isDead(mp) {
			return fmt.Errorf("mountpoint %s is a dead %s mount (the process that served it is gone); run 'cairn umount %s' first", mp, strings.TrimPrefix(m.Type, "fuse."), mp)
		}
		if m.Type == cairnType {
			return fmt.Errorf("mountpoint %s is already a cairn mount (%s); unmount it first: cairn umount %s", mp, m.Source, mp)
		}
		return fmt.Errorf("mountpoint %s is already a mount point (%s, %s); a mount over it would hide it: choose another directory, or unmount it first", mp, m.Type, m.Source)
	}
	if nonempty {
		return nil
	}
	f, err := os.Open(mp)
	if err != nil {
		return nil // reported where the mount is made
	}
	defer f.Close()
	if names, _ := f.Readdirnames(1); len(names) > 0 {
		return fmt.Errorf("mountpoint %s is not empty (it holds %s); its files would be hidden while mounted: choose an empty directory, or pass -nonempty", mp, names[0])
	}
	return nil
}

// checkUnmountable refuses what 'cairn umount' must not unmount: nothing
// mounted there, or a mount that is not cairn's. It reads only
// /proc/self/mountinfo: nothing under the mount is looked at, so that a
// server that does not answer cannot hang umount (a dead mount, whose
// server was killed, unmounts as any other).
func checkUnmountable(mp string) error {
	m, ok := mountAt(mp)
	switch {
	case !ok:
		return fmt.Errorf("umount %s: nothing is mounted there", mp)
	case m.Type != cairnType:
		return fmt.Errorf("umount %s: it is a %s mount (%s), not cairn's; cairn umount unmounts only cairn mounts (use umount(8) for others)", mp, m.Type, m.Source)
	}
	return nil
}
