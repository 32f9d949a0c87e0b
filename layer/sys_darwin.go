package layer

import "golang.org/x/sys/unix"

const (
	ODirect = 0
	ODsync  = unix.O_DSYNC
)
