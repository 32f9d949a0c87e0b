package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"golang.org/x/crypto/chacha20poly1305"
)

// The content format (docs/crypt.md has the whole of it):
//
//	file   = "" | header block*
//	header = "cairnc" version(2, big endian) fileID(16)
//	block  = nonce ciphertext tag
//
// Every block but the last holds BlockSize plaintext bytes; the last holds
// 1..BlockSize. Each block is sealed with a key derived from the master key
// and the file ID, a fresh random nonce, and the associated data
// fileID || blockNumber(8, big endian) || last(1), so that a block cannot be
// moved to another file or offset, and the end of the file is authenticated.

const (
	headerMagic   = "cairnc"
	formatVersion = 1
	// sparseVersion is the header version of a file that may have holes
	// (docs/crypt.md): readers before it refuse such a file with a clear
	// message instead of failing on its last block.
	sparseVersion = 2
	fileIDSize    = 16
	headerSize    = len(headerMagic) + 2 + fileIDSize
	tagSize       = 16
)

// Ciphers for the content.
const (
	AES256GCM         = "aes-256-gcm"
	XChaCha20Poly1305 = "xchacha20-poly1305"
)

// content knows the block geometry and seals and opens blocks.
type content struct {
	cipher string
	key    []byte // the content key: file keys derive from it
	bs     int    // plaintext bytes per block
	ns     int    // nonce size
	cbs    int    // ciphertext bytes per full block
	rand   io.Reader
}

func newContent(cipherName string, key []byte, blockSize int, rnd io.Reader) (*content, error) {
	c := &content{cipher: cipherName, key: key, bs: blockSize, rand: rnd}
	switch cipherName {
	case AES256GCM:
		c.ns = 12
	case XChaCha20Poly1305:
		c.ns = chacha20poly1305.NonceSizeX
	default:
		return nil, fmt.Errorf("unknown cipher %q (want %s or %s)", cipherName, AES256GCM, XChaCha20Poly1305)
	}
	if blockSize < 512 || blockSize > 1<<20 || blockSize&(blockSize-1) != 0 {
		return nil, fmt.Errorf("block size %d: want a power of two from 512 to 1MiB", blockSize)
	}
	c.cbs = c.ns + blockSize + tagSize
	return c, nil
}

// overhead is the ciphertext bytes a block adds to its plaintext.
func (c *content) overhead() int { return c.ns + tagSize }

// fileAEAD returns the AEAD of the file with the given ID: its key is
// HKDF-SHA256(contentKey, info = "cairn-crypt v1 file" || fileID), so that
// random nonces are drawn per file and never approach their bound.
func (c *content) fileAEAD(id []byte) cipher.AEAD {
	k, err := hkdf.Key(sha256.New, c.key, nil, "cairn-crypt v1 file"+string(id), 32)
	if err != nil {
		panic(err)
	}
	return newAEADClear(c.cipher, k)
}

// newAEADClear is newAEAD, and clears the key (the cipher keeps its own
// schedule).
func newAEADClear(name string, key []byte) cipher.AEAD {
	defer clear(key)
	return newAEAD(name, key)
}

func newAEAD(name string, key []byte) cipher.AEAD {
	var a cipher.AEAD
	var err error
	switch name {
	case AES256GCM:
		var b cipher.Block
		if b, err = aes.NewCipher(key); err == nil {
			a, err = cipher.NewGCM(b)
		}
	case XChaCha20Poly1305:
		a, err = chacha20poly1305.NewX(key)
	default:
		err = fmt.Errorf("unknown cipher %q", name)
	}
	if err != nil {
		panic(err) // key sizes are ours: a programming error
	}
	return a
}

// The mark, the last byte of a block's associated data: whether the block
// is the file's last, and whether the file may have holes (said by its last
// block only, so that it is authenticated).
const (
	markInner       = 0 // not the last block
	markLast        = 1 // the last block of a file without holes
	markLastSparse  = 2 // the last block of a file that may have holes
	holesUnknown    = 0 // fileState.holes: not read yet
	holesNone       = markLast
	holesMaybe      = markLastSparse
	lastMarkUnknown = 255
)

// aad is the associated data of a block.
func aad(dst *[fileIDSize + 9]byte, id []byte, n uint64, mark byte) []byte {
	copy(dst[:fileIDSize], id)
	binary.BigEndian.PutUint64(dst[fileIDSize:], n)
	dst[fileIDSize+8] = mark
	return dst[:]
}

// seal appends the sealed block n to dst; nonce is fresh randomness.
func (c *content) seal(a cipher.AEAD, dst, nonce, plain, id []byte, n uint64, mark byte) []byte {
	var ad [fileIDSize + 9]byte
	dst = append(dst, nonce...)
	return a.Seal(dst, nonce, plain, aad(&ad, id, n, mark))
}

// maxPlain is the largest plaintext size of the format: the lower size
// must fit in an int64.
func (c *content) maxPlain() int64 {
	const maxLower = 1<<63 - 1
	return (maxLower - int64(headerSize)) / int64(c.cbs) * int64(c.bs)
}

// isHole reports whether a sealed block is all zeros: what the lower reads
// in a hole (no sealed block is all zeros but with probability 2^-128).
func (c *content) isHole(sealed []byte) bool {
	if len(sealed) != c.cbs {
		return false
	}
	for _, b := range sealed {
		if b != 0 {
			return false
		}
	}
	return true
}

// randErr is a failure of the random source: the operation fails (EIO
// and a log line) rather than use a nonce, ID or IV that is not random.
func randErr(err error) error { return fmt.Errorf("crypt: the random source failed: %w", err) }

// errBlock is a block that does not authenticate.
var errBlock = errors.New("block does not authenticate")

// open appends the plaintext of the sealed block n to dst.
func (c *content) open(a cipher.AEAD, dst, sealed, id []byte, n uint64, mark byte) ([]byte, error) {
	if len(sealed) <= c.overhead() || len(sealed) > c.cbs {
		return dst, errBlock
	}
	var ad [fileIDSize + 9]byte
	out, err := a.Open(dst, sealed[:c.ns], sealed[c.ns:], aad(&ad, id, n, mark))
	if err != nil {
		return dst, errBlock
	}
	return out, nil
}

// header returns a file header of version v.
func header(id []byte, v uint16) []byte {
	h := make([]byte, 0, headerSize)
	h = append(h, headerMagic...)
	h = binary.BigEndian.AppendUint16(h, v)
	return append(h, id...)
}

// parseHeader returns the file ID and version of a header. The version is
// a hint for readers, not trusted: whether a file may have holes is said by
// its authenticated last block.
func parseHeader(h []byte) ([]byte, uint16, error) {
	if len(h) < headerSize || string(h[:len(headerMagic)]) != headerMagic {
		return nil, 0, errors.New("bad file header (not a cairn crypt file)")
	}
	v := binary.BigEndian.Uint16(h[len(headerMagic):])
	if v != formatVersion && v != sparseVersion {
		return nil, 0, fmt.Errorf("file header of format version %d (this cairn reads versions %d and %d)", v, formatVersion, sparseVersion)
	}
	id := make([]byte, fileIDSize)
	copy(id, h[len(headerMagic)+2:headerSize])
	return id, v, nil
}

// plainSize is the plaintext size of a file whose ciphertext is lower bytes
// long; false if no file of this format has that size (a truncated file).
func (c *content) plainSize(lower uint64) (uint64, bool) {
	if lower == 0 {
		return 0, true
	}
	if lower <= uint64(headerSize) {
		return 0, false
	}
	d := lower - uint64(headerSize)
	full, rem := d/uint64(c.cbs), d%uint64(c.cbs)
	size := full * uint64(c.bs)
	if rem == 0 {
		return size, true
	}
	if rem <= uint64(c.overhead()) {
		return size, false
	}
	return size + rem - uint64(c.overhead()), true
}

// lowerSize is the ciphertext size of a file of plain bytes.
func (c *content) lowerSize(plain uint64) uint64 {
	if plain == 0 {
		return 0
	}
	full, rem := plain/uint64(c.bs), plain%uint64(c.bs)
	n := uint64(headerSize) + full*uint64(c.cbs)
	if rem > 0 {
		n += rem + uint64(c.overhead())
	}
	return n
}

// blockOffset is where block n starts in the lower file.
func (c *content) blockOffset(n uint64) int64 {
	return int64(headerSize) + int64(n)*int64(c.cbs)
}
