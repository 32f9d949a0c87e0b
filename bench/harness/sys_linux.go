package main

import "syscall"

// mntDetach unmounts lazily (sys_other.go: forcibly, where there is no lazy
// unmount).
const mntDetach = syscall.MNT_DETACH
