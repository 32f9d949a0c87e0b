package crypt

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/tink-crypto/tink-go/v2/daead/subtle"

	"cairnfs.dev/cairn/layer"
)

// Names are encrypted with AES-SIV (RFC 5297, deterministic authenticated
// encryption) keyed per volume, with the directory's random IV as the
// associated data: one name gives one ciphertext in one directory (so a
// lookup is one encryption, no scan) and different ciphertexts in two
// directories. The plaintext is padded to a multiple of 16 bytes so that
// only a name's length class shows. The result is written in unpadded
// base64url. A name whose encoded form is longer than the lower file
// system allows is stored as longPrefix + base64url(SHA-256(encoded)) with
// the encoded form in a side file of that name + longSuffix.

const (
	dirIVName  = ".cairn.diriv" // the directory's IV and its MAC, in the directory
	dirIVSize  = 16
	dirIVMAC   = 16
	longPrefix = "cairn.long."
	longSuffix = ".name"
	// maxEncoded is the longest lower name we write: NAME_MAX of the
	// common Linux file systems.
	maxEncoded = 255
	namePad    = 16
	// maxSide bounds a side file: the encoded form of a 255-byte name
	// (256 padded bytes and a 16-byte SIV) is 363 characters.
	maxSide = 512
)

var b64 = base64.RawURLEncoding

// names encrypts and decrypts names.
type names struct {
	siv *subtle.AESSIV
}

func newNames(key []byte) (*names, error) {
	s, err := subtle.NewAESSIV(key)
	if err != nil {
		return nil, err
	}
	return &names{siv: s}, nil
}

// encrypt gives the encoded ciphertext of name in the directory with iv.
func (n *names) encrypt(iv []byte, name string) string {
	p := len(name)
	padded := make([]byte, p, p+namePad)
	copy(padded, name)
	pad := namePad - p%namePad
	for i := 0; i < pad; i++ {
		padded = append(padded, byte(pad))
	}
	ct, err := n.siv.EncryptDeterministically(padded, iv)
	if err != nil {
		panic(err) // only for absurd lengths
	}
	return b64.EncodeToString(ct)
}

var errName = errors.New("file name does not authenticate")

// decrypt reverses encrypt.
func (n *names) decrypt(iv []byte, enc string) (string, error) {
	ct, err := b64.DecodeString(enc)
	// Only the canonical encoding: the decoder skips CR and LF and
	// ignores stray low bits, which would give one name two lower names.
	if err != nil || len(ct) < 16+namePad || (len(ct)-16)%namePad != 0 || b64.EncodeToString(ct) != enc {
		return "", errName
	}
	pt, err := n.siv.DecryptDeterministically(ct, iv)
	if err != nil {
		return "", errName
	}
	pad := int(pt[len(pt)-1])
	if pad < 1 || pad > namePad || pad > len(pt) {
		return "", errName
	}
	for _, b := range pt[len(pt)-pad:] {
		if int(b) != pad {
			return "", errName
		}
	}
	if pad == len(pt) {
		return "", errName
	}
	return string(pt[:len(pt)-pad]), nil
}

// A symlink target too long for a lower symlink once encrypted (3,044 bytes
// and more with AES-256-GCM) is stored in the file longLinkDir/HASH, HASH
// being base64url(SHA-256(encrypted target)), and the lower symlink's target
// is "cairn.ln.NNNN.HASH", NNNN the plaintext length in 4 decimal digits:
// longLinkSize (57) characters, a length no base64 target has (never 1 more
// than a multiple of 4), so that stat tells the two kinds apart.
const (
	longLinkPrefix = "cairn.ln."
	longLinkDir    = ".cairn.links"
	longLinkSize   = len(longLinkPrefix) + 5 + 43
	maxLongLink    = 6000 // the encrypted form of a 4,095-byte target is 5,498 characters
)

// longLink gives the lower target of a long symlink target of n bytes whose
// encrypted form is enc, and the path of the file that holds enc.
func longLink(n int, enc string) (target, store string) {
	t := longLinkTarget(n, enc)
	return t, longLinkDir + "/" + t[len(t)-43:]
}

func longLinkTarget(n int, enc string) string {
	h := sha256.Sum256([]byte(enc))
	return fmt.Sprintf("%s%04d.%s", longLinkPrefix, n, b64.EncodeToString(h[:]))
}

// parseLongLink reads a lower target made by longLink.
func parseLongLink(t string) (n int, store string, ok bool) {
	if len(t) != longLinkSize || !strings.HasPrefix(t, longLinkPrefix) || t[len(longLinkPrefix)+4] != '.' {
		return 0, "", false
	}
	for _, c := range t[len(longLinkPrefix) : len(longLinkPrefix)+4] {
		if c < '0' || c > '9' {
			return 0, "", false
		}
		n = 10*n + int(c-'0')
	}
	h := t[len(t)-43:]
	if b, err := b64.DecodeString(h); err != nil || len(b) != sha256.Size || b64.EncodeToString(b) != h {
		return 0, "", false
	}
	return n, longLinkDir + "/" + h, true
}

// decodeLower gives the plaintext name of the lower entry lname in a
// directory with iv, and its encoded form; side is the content of the side
// file when lname is a long name. Only the canonical lower form of a name
// decodes: lowerName(encrypt(iv, name)) is lname, and side is the encoded
// form when lname is long.
func (n *names) decodeLower(iv []byte, lname string, side []byte) (name, enc string, err error) {
	enc = lname
	if isLong(lname) {
		if !checkLong(lname, side) {
			return "", "", errors.New("does not match its " + longSuffix)
		}
		enc = string(side)
	} else if len(enc) > maxEncoded {
		return "", "", errors.New("too long")
	}
	name, err = n.decrypt(iv, enc)
	if err == nil && (!layer.ValidName(name) || len(name) > 255) {
		err = errName
	}
	if err != nil {
		return "", "", errors.New("does not authenticate")
	}
	return name, enc, nil
}

// lowerName is the name stored in the lower directory for an encoded name,
// and whether it is the long form (with a side file).
func lowerName(enc string) (string, bool) {
	if len(enc) <= maxEncoded {
		return enc, false
	}
	h := sha256.Sum256([]byte(enc))
	return longPrefix + b64.EncodeToString(h[:]), true
}

// isLong reports whether a lower name is the long form; isOwn whether it is
// a file of the layer's own (IV, side file, configuration), never listed.
func isLong(lname string) bool { return strings.HasPrefix(lname, longPrefix) && !isOwn(lname) }
func isOwn(lname string) bool  { return strings.HasPrefix(lname, ".") || isSide(lname) }

// isSide reports whether a lower name is a long name's side file.
func isSide(lname string) bool {
	return strings.HasPrefix(lname, longPrefix) && strings.HasSuffix(lname, longSuffix)
}

// ivFile is the content of a directory's IV file: the IV and a MAC of it
// (HMAC-SHA256 with the volume's IV key, truncated to 16 bytes), so that a
// changed IV is found at once, not only as names that do not decrypt.
func ivFile(key, iv []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("cairn-crypt v1 diriv"))
	m.Write(iv)
	return m.Sum(append([]byte{}, iv...))[:dirIVSize+dirIVMAC]
}

// checkIV returns the IV of an IV file's content.
func checkIV(key, b []byte) ([]byte, bool) {
	if len(b) != dirIVSize+dirIVMAC {
		return nil, false
	}
	iv := b[:dirIVSize]
	return iv, hmac.Equal(ivFile(key, iv), b)
}

// checkLong verifies that a side file's content belongs to the long name
// and is the canonical long form: an encoded name short enough to be
// stored as itself is never stored as a long one (else one name could
// have two lower entries).
func checkLong(lname string, enc []byte) bool {
	if len(enc) <= maxEncoded || len(enc) > maxSide {
		return false
	}
	h := sha256.Sum256(enc)
	return lname == longPrefix+b64.EncodeToString(h[:]) && !bytes.ContainsAny(enc, "/\x00")
}
