package codec

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// The decoders meet bytes from disk: none may panic, whatever the bytes.
// `go test` runs the seeds; `go test -fuzz FuzzX` explores.

func FuzzParseRec(f *testing.F) {
	raw, _ := hex.DecodeString(knownAnswer)
	f.Add(raw[headerSize:])
	f.Add(make([]byte, recHdrSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRec(b, 0, 0)
		if err == nil {
			var out [recHdrSize]byte
			r.marshal(out[:])
			if string(out[:]) != string(b[:recHdrSize]) {
				t.Fatalf("a parsed record does not marshal back")
			}
		}
		parseSlot(b)
		bestSlot(b)
	})
}

// FuzzParseIndex: a checkpoint's payload parses to exactly its entries (none
// dropped, none changed, each within range) or gives an error.
func FuzzParseIndex(f *testing.F) {
	f.Add(marshalIndex(map[int64][]op{0: {{kind: opBase, off: 128, rlen: 100, gen: 1}}, 3: {{kind: opClip, off: 7}}}, []int64{0, 3}), uint8(12))
	f.Add([]byte{1, 0, 0, 0}, uint8(16))
	f.Fuzz(func(t *testing.T, b []byte, shift uint8) {
		if shift < minShift || shift > maxShift {
			return
		}
		chunks, err := parseIndex(b, shift)
		if err != nil {
			return
		}
		// The entries, encoded again, are the input's entries.
		var order []int64
		for c := range chunks {
			order = append(order, c)
		}
		slices.Sort(order)
		again := marshalIndex(chunks, order)
		if len(again) != len(b) || !bytes.Equal(again[:4], b[:4]) {
			t.Fatalf("%d bytes of index parse to %d bytes of entries", len(b), len(again))
		}
		entries := func(x []byte) []string {
			var out []string
			for i := 4; i < len(x); i += indexEntrySize {
				out = append(out, string(x[i:i+indexEntrySize]))
			}
			slices.Sort(out)
			return out
		}
		if !slices.Equal(entries(again), entries(b)) {
			t.Fatal("the parsed index is not the input's entries")
		}
		for c, ops := range chunks {
			for _, o := range ops {
				if c < 0 || uint64(c) > maxChunkNo(shift) || (o.kind != opClip && (o.off < headerSize || o.gen == 0)) || (o.kind == opClip && (o.off < 0 || o.off >= 1<<shift)) {
					t.Fatalf("entry out of range accepted: chunk %d %+v", c, o)
				}
			}
		}
	})
}

func FuzzDecode(f *testing.F) {
	for _, name := range codecNames {
		k := kindByName(name)
		c, _ := k.New(k.DefaultLevel)
		enc, _ := c.Encode(nil, []byte("hello, hello, hello, world"))
		f.Add(k.ID, enc, 26)
	}
	f.Fuzz(func(t *testing.T, id uint8, src []byte, n int) {
		if n < 0 || n > 1<<maxShift {
			return
		}
		c, err := decoder(id)
		if err != nil {
			return
		}
		out, err := safeDecode(c, nil, src, n)
		if err == nil && len(out) != n {
			t.Fatalf("codec %d decoded %d bytes, want %d", id, len(out), n)
		}
	})
}

// FuzzOpen: any lower file content opens and reads without a panic or a
// hang, and what it gives is consistent: a file that reads whole reads as
// long as stat says, twice the same.
func FuzzOpen(f *testing.F) {
	raw, _ := hex.DecodeString(knownAnswer)
	f.Add(raw)
	f.Add(raw[:200])
	f.Add(append(append([]byte{}, raw[:headerSize]...), raw[headerSize+20:]...))
	f.Fuzz(func(t *testing.T, b []byte) {
		lower, fs := newStack(t, "copy", Options{})
		os.WriteFile(filepath.Join(lower, "f"), b, 0o644)
		ctx := context.Background()
		fs.Getattr(ctx, "f")
		fl, err := fs.Open(ctx, "f", unix.O_RDONLY)
		if err != nil {
			return
		}
		a, aerr := fl.Getattr(ctx)
		var first []byte
		buf := make([]byte, 1<<16)
		whole := false
		for off := int64(0); off < 1<<20; off += int64(len(buf)) {
			n, err := fl.ReadAt(ctx, buf, off)
			first = append(first, buf[:n]...)
			if err == io.EOF || (err == nil && n < len(buf)) {
				whole = true
				break
			}
			if err != nil {
				break
			}
		}
		fl.Release(ctx)
		if whole && aerr == nil {
			if uint64(len(first)) != a.Size {
				t.Fatalf("read %d bytes, stat says %d", len(first), a.Size)
			}
			fresh, err := New(fs.Lower, "copy", Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer fresh.Close() // its closed files stay open until then
			again, err := layer.ReadFile(ctx, fresh, "f")
			if err != nil || !bytes.Equal(again, first) {
				t.Fatalf("a second read differs: %d bytes (%v), then %d", len(first), err, len(again))
			}
		}
		fs.Check(ctx, "f", CheckOnly)
	})
}

var damageBase struct {
	once sync.Once
	raw  map[string][]byte
	want map[string][]byte
}

// FuzzDamage: a small file of each codec with one burst of damage (up to 32
// bytes anywhere, xor'ed with the fuzzer's bytes) reads as it was written
// or fails with EIO; never other bytes, a shorter file or zeros.
func FuzzDamage(f *testing.F) {
	damageBase.once.Do(func() {
		damageBase.raw, damageBase.want = map[string][]byte{}, map[string][]byte{}
		for _, name := range codecNames {
			lower, fs := newStack(f, name, Options{ChunkSize: 4096, FastTails: true, Logger: quiet})
			damageBase.want[name] = smallSample(f, fs, "f")
			fs.Close()
			raw, err := os.ReadFile(filepath.Join(lower, "f"))
			if err != nil {
				f.Fatal(err)
			}
			damageBase.raw[name] = raw
		}
	})
	f.Add(uint8(0), uint16(0), []byte{0xff})
	f.Add(uint8(2), uint16(940), []byte{0xff, 0, 0x10, 1})
	f.Add(uint8(3), uint16(130), bytes.Repeat([]byte{0xff}, 32))
	f.Fuzz(func(t *testing.T, which uint8, at uint16, burst []byte) {
		name := codecNames[int(which)%len(codecNames)]
		raw := bytes.Clone(damageBase.raw[name])
		want := damageBase.want[name]
		if len(burst) == 0 || len(burst) > 32 || int(at) >= len(raw) {
			return
		}
		for i, x := range burst {
			if int(at)+i < len(raw) {
				raw[int(at)+i] ^= x
			}
		}
		lower := t.TempDir()
		if err := os.WriteFile(filepath.Join(lower, "f"), raw, 0o644); err != nil {
			t.Fatal(err)
		}
		l, err := local.New(lower)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		fs, err := New(l, name, Options{Level: levelOf(name), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer fs.Close() // its closed files stay open until then
		got, err := layer.ReadFile(context.Background(), fs, "f")
		if err != nil {
			if layer.Errno(err) != unix.EIO {
				t.Fatalf("%s, damage at %d: %v, want EIO", name, at, err)
			}
			return
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s, %d bytes of damage at %d: read %d bytes and no error, want %d (first difference %d)", name, len(burst), at, len(got), len(want), firstDiff(got, want))
		}
	})
}

func kindByName(name string) *Kind {
	for _, k := range kinds {
		if k.Name == name {
			return k
		}
	}
	return nil
}
