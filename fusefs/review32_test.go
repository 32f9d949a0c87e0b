package fusefs_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// TestMixedOpensRandom: up to five descriptors of one file, opened for
// reading (passed through) and for writing (served by the daemon),
// written, read, mapped and closed in random orders: every open succeeds
// and every read and mapping shows the bytes written.
func TestMixedOpensRandom(t *testing.T) {
	mounttest.NeedRoot(t)
	dir := t.TempDir()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, &mixedLayer{Base: layer.Base{Lower: l}})
	p := m.Path("f")
	model := bytes.Repeat([]byte("m"), 4096)
	if err := os.WriteFile(p, model, 0o644); err != nil {
		t.Fatal(err)
	}
	type fd struct {
		f  *os.File
		rw bool
	}
	var fds []fd
	r := rand.New(rand.NewPCG(7, 32))
	for op := range 10000 {
		switch k := r.IntN(10); {
		case k < 3 && len(fds) < 5:
			rw := r.IntN(2) == 0
			flag := os.O_RDONLY
			if rw {
				flag = os.O_RDWR
			}
			f, err := os.OpenFile(p, flag, 0)
			if err != nil {
				t.Fatalf("op %d: open (rw=%v) with %d open: %v", op, rw, len(fds), err)
			}
			fds = append(fds, fd{f, rw})
		case k < 5 && len(fds) > 0:
			i := r.IntN(len(fds))
			fds[i].f.Close()
			fds = append(fds[:i], fds[i+1:]...)
		case k < 7 && len(fds) > 0:
			i := r.IntN(len(fds))
			if !fds[i].rw {
				continue
			}
			off := r.IntN(len(model) - 16)
			b := []byte(fmt.Sprintf("%016d", op))
			if _, err := fds[i].f.WriteAt(b, int64(off)); err != nil {
				t.Fatalf("op %d: write: %v", op, err)
			}
			copy(model[off:], b)
		case k < 9 && len(fds) > 0:
			i := r.IntN(len(fds))
			b := make([]byte, len(model))
			if n, err := fds[i].f.ReadAt(b, 0); n != len(model) || !bytes.Equal(b, model) {
				t.Fatalf("op %d: read (rw=%v) of %d open: %d bytes, %v; differs from what was written", op, fds[i].rw, len(fds), n, err)
			}
		case len(fds) > 0:
			i := r.IntN(len(fds))
			b, err := unix.Mmap(int(fds[i].f.Fd()), 0, len(model), unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				t.Fatalf("op %d: mmap (rw=%v): %v", op, fds[i].rw, err)
			}
			same := bytes.Equal(mounttest.MapCopyOut(t, b), model)
			unix.Munmap(b)
			if !same {
				t.Fatalf("op %d: mapping (rw=%v) of %d open differs from what was written", op, fds[i].rw, len(fds))
			}
		}
	}
	for _, f := range fds {
		f.f.Close()
	}
}
