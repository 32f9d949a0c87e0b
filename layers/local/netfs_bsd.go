//go:build darwin || freebsd

package local

import (
	"strings"

	"golang.org/x/sys/unix"
)

// networked reports whether the directory fd is on a file system that
// other machines or processes share as a rule (network file systems and
// FUSE): its contents change behind the layer's back. By the file system's
// type name.
func networked(fd int) bool {
	var s unix.Statfs_t
	if unix.Fstatfs(fd, &s) != nil {
		return true // unknown: the safe answer
	}
	var b strings.Builder
	for _, c := range s.Fstypename {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	switch name := b.String(); {
	case name == "nfs", name == "smbfs", name == "afpfs", name == "webdav", name == "cifs",
		strings.HasPrefix(name, "fuse"), strings.Contains(name, "fuse"), name == "p9fs", name == "ceph":
		return true
	}
	return false
}
