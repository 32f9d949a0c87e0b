package fusefs_test

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// mixedLayer passes through files opened read-only and serves the others
// itself (as replica does with a file it writes to every replica); the
// release of one it serves is slow.
type mixedLayer struct{ layer.Base }

func (d *mixedLayer) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	f, err := d.Lower.Open(ctx, path, flags)
	if err != nil || flags&unix.O_ACCMODE == unix.O_RDONLY {
		return f, err
	}
	return &slowFile{BaseFile: layer.BaseFile{Lower: f}}, nil
}

type slowFile struct{ layer.BaseFile }

func (f *slowFile) PassthroughFd() (int, bool) { return -1, false }
func (f *slowFile) Caps() layer.Caps           { return 0 }
func (f *slowFile) Release(ctx context.Context) error {
	time.Sleep(100 * time.Millisecond)
	return f.Lower.Release(ctx)
}

// TestMixedPassthrough: a file written through the daemon and read, as
// soon as it is closed, through passthrough, by two readers one after the
// other. The kernel releases the writer's handle late (RELEASE is
// asynchronous); go-fuse's release of it dropped the backing file that
// the first reader's open had just registered, so the second reader's open
// registered another one, which the kernel refuses for an inode that has
// one: open(2) failed with EIO (TestReplicaFailover, 1 run in 50). The
// mount now keeps the backing files itself (passthrough.go).
func TestMixedPassthrough(t *testing.T) {
	mounttest.NeedRoot(t)
	dir := t.TempDir()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, &mixedLayer{Base: layer.Base{Lower: l}})
	want := bytes.Repeat([]byte("mixed "), 1000)
	for i := range 3 {
		p := m.Path("f")
		if err := os.WriteFile(p, want, 0o644); err != nil {
			t.Fatal(err)
		}
		r1, err := os.Open(p)
		if err != nil {
			t.Fatalf("round %d: first reader: %v", i, err)
		}
		// The writer's release is done: the first reader's file is the
		// only one open.
		m.WaitOpenFiles(t, 1)
		b, err := os.ReadFile(p)
		r1.Close()
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("round %d: second reader: %d bytes, %v", i, len(b), err)
		}
	}
}
