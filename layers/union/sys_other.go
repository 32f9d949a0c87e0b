//go:build !linux

package union

import "syscall"

// copyFileRange: the kernel cannot (x/sys has no copy_file_range off
// Linux), so copyRanges copies by reads and writes.
func copyFileRange(rfd int, roff *int64, wfd int, woff *int64, n int, flags int) (int, error) {
	return 0, syscall.ENOSYS
}
