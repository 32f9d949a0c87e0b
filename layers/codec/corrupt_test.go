package codec

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// smallSample writes a small file with every kind of record: chunk records
// (one of them dead after a rewrite), fast-tail deltas, a size record that
// cuts, a hole, and, at the last fsync, a checkpoint. It returns the
// file's content.
func smallSample(t testing.TB, fs *FS, name string) []byte {
	t.Helper()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(11, 12))
	f, _, err := fs.Create(ctx, name, unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	write := func(p []byte, off int) {
		t.Helper()
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatal(err)
		}
		if end := off + len(p); end > len(want) {
			want = append(want, make([]byte, end-len(want))...)
		}
		copy(want[off:], p)
		if err := f.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	write(text(r, 5000), 0) // chunk 0 encoded, chunk 1 a fast tail
	if err := f.Fsync(ctx, false); err != nil {
		t.Fatal(err)
	}
	write(text(r, 100), 500) // chunk 0 again: the first record is dead
	for i := 0; i < 4; i++ {
		write(text(r, 20), len(want)) // deltas
	}
	if _, err := f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 4500}); err != nil {
		t.Fatal(err)
	}
	want = want[:4500]
	write(text(r, 30), 9000) // a hole, and chunk 2
	if err := f.Fsync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return want
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestEveryByteDamaged flips every byte of a small file in turn (all its
// bits): the file must read as it was written or fail with EIO (never
// other bytes, a shorter file or zeros), and when it fails, fsck must
// report it. The short form flips every byte of the header slots and
// record headers, and of each payload (all alike: under one checksum) its
// first and last 8 bytes and every 16th; CAIRN_LONG=1 flips every byte,
// then one bit of every byte, then a random value at every byte.
func TestEveryByteDamaged(t *testing.T) {
	ctx := context.Background()
	long := os.Getenv("CAIRN_LONG") == "1"
	masks := []byte{0xff}
	if long {
		masks = append(masks, 0x01, 0) // 0: a random value
	}
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			lower, fs := newStack(t, name, Options{ChunkSize: 4096, FastTails: true, Logger: quiet})
			want := smallSample(t, fs, "f")
			fs.Close()
			low := fs.Lower
			path := filepath.Join(lower, "f")
			orig, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			sl, _ := bestSlot(orig)
			try := make([]bool, len(orig))
			for at := range try {
				try[at] = long || at < headerSize
			}
			for p := int64(headerSize); p+recHdrSize <= int64(len(orig)); {
				rc, err := parseRec(orig[p:], sl.salt, sl.shift)
				if err != nil {
					t.Fatalf("record at %d: %v", p, err)
				}
				end := p + recHdrSize + int64(rc.encLen)
				for i := p; i < end; i++ {
					try[i] = try[i] || i < p+recHdrSize+8 || i >= end-8 || (i-p)%16 == 0
				}
				p = end
			}
			lf, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer lf.Close()
			r := rand.New(rand.NewPCG(13, 14))
			eio, same, tried := 0, 0, 0
			for _, mask := range masks {
				for at := range orig {
					if !try[at] {
						continue
					}
					tried++
					m := mask
					for m == 0 {
						m = byte(r.Uint32())
					}
					// In place: a rewrite after a truncation makes ext4 write
					// the file out at each close.
					if _, err := lf.WriteAt([]byte{orig[at] ^ m}, int64(at)); err != nil {
						t.Fatal(err)
					}
					fresh, err := New(low, name, Options{Level: levelOf(name), Logger: quiet})
					if err != nil {
						t.Fatal(err)
					}
					where := fmt.Sprintf("byte %d of %d ^%#02x", at, len(orig), m)
					a, aerr := fresh.Getattr(ctx, "f")
					got, err := layer.ReadFile(ctx, fresh, "f")
					switch {
					case err != nil:
						if layer.Errno(err) != syscall.EIO {
							t.Fatalf("%s: read failed with %v, want EIO", where, err)
						}
						eio++
						rep, cerr := fresh.Check(ctx, "f", CheckOnly)
						if cerr == nil && rep.OK() {
							t.Fatalf("%s: reads give EIO, fsck finds nothing: %s", where, rep.String())
						}
					case !bytes.Equal(got, want):
						t.Fatalf("%s: read %d bytes and no error, want %d; first difference at %d", where, len(got), len(want), firstDiff(got, want))
					case aerr != nil || a.Size != uint64(len(want)):
						t.Fatalf("%s: stat says %d bytes (%v), the file reads %d", where, a.Size, aerr, len(want))
					default:
						same++
					}
					fresh.Close()
					if _, err := lf.WriteAt(orig[at:at+1], int64(at)); err != nil {
						t.Fatal(err)
					}
				}
			}
			t.Logf("%d bytes (checkpoint at %d), %d damaged versions: %d read as EIO, %d read right", len(orig), sl.ckptOff, tried, eio, same)
		})
	}
}
