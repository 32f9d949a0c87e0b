package codec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

var codecNames = []string{"copy", "uuencode", "gzip", "zstd", "lz4"}

func levelOf(name string) int {
	for _, k := range kinds {
		if k.Name == name {
			return k.DefaultLevel
		}
	}
	return 0
}

// newStack builds name over a local directory.
func newStack(t testing.TB, name string, o Options) (string, *FS) {
	t.Helper()
	dir := t.TempDir()
	return dir, newStackAt(t, dir, name, o)
}

func newStackAt(t testing.TB, dir, name string, o Options) *FS {
	t.Helper()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if o.Level == 0 {
		o.Level = levelOf(name)
	}
	fs, err := New(l, name, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	return fs
}

// text makes compressible bytes.
func text(r *rand.Rand, n int) []byte {
	words := []string{"stackable ", "file ", "system ", "index ", "chunk ", "the ", "of ", "fast ", "tails\n", "cairn "}
	var b bytes.Buffer
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.Bytes()[:n]
}

func TestInProcessRoundTrip(t *testing.T) {
	ctx := context.Background()
	for _, name := range codecNames {
		for _, ft := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fast_tails=%v", name, ft), func(t *testing.T) {
				lower, fs := newStack(t, name, Options{ChunkSize: 4096, FastTails: ft})
				r := rand.New(rand.NewPCG(1, 2))
				want := text(r, 100000)
				if err := layer.WriteFile(ctx, fs, "f", want, 0o644); err != nil {
					t.Fatal(err)
				}
				got, err := layer.ReadFile(ctx, fs, "f")
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(want))
				}
				a, err := fs.Getattr(ctx, "f")
				if err != nil || a.Size != uint64(len(want)) {
					t.Fatalf("getattr: size %d, %v", a.Size, err)
				}
				ents, err := fs.ReadDir(ctx, "", true)
				if err != nil || len(ents) != 1 || ents[0].Attr == nil || ents[0].Attr.Size != uint64(len(want)) {
					t.Fatalf("readdir: %+v %v", ents, err)
				}
				raw, _ := os.ReadFile(filepath.Join(lower, "f"))
				if bytes.Contains(raw, want[:200]) && name != "copy" {
					t.Fatalf("the lower file holds the data unencoded")
				}
				t.Logf("%d bytes stored in %d", len(want), len(raw))

				// Appends, a write in the middle, truncations.
				f, err := fs.Open(ctx, "f", unix.O_RDWR|unix.O_APPEND)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 50; i++ {
					p := text(r, 1+r.IntN(100))
					if _, err := f.WriteAt(ctx, p, 0); err != nil {
						t.Fatal(err)
					}
					want = append(want, p...)
					if i%10 == 0 {
						f.Flush(ctx)
					}
				}
				mid := []byte("MIDDLE")
				g, _ := fs.Open(ctx, "f", unix.O_RDWR)
				g.WriteAt(ctx, mid, 50000)
				copy(want[50000:], mid)
				if _, err := g.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 70001}); err != nil {
					t.Fatal(err)
				}
				want = want[:70001]
				f.Release(ctx)
				g.Release(ctx)
				if _, err := fs.Setattr(ctx, "f", &layer.SetAttr{Valid: layer.SetSize, Size: 90000}); err != nil {
					t.Fatal(err)
				}
				want = append(want, make([]byte, 90000-70001)...)
				got, err = layer.ReadFile(ctx, fs, "f")
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("after changes: %d bytes (%v), want %d, first diff %d", len(got), err, len(want), firstDiff(got, want))
				}
				// A fresh stack over the same directory reads the same.
				fs2 := newStackAt(t, lower, name, Options{})
				got, err = layer.ReadFile(ctx, fs2, "f")
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("fresh stack: %d bytes (%v), want %d, first diff %d", len(got), err, len(want), firstDiff(got, want))
				}
				if a, _ := fs2.Getattr(ctx, "f"); a.Size != uint64(len(want)) {
					t.Fatalf("fresh stack size %d", a.Size)
				}
			})
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestIncompressibleRaw: random data costs almost nothing more than its size.
func TestIncompressibleRaw(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"gzip", "zstd", "lz4"} {
		lower, fs := newStack(t, name, Options{})
		r := rand.New(rand.NewPCG(3, 4))
		want := make([]byte, 1<<20)
		for i := range want {
			want[i] = byte(r.Uint32())
		}
		if err := layer.WriteFile(ctx, fs, "r", want, 0o644); err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(filepath.Join(lower, "r"))
		if over := st.Size() - int64(len(want)); over > 4096 {
			t.Errorf("%s: random 1 MiB stored with %d bytes of overhead", name, over)
		}
		got, _ := layer.ReadFile(ctx, fs, "r")
		if !bytes.Equal(got, want) {
			t.Errorf("%s: raw chunks read back wrong", name)
		}
	}
}

// TestWriteMiddleCost: a write in the middle appends about one chunk,
// whatever the file's size, and the file reads back with the new byte (in
// this stack and in a fresh one).
func TestWriteMiddleCost(t *testing.T) {
	ctx := context.Background()
	lower, fs := newStack(t, "copy", Options{ChunkSize: 16384})
	big := make([]byte, 8<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := layer.WriteFile(ctx, fs, "f", big, 0o644); err != nil {
		t.Fatal(err)
	}
	st0, err := os.Stat(filepath.Join(lower, "f"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := fs.Open(ctx, "f", unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.WriteAt(ctx, []byte("x"), 4<<20); n != 1 || err != nil {
		t.Fatalf("write in the middle: %d, %v", n, err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st1, err := os.Stat(filepath.Join(lower, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if grew := st1.Size() - st0.Size(); grew <= 0 || grew > 16384+200 {
		t.Fatalf("a 1-byte write in the middle appended %d bytes, want one chunk", grew)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	big[4<<20] = 'x'
	for _, s := range []*FS{fs, newStackAt(t, lower, "copy", Options{})} {
		got, err := layer.ReadFile(ctx, s, "f")
		if err != nil || !bytes.Equal(got, big) {
			t.Fatalf("after a write in the middle: %d bytes (%v), first difference %d", len(got), err, firstDiff(got, big))
		}
	}
}

// TestCompaction: rewriting a file many times keeps its lower size bounded.
func TestCompaction(t *testing.T) {
	ctx := context.Background()
	lower, fs := newStack(t, "gzip", Options{ChunkSize: 4096, CompactMin: 64 << 10})
	r := rand.New(rand.NewPCG(5, 6))
	want := text(r, 256<<10)
	layer.WriteFile(ctx, fs, "f", want, 0o644)
	for i := 0; i < 40; i++ {
		f, err := fs.Open(ctx, "f", unix.O_RDWR)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 20; j++ {
			off := r.IntN(len(want) - 100)
			p := text(r, 1+r.IntN(100))
			f.WriteAt(ctx, p, int64(off))
			copy(want[off:], p)
		}
		f.Release(ctx)
	}
	st, _ := os.Stat(filepath.Join(lower, "f"))
	got, err := layer.ReadFile(ctx, fs, "f")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after compactions: %v, first diff %d", err, firstDiff(got, want))
	}
	fs2 := newStackAt(t, lower, "gzip", Options{})
	got, err = layer.ReadFile(ctx, fs2, "f")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after compactions, fresh stack: %v, first diff %d", err, firstDiff(got, want))
	}
	t.Logf("256 KiB of text, 800 writes: lower file %d bytes", st.Size())
	if st.Size() > 1<<20 {
		t.Fatalf("lower file grew to %d bytes: no compaction", st.Size())
	}
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	_, fs := newStack(t, "gzip", Options{})
	if _, err := fs.Open(ctx, "missing", unix.O_RDONLY); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("open missing: %v", err)
	}
	if _, err := New(fs.Lower, "gzip", Options{ChunkSize: 5000, Level: 6}); err == nil {
		t.Fatal("chunk size 5000 accepted")
	}
	if _, err := New(fs.Lower, "gzip", Options{Level: 12}); err == nil {
		t.Fatal("gzip level 12 accepted")
	}
	f, _, err := fs.Create(ctx, "e", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var b [10]byte
	if n, err := f.ReadAt(ctx, b[:], 0); n != 0 || err != io.EOF {
		t.Fatalf("read of empty: %d %v", n, err)
	}
	f.Release(ctx)
}

// TestClaim: one claim per lower directory at a time; closing the layer
// lets the next one in.
func TestClaim(t *testing.T) {
	ctx := context.Background()
	lower, a := newStack(t, "gzip", Options{})
	b := newStackAt(t, lower, "lz4", Options{})
	if err := Claim(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := Claim(ctx, a); err != nil {
		t.Fatalf("a second claim by the same layer: %v", err)
	}
	var busy *InUseError
	if err := Claim(ctx, b); !errors.As(err, &busy) || busy.Dir != lower {
		t.Fatalf("claim of a claimed directory: %v", err)
	}
	a.Close()
	if err := Claim(ctx, b); err != nil {
		t.Fatalf("claim after the first layer closed: %v", err)
	}
}
