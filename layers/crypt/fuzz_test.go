package crypt

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"cairn/layer"
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
	f.Add(header(make([]byte, fileIDSize)))
	f.Add([]byte("cairnc\x00\x02"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, h []byte) {
		id, err := parseHeader(h)
		if err != nil {
			return
		}
		if !bytes.Equal(header(id), h[:headerSize]) {
			t.Fatalf("header %x parses to id %x", h, id)
		}
	})
}

func FuzzBlock(f *testing.F) {
	c := fuzzContent(f)
	id := bytes.Repeat([]byte{9}, fileIDSize)
	a := c.fileAEAD(id)
	nonce := make([]byte, c.ns)
	good := c.seal(a, nil, nonce, []byte("some plaintext"), id, 3, true)
	f.Add(good, uint64(3), true)
	f.Add(good[:10], uint64(3), true)
	f.Add(make([]byte, c.cbs), uint64(0), false)
	f.Fuzz(func(t *testing.T, sealed []byte, n uint64, last bool) {
		p, err := c.open(a, nil, sealed, id, n, last)
		if err != nil {
			return
		}
		// Only the block that was sealed opens, at its place.
		if !bytes.Equal(sealed, good) || n != 3 || !last || string(p) != "some plaintext" {
			t.Fatalf("forged block opened: %x at %d (last %v) -> %q", sealed, n, last, p)
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
