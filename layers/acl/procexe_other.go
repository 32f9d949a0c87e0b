//go:build !linux

package acl

// procExe returns the identity of the file the kernel executed for process
// pid. Off Linux there is no /proc/PID/exe to stat (FreeBSD's procfs is
// optional, macOS has none): no process has a known program, so a rule
// naming a program matches no one (docs/portability.md).
func procExe(pid uint32) (fileID, bool) { return fileID{}, false }
