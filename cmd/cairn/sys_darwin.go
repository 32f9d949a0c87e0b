package main

import "golang.org/x/sys/unix"

// exchange swaps the names a and b in one step (renamex_np RENAME_SWAP).
func exchange(a, b string) error { return unix.RenamexNp(a, b, unix.RENAME_SWAP) }
