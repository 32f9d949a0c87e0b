package codec

import (
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
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

func FuzzParseIndex(f *testing.F) {
	f.Add(marshalIndex(map[int64][]op{0: {{kind: opBase, off: 128, rlen: 100, gen: 1}}, 3: {{kind: opClip, off: 7}}}, []int64{0, 3}), uint8(12))
	f.Add([]byte{1, 0, 0, 0}, uint8(16))
	f.Fuzz(func(t *testing.T, b []byte, shift uint8) {
		if shift < minShift || shift > maxShift {
			return
		}
		parseIndex(b, shift)
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

// FuzzOpen: any lower file content opens and reads without a panic, and
// gives either its bytes or an error.
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
		buf := make([]byte, 1<<16)
		for off := int64(0); off < 1<<20; off += int64(len(buf)) {
			if n, err := fl.ReadAt(ctx, buf, off); err != nil || n < len(buf) {
				break
			}
		}
		fl.Release(ctx)
		fs.Check(ctx, "f", CheckOnly)
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
