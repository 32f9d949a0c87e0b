//go:build !linux

package main

import "golang.org/x/sys/unix"

const mntDetach = unix.MNT_FORCE
