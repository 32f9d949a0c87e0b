package crypt

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"cairnfs.dev/cairn/layer"
)

// Fuzz tests of the decoders: whatever the lower holds, they return an
// error or the authentic plaintext, and never panic.

func fuzzContent(t testing.TB) *content {
	c, err := newContent(AES256GCM, bytes.Repeat([]byte{3}, 32), 4096, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func FuzzHeader(f *testing.F) {
	f.Add(header(make([]byte, fileIDSize), formatVersion))
	f.Add(header(bytes.Repeat([]byte{1}, fileIDSize), sparseVersion))
	f.Add([]byte("cairnc\x00\x02"))
	f.Add([]byte("cairnc\x00\x03" + string(make([]byte, fileIDSize))))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, h []byte) {
		id, v, err := parseHeader(h)
		if err != nil {
			return
		}
		if v != formatVersion && v != sparseVersion {
			t.Fatalf("header %x: version %d accepted", h, v)
		}
		if !bytes.Equal(header(id, v), h[:headerSize]) {
			t.Fatalf("header %x parses to id %x", h, id)
		}
	})
}

func FuzzBlock(f *testing.F) {
	c := fuzzContent(f)
	id := bytes.Repeat([]byte{9}, fileIDSize)
	a := c.fileAEAD(id)
	nonce := make([]byte, c.ns)
	good := c.seal(a, nil, nonce, []byte("some plaintext"), id, 3, markLast)
	f.Add(good, uint64(3), byte(markLast))
	f.Add(good, uint64(3), byte(markLastSparse))
	f.Add(good[:10], uint64(3), byte(markLast))
	f.Add(make([]byte, c.cbs), uint64(0), byte(markInner))
	f.Fuzz(func(t *testing.T, sealed []byte, n uint64, mark byte) {
		p, err := c.open(a, nil, sealed, id, n, mark)
		if err == nil {
			// Only the block that was sealed opens, at its place.
			if !bytes.Equal(sealed, good) || n != 3 || mark != markLast || string(p) != "some plaintext" {
				t.Fatalf("forged block opened: %x at %d (mark %d) -> %q", sealed, n, mark, p)
			}
		}
		if c.isHole(sealed) && (len(sealed) != c.cbs || bytes.ContainsFunc(sealed, func(r rune) bool { return r != 0 })) {
			t.Fatalf("%x taken for a hole", sealed)
		}
	})
}

func FuzzName(f *testing.F) {
	n, err := newNames(bytes.Repeat([]byte{5}, 64))
	if err != nil {
		f.Fatal(err)
	}
	iv := bytes.Repeat([]byte{1}, dirIVSize)
	good := n.encrypt(iv, "file.txt")
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add("")
	f.Add("cairn.long.xyz")
	f.Fuzz(func(t *testing.T, enc string) {
		name, err := n.decrypt(iv, enc)
		if err != nil {
			return
		}
		if n.encrypt(iv, name) != enc {
			t.Fatalf("%q decrypts to %q, which encrypts differently", enc, name)
		}
	})
}

func FuzzSizes(f *testing.F) {
	c := fuzzContent(f)
	f.Add(uint64(0))
	f.Add(uint64(headerSize + c.cbs))
	f.Fuzz(func(t *testing.T, lower uint64) {
		lower %= 1 << 50
		p, ok := c.plainSize(lower)
		if ok && c.lowerSize(p) != lower {
			t.Fatalf("lower %d -> plain %d -> lower %d", lower, p, c.lowerSize(p))
		}
		if q, ok := c.plainSize(c.lowerSize(lower)); !ok || q != lower {
			t.Fatalf("plain %d -> lower %d -> plain %d (%v)", lower, c.lowerSize(lower), q, ok)
		}
	})
}

func FuzzIVFile(f *testing.F) {
	key := bytes.Repeat([]byte{8}, 32)
	f.Add(ivFile(key, make([]byte, dirIVSize)))
	f.Fuzz(func(t *testing.T, b []byte) {
		iv, ok := checkIV(key, b)
		if ok && !bytes.Equal(ivFile(key, iv), b) {
			t.Fatal("forged IV file accepted")
		}
	})
}

// FuzzConfig: a configuration either is refused or has every parameter
// within its bounds (so that unlocking cannot allocate or compute without
// bound), and never panics.
func FuzzConfig(f *testing.F) {
	good, _ := json.Marshal(&Config{Format: configFormat, Version: configVersion, Cipher: AES256GCM, BlockSize: 4096,
		KDF: KDF{Name: Argon2id, Salt: make([]byte, 32), Time: 3, MemoryKiB: 64 << 10, Threads: 4}})
	f.Add(good)
	f.Add([]byte(`{"format":"cairn-crypt","version":1,"cipher":"aes-256-gcm","block_size":4096,"kdf":{"name":"scrypt","salt":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","n":65536,"r":1048576,"p":1}}`))
	f.Add([]byte(`{"format":"cairn-crypt","version":1,"cipher":"xchacha20-poly1305","block_size":512,"kdf":{"name":"argon2id","salt":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","time":4294967295,"memory_kib":65536,"threads":4}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig(data)
		if err != nil {
			return
		}
		k := c.KDF
		switch k.Name {
		case Argon2id:
			if k.Time > Argon2MaxTime || k.MemoryKiB > Argon2MaxMemoryKiB || k.Threads > Argon2MaxThreads || k.Time == 0 || k.Threads == 0 {
				t.Fatalf("argon2id %+v accepted", k)
			}
		case Scrypt:
			if k.N > ScryptMaxN || k.R > ScryptMaxR || k.P > ScryptMaxP || k.N < 2 || k.R < 1 || k.P < 1 || 128*k.N*k.R > scryptMaxMemory {
				t.Fatalf("scrypt %+v accepted", k)
			}
		default:
			t.Fatalf("KDF %q accepted", k.Name)
		}
		if _, err := newContent(c.Cipher, make([]byte, 32), c.BlockSize, rand.Reader); err != nil {
			t.Fatalf("content %q/%d accepted: %v", c.Cipher, c.BlockSize, err)
		}
	})
}

// FuzzJournal: a journal parses to records that lie within it, or is
// refused (torn, or not one), and never panics.
func FuzzJournal(f *testing.F) {
	id := bytes.Repeat([]byte{4}, fileIDSize)
	good := journalBytes(7, id, 12345, []jrec{{blk: 3, sealed: []byte("sealed block")}, {blk: 9, sealed: nil}})
	f.Add(good)
	f.Add(good[:len(good)-1])
	f.Add([]byte(journalMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		seq, jid, size, recs, ok := parseJournal(b)
		if !ok {
			return
		}
		if enc := journalBytes(seq, jid, size, recs); !bytes.Equal(enc, b[:len(enc)]) {
			t.Fatalf("journal %x does not encode back", b)
		}
	})
}

// FuzzLowerName: a lower entry name (and, for a long name, its side file)
// decodes only if it is the one lower form of a valid name in that
// directory: one name never has two lower entries.
func FuzzLowerName(f *testing.F) {
	n, err := newNames(bytes.Repeat([]byte{5}, 64))
	if err != nil {
		f.Fatal(err)
	}
	iv := bytes.Repeat([]byte{1}, dirIVSize)
	for _, name := range []string{"f", "file.txt", string(bytes.Repeat([]byte("x"), 200)), string(bytes.Repeat([]byte("y"), 255))} {
		enc := n.encrypt(iv, name)
		lname, long := lowerName(enc)
		if long {
			f.Add(lname, []byte(enc))
			f.Add(lname, []byte(enc[:200]))
		} else {
			f.Add(lname, []byte(nil))
			h := sha256.Sum256([]byte(enc))
			f.Add(longPrefix+b64.EncodeToString(h[:]), []byte(enc)) // a short name in long form
		}
	}
	f.Add("cairn.long.", []byte("x"))
	f.Fuzz(func(t *testing.T, lname string, side []byte) {
		name, enc, err := n.decodeLower(iv, lname, side)
		if err != nil {
			return
		}
		if !layer.ValidName(name) || len(name) > 255 {
			t.Fatalf("%q decodes to the invalid name %q", lname, name)
		}
		want := n.encrypt(iv, name)
		wl, long := lowerName(want)
		if wl != lname || enc != want || long && string(side) != want {
			t.Fatalf("%q (side %q) decodes to %q, whose lower form is %q (long %v)", lname, side, name, wl, long)
		}
	})
}

// FuzzLongLink: only the one form that longLink writes parses.
func FuzzLongLink(f *testing.F) {
	t0, _ := longLink(4095, "some encrypted target")
	f.Add(t0)
	f.Add(t0[:len(t0)-1] + "=")
	f.Add("cairn.ln.-001." + t0[len(t0)-43:])
	f.Fuzz(func(t *testing.T, s string) {
		n, store, ok := parseLongLink(s)
		if !ok {
			return
		}
		h := store[len(longLinkDir)+1:]
		if fmt.Sprintf("%s%04d.%s", longLinkPrefix, n, h) != s || n > 9999 || strings.Contains(h, "/") {
			t.Fatalf("%q parses to %d, %q", s, n, store)
		}
	})
}
