//go:build !linux && !darwin && !freebsd

package local

// networked: where the file system's type cannot be told, the directory
// is taken as shared (the safe answer: the kernel keeps its attributes for
// the mount's timeouts only).
func networked(fd int) bool { return true }
