package layer

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// ENOATTR is the error of a missing extended attribute: ENODATA on Linux,
// ENOATTR on the BSDs.
const ENOATTR = syscall.ENODATA

// Open flags that not every host has: the host's value, or 0 where it has
// none (a flag that is 0 is never set, so a test of it is false).
const (
	ONoatime = unix.O_NOATIME
	ODirect  = unix.O_DIRECT
	ODsync   = unix.O_DSYNC
)
