package pack

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzRef: any bytes as the xattr decode to a ref that encodes back to
// the same bytes, or to errBadRef; never a panic, never a ref that points
// into a pack's header or says more than maxPacked bytes.
func FuzzRef(f *testing.F) {
	f.Add(ref{pack: 0, off: 24, n: 100, crc: 7}.encode())
	f.Add(ref{pack: 1 << 40, off: 1 << 40, n: maxPacked, crc: 0xffffffff}.encode())
	f.Add([]byte{refVersion})
	f.Add([]byte{2, 0, 24, 1, 0, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRef(b)
		if err != nil {
			if err != errBadRef {
				t.Fatalf("error %v", err)
			}
			return
		}
		if r.n <= 0 || r.n > maxPacked || r.off < int64(len(packMagic)+recordHdr) {
			t.Fatalf("accepted %+v", r)
		}
		if e := r.encode(); !bytes.Equal(e, b) {
			// Uvarints have one canonical form only when minimal: a
			// padded one decodes too, and must mean the same.
			r2, err := decodeRef(e)
			if err != nil || r2 != r {
				t.Fatalf("%x -> %+v -> %x -> %+v, %v", b, r, e, r2, err)
			}
		}
		if len(r.encode()) > maxRefLen {
			t.Fatalf("ref of %d bytes", len(r.encode()))
		}
	})
}

// FuzzRecord: a record's header says its bytes' length and CRC.
func FuzzRecord(f *testing.F) {
	f.Add([]byte("hello"), uint64(12))
	f.Fuzz(func(t *testing.T, data []byte, ino uint64) {
		rec := record(data, ino)
		if len(rec) != recordHdr+len(data) || !bytes.Equal(rec[recordHdr:], data) ||
			binary.LittleEndian.Uint32(rec[0:]) != uint32(len(data)) || binary.LittleEndian.Uint32(rec[4:]) != crcOf(data) ||
			binary.LittleEndian.Uint64(rec[8:]) != ino {
			t.Fatalf("record of %d bytes: %x", len(data), rec[:recordHdr])
		}
	})
}

// FuzzPackName: names that parse as packs are the names of their numbers.
func FuzzPackName(f *testing.F) {
	for _, s := range []string{".cairn-pack.0", ".cairn-pack.12", ".cairn-pack.012", ".cairn-pack.lock", ".cairn-pack.", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, ok := packNumber(s); ok && packName(n) != s {
			t.Fatalf("%q parses as %d, whose name is %q", s, n, packName(n))
		}
		if _, ok := packNumber(s); ok && !reservedName(s) {
			t.Fatalf("pack %q is not reserved", s)
		}
	})
}
