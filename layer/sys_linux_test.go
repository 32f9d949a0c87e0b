package layer

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The layer API's flags are Linux's own (sys.go).
func TestFlagsAreLinux(t *testing.T) {
	for _, c := range []struct {
		name      string
		ours, sys int
	}{
		{"RENAME_NOREPLACE", RenameNoreplace, unix.RENAME_NOREPLACE},
		{"RENAME_EXCHANGE", RenameExchange, unix.RENAME_EXCHANGE},
		{"RENAME_WHITEOUT", RenameWhiteout, unix.RENAME_WHITEOUT},
		{"FALLOC_FL_KEEP_SIZE", FallocKeepSize, unix.FALLOC_FL_KEEP_SIZE},
		{"FALLOC_FL_PUNCH_HOLE", FallocPunchHole, unix.FALLOC_FL_PUNCH_HOLE},
		{"FALLOC_FL_ZERO_RANGE", FallocZeroRange, unix.FALLOC_FL_ZERO_RANGE},
		{"XATTR_CREATE", XattrCreate, unix.XATTR_CREATE},
		{"XATTR_REPLACE", XattrReplace, unix.XATTR_REPLACE},
	} {
		if c.ours != c.sys {
			t.Errorf("%s: layer has %#x, Linux %#x", c.name, c.ours, c.sys)
		}
	}
}
