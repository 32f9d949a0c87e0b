package crypt

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// The known-answer tests pin the on-disk format (docs/crypt.md): a fixed
// master key and a fixed source of randomness must give these bytes. A
// change of format must change formatVersion (and these answers).

var katMaster, _ = hex.DecodeString("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")

// katVolume makes a volume with a fixed master key, root IV and randomness.
func katVolume(t *testing.T, cipherName string) (string, *FS) {
	t.Helper()
	dir := t.TempDir()
	c := &Config{Format: configFormat, Version: configVersion, Cipher: cipherName, BlockSize: 4096,
		KDF: KDF{Name: Scrypt, N: 1024, R: 8, P: 1, Salt: make([]byte, 32)}}
	c.KeyCheck = c.keyCheck(katMaster)
	ivKey, _ := hkdf.Key(sha256.New, katMaster, nil, "cairn-crypt v1 diriv", 32)
	if err := os.WriteFile(filepath.Join(dir, dirIVName), ivFile(ivKey, bytes.Repeat([]byte{0xa5}, dirIVSize)), 0o444); err != nil {
		t.Fatal(err)
	}
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := New(l, c, katMaster, Options{Rand: rand.NewChaCha8([32]byte{1})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	return dir, fs
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:8]) }

func TestKnownAnswers(t *testing.T) {
	for _, cipherName := range []string{AES256GCM, XChaCha20Poly1305} {
		tc := struct{ cipher string }{cipherName}
		t.Run(tc.cipher, func(t *testing.T) {
			dir, fs := katVolume(t, tc.cipher)
			ctx := context.Background()
			data := bytes.Repeat([]byte("cairn known answer "), 500) // 9500 bytes: 3 blocks
			if err := layer.WriteFile(ctx, fs, "hello.txt", data, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := fs.Symlink(ctx, "target/of/link", "link"); err != nil {
				t.Fatal(err)
			}
			lname := fs.names.encrypt(bytes.Repeat([]byte{0xa5}, 16), "hello.txt")
			raw, err := os.ReadFile(filepath.Join(dir, lname))
			if err != nil {
				t.Fatal(err)
			}
			tgt, _ := os.Readlink(filepath.Join(dir, fs.names.encrypt(bytes.Repeat([]byte{0xa5}, 16), "link")))
			t.Logf("name %s file %s (%d bytes) link %s", lname, sum(raw), len(raw), sum([]byte(tgt)))
			want := knownAnswers[tc.cipher]
			if lname != want[0] || sum(raw) != want[1] || sum([]byte(tgt)) != want[2] {
				t.Errorf("format changed: got %q %q %q, want %q", lname, sum(raw), sum([]byte(tgt)), want)
			}
			if tc.cipher == AES256GCM {
				decodeIndependently(t, raw, data)
				// A sparse file: three holes, then a last block
				// of mark 2, under a header of version 2.
				f, _, err := fs.Create(ctx, "sparse", unix.O_RDWR, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(ctx, []byte("after the holes"), 3*4096); err != nil {
					t.Fatal(err)
				}
				f.Release(ctx)
				raw, err := os.ReadFile(filepath.Join(dir, fs.names.encrypt(bytes.Repeat([]byte{0xa5}, 16), "sparse")))
				if err != nil {
					t.Fatal(err)
				}
				decodeIndependently(t, raw, append(make([]byte, 3*4096), "after the holes"...))
			}
		})
	}
}

var knownAnswers = map[string][3]string{
	AES256GCM:         {"YbqJD8vsw8Z_DfPhDAoqygxKpWl9xyzEvElz2L_nwvo", "29969fc2bbb85b5c", "a31ac018746e431c"},
	XChaCha20Poly1305: {"YbqJD8vsw8Z_DfPhDAoqygxKpWl9xyzEvElz2L_nwvo", "50bf50f7e5b75f25", "87ef7481b53c64d3"},
}

// decodeIndependently decrypts a file with the standard library alone,
// following docs/crypt.md, not the layer's code.
func decodeIndependently(t *testing.T, raw, want []byte) {
	t.Helper()
	version := binary.BigEndian.Uint16(raw[6:8])
	if string(raw[:6]) != "cairnc" || version != 1 && version != 2 {
		t.Fatalf("header %x", raw[:8])
	}
	id := raw[8:24]
	contentKey, _ := hkdf.Key(sha256.New, katMaster, nil, "cairn-crypt v1 content", 32)
	fileKey, _ := hkdf.Key(sha256.New, contentKey, nil, "cairn-crypt v1 file"+string(id), 32)
	b, _ := aes.NewCipher(fileKey)
	g, _ := cipher.NewGCM(b)
	var got []byte
	rest := raw[24:]
	for n := uint64(0); len(rest) > 0; n++ {
		blk := rest[:min(len(rest), 12+4096+16)]
		rest = rest[len(blk):]
		ad := append(append([]byte{}, id...), binary.BigEndian.AppendUint64(nil, n)...)
		last := byte(0)
		if len(rest) == 0 {
			last = byte(version) // 2: a file that may have holes
		} else if version == 2 && bytes.Count(blk, []byte{0}) == len(blk) {
			got = append(got, make([]byte, 4096)...) // a hole
			continue
		}
		p, err := g.Open(nil, blk[:12], blk[12:], append(ad, last))
		if err != nil {
			t.Fatalf("block %d: %v", n, err)
		}
		got = append(got, p...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("independent decoding differs")
	}
}

func TestConfigKnownAnswer(t *testing.T) {
	// A configuration written by Init: its passphrase opens it, to this key.
	c := Config{Format: configFormat, Version: configVersion, Cipher: AES256GCM, BlockSize: 4096,
		KDF: KDF{Name: Scrypt, N: 1024, R: 8, P: 1, Salt: bytes.Repeat([]byte{7}, 32)}}
	if err := c.wrap(katMaster, testPass); err != nil {
		t.Fatal(err)
	}
	m, err := c.Unwrap(testPass)
	if err != nil || !bytes.Equal(m, katMaster) {
		t.Fatalf("unwrap: %x, %v", m, err)
	}
	if _, err := c.Unwrap([]byte("wrong")); err != ErrWrongPassphrase {
		t.Fatalf("wrong passphrase: %v", err)
	}
	if err := c.CheckMasterKey(katMaster); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(katMaster)
	bad[0] ^= 1
	if err := c.CheckMasterKey(bad); err != ErrWrongMasterKey {
		t.Fatalf("wrong master key: %v", err)
	}
	// The parameters are bound: changing one breaks the unwrap.
	c2 := c
	c2.BlockSize = 8192
	if _, err := c2.Unwrap(testPass); err != ErrWrongPassphrase {
		t.Fatalf("changed block size: %v", err)
	}
	// KDF known answers (scrypt and argon2id as configured).
	k1, _ := (&KDF{Name: Scrypt, N: 1024, R: 8, P: 1, Salt: bytes.Repeat([]byte{7}, 32)}).derive([]byte("pass"))
	k2, _ := (&KDF{Name: Argon2id, Time: 1, MemoryKiB: 64, Threads: 1, Salt: bytes.Repeat([]byte{7}, 32)}).derive([]byte("pass"))
	t.Logf("scrypt %x argon2id %x", k1, k2)
	if hex.EncodeToString(k1) != kdfAnswers[0] || hex.EncodeToString(k2) != kdfAnswers[1] {
		t.Errorf("KDF answers changed: %x %x", k1, k2)
	}
	// The master key's written form.
	s := FormatMasterKey(katMaster)
	if s != "00010203-04050607-08090a0b-0c0d0e0f-10111213-14151617-18191a1b-1c1d1e1f" {
		t.Errorf("formatted: %s", s)
	}
	if k, err := ParseMasterKey(" " + s + "\n"); err != nil || !bytes.Equal(k, katMaster) {
		t.Errorf("parse: %x %v", k, err)
	}
}

var kdfAnswers = [2]string{"f891203362ec58568ed86e90c18461db61ac3ab160cc1d31d66b8b47f62923ff", "c8b55d2f52aadad23809c3ad3abe68b64af9a52c5065c204c4a1b273503e2231"}

func TestNameKnownAnswer(t *testing.T) {
	key, _ := hkdf.Key(sha256.New, katMaster, nil, "cairn-crypt v1 names", 64)
	n, err := newNames(key)
	if err != nil {
		t.Fatal(err)
	}
	iv := bytes.Repeat([]byte{0xa5}, 16)
	for _, name := range []string{"a", "hello.txt", "exactly-16-bytes", string(bytes.Repeat([]byte("x"), 255))} {
		enc := n.encrypt(iv, name)
		if got, err := n.decrypt(iv, enc); err != nil || got != name {
			t.Fatalf("%q: %q, %v", name, got, err)
		}
		// Length classes of 16 bytes.
		if want := b64.EncodedLen(16 + (len(name)/16+1)*16); len(enc) != want {
			t.Errorf("%q: %d characters, want %d", name, len(enc), want)
		}
		// Another directory: another ciphertext.
		if n.encrypt(bytes.Repeat([]byte{0x5a}, 16), name) == enc {
			t.Errorf("%q: same ciphertext in two directories", name)
		}
		if _, err := n.decrypt(bytes.Repeat([]byte{0x5a}, 16), enc); err == nil {
			t.Errorf("%q: decrypts with another directory's IV", name)
		}
	}
	if got := n.encrypt(iv, "hello.txt"); got != nameAnswer {
		t.Errorf("name format changed: %s", got)
	}
	// The longest name stored directly, and the first in long form.
	if l, long := lowerName(n.encrypt(iv, string(bytes.Repeat([]byte("y"), 159)))); long || len(l) > 255 {
		t.Errorf("159 bytes: %d, long %v", len(l), long)
	}
	if l, long := lowerName(n.encrypt(iv, string(bytes.Repeat([]byte("y"), 160)))); !long || len(l) > 255 {
		t.Errorf("160 bytes: %s, long %v", l, long)
	}
}

var nameAnswer = "YbqJD8vsw8Z_DfPhDAoqygxKpWl9xyzEvElz2L_nwvo"
