package mounttest

import (
	"testing"

	"golang.org/x/sys/unix"
)

// MapCopyOut and MapCopyIn copy out of and into a mapping of a file of a
// mount that the test process itself serves: a page fault on such a
// mapping must happen inside a system call (the runtime's stop of the
// world for a collection would otherwise wait for the faulting goroutine,
// which waits for the daemon's goroutines). So the mapping is read and
// written through a memfd, by the kernel.
func MapCopyOut(t testing.TB, b []byte) []byte {
	t.Helper()
	fd, err := memfd("map")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if n, err := unix.Pwrite(fd, b, 0); err != nil || n != len(b) {
		t.Fatalf("copying a mapping out: %d, %v", n, err)
	}
	out := make([]byte, len(b))
	unix.Pread(fd, out, 0)
	return out
}

func MapCopyIn(t testing.TB, b []byte, data string) {
	t.Helper()
	fd, err := memfd("map")
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Pwrite(fd, []byte(data), 0)
	if n, err := unix.Pread(fd, b[:len(data)], 0); err != nil || n != len(data) {
		t.Fatalf("copying into a mapping: %d, %v", n, err)
	}
}
