package union

import "golang.org/x/sys/unix"

// copyFileRange is copy_file_range(2) (copyRanges).
func copyFileRange(rfd int, roff *int64, wfd int, woff *int64, n int, flags int) (int, error) {
	return unix.CopyFileRange(rfd, roff, wfd, woff, n, flags)
}
