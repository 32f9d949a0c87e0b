package layer

// The flags of the layer API's calls have Linux's values on every
// platform: they are the values of FUSE's protocol, and the values layers
// store and compare. The frontend and local translate them where the host
// uses others (sys_linux_test.go checks that they are Linux's).

// Rename's flags (renameat2(2)).
const (
	RenameNoreplace = 1 << 0 // fail with EEXIST if newpath exists
	RenameExchange  = 1 << 1 // swap oldpath and newpath
	RenameWhiteout  = 1 << 2 // leave a whiteout at oldpath (union)
)

// Allocate's modes (fallocate(2)).
const (
	FallocKeepSize  = 0x01
	FallocPunchHole = 0x02
	FallocZeroRange = 0x10
)

// Setxattr's flags (setxattr(2)).
const (
	XattrCreate  = 0x1
	XattrReplace = 0x2
)
