//go:build !linux

package layer

import "syscall"

// ENOATTR is the error of a missing extended attribute: ENODATA on Linux,
// ENOATTR on the BSDs.
const ENOATTR = syscall.ENOATTR

// Open flags that not every host has: the host's value, or 0 where it has
// none (a flag that is 0 is never set, so a test of it is false). macOS has
// O_DSYNC but no O_DIRECT (F_NOCACHE instead); FreeBSD has O_DIRECT, and its
// O_DSYNC (13+) is not in x/sys: O_SYNC covers it there (see ODsync's uses).
const ONoatime = 0
