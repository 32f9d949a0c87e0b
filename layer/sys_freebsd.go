package layer

import "golang.org/x/sys/unix"

const (
	ODirect = unix.O_DIRECT
	ODsync  = 0
)
