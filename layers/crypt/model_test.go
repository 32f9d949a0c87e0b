package crypt

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// TestModelInProcess drives the layer's files directly (no FUSE): random
// writes, reads, truncates, zero ranges and appends through two handles of
// one file, with large requests that take the parallel paths, compared with
// a model; each block size and cipher.
func TestModelInProcess(t *testing.T) {
	for _, p := range []InitParams{{}, {Cipher: XChaCha20Poly1305, BlockSize: 512}, {BlockSize: 65536}} {
		dir, _ := newVolume(t, p)
		fs := open(t, dir)
		ctx := context.Background()
		r := rand.New(rand.NewPCG(uint64(p.BlockSize), 7))
		f1, _, err := fs.Create(ctx, "m", unix.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f2, err := fs.Open(ctx, "m", unix.O_RDWR|unix.O_APPEND)
		if err != nil {
			t.Fatal(err)
		}
		var model []byte
		grow := func(n int) {
			if n > len(model) {
				model = append(model, make([]byte, n-len(model))...)
			}
		}
		const max = 3 << 20
		for i := 0; i < 1500; i++ {
			switch op := r.IntN(10); {
			case op < 3:
				off, n := r.IntN(max), 1+r.IntN(1<<r.IntN(21))
				b := make([]byte, n)
				for j := range b {
					b[j] = byte(r.Uint32())
				}
				if _, err := f1.WriteAt(ctx, b, int64(off)); err != nil {
					t.Fatal(err)
				}
				grow(off + n)
				copy(model[off:], b)
			case op < 6:
				off, n := r.IntN(max+1000), 1+r.IntN(1<<r.IntN(22))
				b := make([]byte, n)
				got, err := f2.ReadAt(ctx, b, int64(off))
				if err != nil && err != io.EOF {
					t.Fatalf("op %d: read %d at %d: %v", i, n, off, err)
				}
				want := []byte{}
				if off < len(model) {
					want = model[off:min(off+n, len(model))]
				}
				if !bytes.Equal(b[:got], want) {
					t.Fatalf("op %d: read %d at %d: got %d bytes, want %d", i, n, off, got, len(want))
				}
			case op < 7:
				n := r.IntN(max)
				if r.IntN(4) == 0 {
					n = 0
				}
				if _, err := f2.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(n)}); err != nil {
					t.Fatal(err)
				}
				if n < len(model) {
					model = model[:n]
				}
				grow(n)
			case op < 8:
				off, n := r.IntN(max), 1+r.IntN(100000)
				if err := f1.Allocate(ctx, int64(off), int64(n), layer.FallocPunchHole|layer.FallocKeepSize); err != nil {
					t.Fatal(err)
				}
				if off < len(model) {
					clear(model[off:min(off+n, len(model))])
				}
			default:
				b := bytes.Repeat([]byte{byte(i)}, 1+r.IntN(10000))
				if _, err := f2.WriteAt(ctx, b, 0); err != nil { // O_APPEND
					t.Fatal(err)
				}
				model = append(model, b...)
			}
			if a, err := f1.Getattr(ctx); err != nil || a.Size != uint64(len(model)) {
				t.Fatalf("op %d: size %d, want %d (%v)", i, a.Size, len(model), err)
			}
		}
		f1.Release(ctx)
		f2.Release(ctx)
		got, err := layer.ReadFile(ctx, open(t, dir), "m")
		if err != nil || !bytes.Equal(got, model) {
			t.Fatalf("reopened: %d bytes, %v", len(got), err)
		}
	}
}
