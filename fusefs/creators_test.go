package fusefs_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

// An open(O_CREAT) that reaches the daemon as a CREATE although its name is
// a FIFO made in the lower directory meanwhile (the kernel still had the
// name as negative) must not hold one of the local layer's creator threads
// while the FIFO waits for a peer: with all of them held, every other
// caller's create and mkdir on the mount would wait too. The FUSE kernel
// refuses a CREATE answered with anything but a regular file (EIO), so the
// caller gets an error at once.
func TestCreateOverLowerFifoKeepsCreatorsFree(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	m := mounttest.Mount(t, null.New(l))
	const n = 20 // more than the local layer's creator threads
	var readers []int
	t.Cleanup(func() {
		for _, fd := range readers {
			unix.Close(fd)
		}
	})
	type result struct {
		i   int
		err error
	}
	done := make(chan result, n)
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("fifo%d", i)
		// The kernel caches the name as negative for a second.
		if _, err := os.Lstat(m.Path(name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("lstat %s: %v", name, err)
		}
		if err := unix.Mkfifo(filepath.Join(lower, name), 0o666); err != nil {
			t.Fatal(err)
		}
		go func() {
			fd, err := unix.Open(m.Path(name), unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o666)
			if err == nil {
				unix.Close(fd)
			}
			done <- result{i, err}
		}()
	}
	mkdir := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		mkdir <- os.Mkdir(m.Path("after"), 0o755)
	}()
	select {
	case err := <-mkdir:
		if err != nil {
			t.Errorf("mkdir: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("mkdir waits while opens of lower FIFOs are pending")
	}
	// Let any open still waiting go (a reader on each FIFO).
	for i := 0; i < n; i++ {
		fd, err := unix.Open(filepath.Join(lower, fmt.Sprintf("fifo%d", i)), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, fd)
	}
	// An open still waiting now did not reach the daemon as a CREATE: the
	// kernel had lost the negative entry (drop_caches by a test of another
	// package running beside this one), looked the name up, and waits in
	// its own FIFO of the mount's node for a peer. A reader there lets it
	// go; its success is then no CREATE's.
	pending := map[int]bool{}
	for i := 0; i < n; i++ {
		pending[i] = true
	}
	looked := map[int]bool{}
	for len(pending) > 0 {
		select {
		case r := <-done:
			delete(pending, r.i)
			if r.err == nil && !looked[r.i] {
				t.Errorf("open(O_CREAT) of a FIFO through a CREATE succeeded")
			}
		case <-time.After(5 * time.Second):
			if len(looked) > 0 {
				t.Fatalf("opens still pending: %v", pending)
			}
			for i := range pending {
				fd, err := unix.Open(m.Path(fmt.Sprintf("fifo%d", i)), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
				if err != nil {
					t.Fatalf("open %d still pending, and the mount has no FIFO of its name: %v", i, err)
				}
				readers = append(readers, fd)
				looked[i] = true
			}
			t.Logf("opens %v were looked up, not created: the kernel lost their negative entries", looked)
		}
	}
	if _, err := os.Stat(filepath.Join(lower, "after")); err != nil {
		t.Errorf("lower: %v", err)
	}
}
