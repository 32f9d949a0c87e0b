package fusefs_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// openCount counts the files of the stack below it that are open: opened
// or created, not yet released.
type openCount struct {
	layer.Base
	open atomic.Int64
}

type countedFile struct {
	layer.BaseFile
	c *openCount
}

func (f *countedFile) Release(ctx context.Context) error {
	f.c.open.Add(-1)
	return f.BaseFile.Release(ctx)
}

func (c *openCount) Open(ctx context.Context, p string, flags int) (layer.File, error) {
	f, err := c.Base.Open(ctx, p, flags)
	if err != nil {
		return nil, err
	}
	c.open.Add(1)
	return &countedFile{layer.BaseFile{Lower: f}, c}, nil
}

func (c *openCount) Create(ctx context.Context, p string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	f, a, err := c.Base.Create(ctx, p, flags, mode)
	if err != nil {
		return nil, a, err
	}
	c.open.Add(1)
	return &countedFile{layer.BaseFile{Lower: f}, c}, a, nil
}

// TestReleasedByUnmount: files closed just before the unmount are released
// in the stack once the server's Wait returns. The kernel sends RELEASE
// after close(2) returns and drops the requests the daemon has not read
// yet when it unmounts: such files stayed open in the stack for good, and
// their release's work (a codec's header and fold) was lost
// (TestFoldAtRest's files stayed as fast tails now and then).
func TestReleasedByUnmount(t *testing.T) {
	mounttest.Need(t)
	for round := range 50 {
		l, err := local.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		c := &openCount{Base: layer.Base{Lower: l}}
		m := mounttest.Mount(t, c)
		for i := range 10 {
			fd, err := unix.Open(m.Path(fmt.Sprint(i)), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			unix.Close(fd)
			f, err := os.Open(m.Path(fmt.Sprint(i)))
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		m.Unmount()
		if n := c.open.Load(); n != 0 {
			t.Fatalf("round %d: %d files closed before the unmount still open in the stack after it", round, n)
		}
	}
}

// TestOpenFiles: Server.OpenFiles counts the files the kernel has open
// through the mount, until the stack has released them (after close(2)
// returns), which mounttest's WaitReleased waits for.
func TestOpenFiles(t *testing.T) {
	mounttest.Need(t)
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := &openCount{Base: layer.Base{Lower: l}}
	m := mounttest.Mount(t, c)
	var fds []int
	for i := range 10 {
		fd, err := unix.Open(m.Path(fmt.Sprint(i)), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	if n := m.Server.OpenFiles(); n != 10 {
		t.Errorf("%d files open, the mount counts %d", 10, n)
	}
	for round := range 20 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		m.WaitReleased(t)
		if n := c.open.Load(); n != 0 {
			t.Fatalf("round %d: no file open for the mount, %d open in the stack", round, n)
		}
		fds = fds[:0]
		for i := range 10 {
			fd, err := unix.Open(m.Path(fmt.Sprint(i)), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			fds = append(fds, fd)
		}
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
}
