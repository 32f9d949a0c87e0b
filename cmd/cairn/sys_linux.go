package main

import (
	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// exchange swaps the names a and b in one step (renameat2 RENAME_EXCHANGE).
func exchange(a, b string) error {
	return unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, layer.RenameExchange)
}
