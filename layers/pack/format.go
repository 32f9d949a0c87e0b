package pack

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strconv"
	"strings"
)

// The on-disk format (docs/pack.md).
//
// A packed file is an empty lower file that carries the xattr XattrName:
//
//	version byte (1) | uvarint pack number | uvarint offset | uvarint length | CRC-32C (4 bytes, little-endian)
//
// at most 1+5+10+10+4 bytes, a few dozen, so that ext4 keeps it in the
// inode. Its bytes are length bytes at offset of the pack file
// PackPrefix+number in the same directory. A pack is a header (packMagic,
// whose last byte is the version) and records, each a recordHdr-byte
// header (uint32 length, uint32 CRC-32C of the bytes, uint64 the lower
// inode number of the file packed, little-endian) followed by the bytes;
// the xattr's offset is that of the bytes. Records are found through the
// xattrs only; the record headers let a person (or a future fsck) tell
// what a pack holds.

// XattrName is the xattr that marks a packed file.
const XattrName = "user.cairn.pack"

// PackPrefix starts the name of every pack file ("" + number in decimal).
const PackPrefix = ".cairn-pack."

// LockName is the claim's lock file at the root of the lower.
const LockName = ".cairn-pack.lock"

const (
	refVersion = 1
	maxRefLen  = 1 + 3*binary.MaxVarintLen64 + 4
	recordHdr  = 16
)

var packMagic = []byte("cairnpk\x01")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// ref says where a packed file's bytes are.
type ref struct {
	pack uint64 // the pack's number
	off  int64  // offset of the bytes in the pack
	n    int64  // their length: the file's size
	crc  uint32 // CRC-32C of the bytes
}

func (r ref) encode() []byte {
	b := make([]byte, 0, maxRefLen)
	b = append(b, refVersion)
	b = binary.AppendUvarint(b, r.pack)
	b = binary.AppendUvarint(b, uint64(r.off))
	b = binary.AppendUvarint(b, uint64(r.n))
	return binary.LittleEndian.AppendUint32(b, r.crc)
}

var errBadRef = errors.New("pack: malformed " + XattrName + " xattr")

// maxPacked bounds the length a ref may state (max_size's upper limit).
const maxPacked = 64 << 10

func decodeRef(b []byte) (ref, error) {
	var r ref
	if len(b) < 1 || b[0] != refVersion {
		return r, errBadRef
	}
	b = b[1:]
	var v [3]uint64
	for i := range v {
		x, k := binary.Uvarint(b)
		if k <= 0 {
			return r, errBadRef
		}
		v[i], b = x, b[k:]
	}
	if len(b) != 4 || v[1] < uint64(len(packMagic)+recordHdr) || v[1] > 1<<62 || v[2] == 0 || v[2] > maxPacked {
		return r, errBadRef
	}
	return ref{pack: v[0], off: int64(v[1]), n: int64(v[2]), crc: binary.LittleEndian.Uint32(b)}, nil
}

// record is the header and bytes of one record, for the pack.
func record(data []byte, ino uint64) []byte {
	b := make([]byte, recordHdr, recordHdr+len(data))
	binary.LittleEndian.PutUint32(b[0:], uint32(len(data)))
	binary.LittleEndian.PutUint32(b[4:], crcOf(data))
	binary.LittleEndian.PutUint64(b[8:], ino)
	return append(b, data...)
}

// packName is the name of pack number n.
func packName(n uint64) string { return PackPrefix + strconv.FormatUint(n, 10) }

// packNumber parses a pack's name (false: not a pack).
func packNumber(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, PackPrefix)
	if !ok || s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// reservedName: the layer's own names, hidden in every directory.
func reservedName(name string) bool { return strings.HasPrefix(name, PackPrefix) }
