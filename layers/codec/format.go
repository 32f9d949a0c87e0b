package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The on-disk format (docs/codec-format.md describes it for people).
//
// A file is a header area of two 64-byte slots followed by a log of
// records. Every record carries its own header, so the log alone is enough to
// rebuild the file; the slots and the checkpoint records only make opening
// and stat cheap.

const (
	formatVersion = 1
	slotSize      = 64
	headerSize    = 2 * slotSize // the log starts here
	recHdrSize    = 48

	minShift = 12 // 4 KiB chunks
	maxShift = 20 // 1 MiB chunks
)

var (
	slotMagic = [4]byte{'C', 'Z', 'F', formatVersion}
	recMagic  = [4]byte{'C', 'Z', 'R', formatVersion}
	crcTable  = crc32.MakeTable(crc32.Castagnoli)
)

func crc(b []byte) uint32 { return crc32.Checksum(b, crcTable) }

// Record types.
const (
	recChunk = 1 // a whole chunk: payload is its encoding
	recDelta = 2 // raw bytes at in-chunk offset aux, over the chunk's content (appends, writes in the middle)
	recSize  = 3 // the logical size is arg; with flagReset, everything older is dead
	recIndex = 4 // a checkpoint: the live records as of gen, and the size (arg)
)

// Record flags.
const (
	flagRaw   = 1 // chunk payload stored unencoded
	flagReset = 2 // size record: records of lower generations are dead
)

// Header slot flags.
const (
	// slotWhole: every generation from 1, or from the log's newest reset
	// record, up to the header's is in the log (files written since this
	// flag exists; older files may lack early generations after a
	// truncation to zero). Opening then knows that a missing generation is
	// a destroyed record, with or without a checkpoint.
	slotWhole = 1
)

// slot is one header slot.
type slot struct {
	codec   uint8
	shift   uint8
	salt    uint32
	flags   uint32
	seq     uint64 // the higher valid slot wins
	size    int64  // logical size when written
	logEnd  int64  // the log's end when written: stat trusts size only if the file still ends there
	ckptOff int64  // latest checkpoint record, 0 if none
	gen     uint64 // highest generation in the log when written
}

func (s *slot) marshal() []byte {
	b := make([]byte, slotSize)
	copy(b, slotMagic[:])
	binary.LittleEndian.PutUint16(b[4:], formatVersion)
	b[6] = s.codec
	b[7] = s.shift
	binary.LittleEndian.PutUint32(b[8:], s.salt)
	binary.LittleEndian.PutUint32(b[12:], s.flags)
	binary.LittleEndian.PutUint64(b[16:], s.seq)
	binary.LittleEndian.PutUint64(b[24:], uint64(s.size))
	binary.LittleEndian.PutUint64(b[32:], uint64(s.logEnd))
	binary.LittleEndian.PutUint64(b[40:], uint64(s.ckptOff))
	binary.LittleEndian.PutUint64(b[48:], s.gen)
	binary.LittleEndian.PutUint32(b[60:], crc(b[:60]))
	return b
}

func parseSlot(b []byte) (slot, error) {
	var s slot
	if len(b) < slotSize {
		return s, errors.New("short header slot")
	}
	if [4]byte(b[:4]) != slotMagic {
		return s, errors.New("bad header magic")
	}
	if crc(b[:60]) != binary.LittleEndian.Uint32(b[60:]) {
		return s, errors.New("header checksum mismatch")
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != formatVersion {
		return s, fmt.Errorf("unknown format version %d", v)
	}
	s.codec, s.shift = b[6], b[7]
	s.salt = binary.LittleEndian.Uint32(b[8:])
	s.flags = binary.LittleEndian.Uint32(b[12:])
	s.seq = binary.LittleEndian.Uint64(b[16:])
	s.size = int64(binary.LittleEndian.Uint64(b[24:]))
	s.logEnd = int64(binary.LittleEndian.Uint64(b[32:]))
	s.ckptOff = int64(binary.LittleEndian.Uint64(b[40:]))
	s.gen = binary.LittleEndian.Uint64(b[48:])
	if s.shift < minShift || s.shift > maxShift || s.size < 0 || s.logEnd < 0 || s.ckptOff < 0 ||
		(s.ckptOff != 0 && s.ckptOff < headerSize) {
		return s, errors.New("header fields out of range")
	}
	return s, nil
}

// bestSlot returns the valid slot with the highest sequence number.
func bestSlot(area []byte) (slot, bool) {
	var best slot
	ok := false
	for i := 0; i < 2 && (i+1)*slotSize <= len(area); i++ {
		s, err := parseSlot(area[i*slotSize:])
		if err == nil && (!ok || s.seq > best.seq) {
			best, ok = s, true
		}
	}
	return best, ok
}

// rec is a record header.
type rec struct {
	typ     uint8
	codec   uint8
	flags   uint8
	shift   uint8
	salt    uint32
	encLen  uint32 // payload length
	gen     uint64
	arg     uint64 // chunk number (chunk, delta); size (size, index)
	decLen  uint32 // decoded length (chunk); payload length (delta)
	aux     uint32 // in-chunk offset (delta)
	dataCRC uint32
}

func (r *rec) marshal(b []byte) {
	copy(b, recMagic[:])
	b[4], b[5], b[6], b[7] = r.typ, r.codec, r.flags, r.shift
	binary.LittleEndian.PutUint32(b[8:], r.salt)
	binary.LittleEndian.PutUint32(b[12:], r.encLen)
	binary.LittleEndian.PutUint64(b[16:], r.gen)
	binary.LittleEndian.PutUint64(b[24:], r.arg)
	binary.LittleEndian.PutUint32(b[32:], r.decLen)
	binary.LittleEndian.PutUint32(b[36:], r.aux)
	binary.LittleEndian.PutUint32(b[40:], r.dataCRC)
	binary.LittleEndian.PutUint32(b[44:], crc(b[:44]))
}

// appendRecord appends a record with payload p to dst.
func appendRecord(dst []byte, r rec, p []byte) []byte {
	r.encLen = uint32(len(p))
	r.dataCRC = crc(p)
	n := len(dst)
	dst = append(dst, make([]byte, recHdrSize)...)
	r.marshal(dst[n:])
	return append(dst, p...)
}

// maxPayload bounds a record's payload for chunks of 1<<shift bytes: the
// largest encoding a codec may produce (uuencode grows data by about 37%).
func maxPayload(shift uint8) uint32 { return 2<<shift + 4096 }

// parseRec parses and checks a record header. salt and shift, if not zero,
// must match. It does not check the payload.
func parseRec(b []byte, salt uint32, shift uint8) (rec, error) {
	var r rec
	if len(b) < recHdrSize {
		return r, errors.New("short record header")
	}
	if [4]byte(b[:4]) != recMagic {
		return r, errors.New("bad record magic")
	}
	if crc(b[:44]) != binary.LittleEndian.Uint32(b[44:]) {
		return r, errors.New("record header checksum mismatch")
	}
	r.typ, r.codec, r.flags, r.shift = b[4], b[5], b[6], b[7]
	r.salt = binary.LittleEndian.Uint32(b[8:])
	r.encLen = binary.LittleEndian.Uint32(b[12:])
	r.gen = binary.LittleEndian.Uint64(b[16:])
	r.arg = binary.LittleEndian.Uint64(b[24:])
	r.decLen = binary.LittleEndian.Uint32(b[32:])
	r.aux = binary.LittleEndian.Uint32(b[36:])
	r.dataCRC = binary.LittleEndian.Uint32(b[40:])
	if salt != 0 && r.salt != salt {
		return r, errors.New("record of another file (salt mismatch)")
	}
	if shift != 0 && r.shift != shift {
		return r, errors.New("record with another chunk size")
	}
	if r.shift < minShift || r.shift > maxShift {
		return r, errors.New("record chunk size out of range")
	}
	cs := uint64(1) << r.shift
	switch r.typ {
	case recChunk:
		if uint64(r.decLen) > cs || r.encLen > maxPayload(r.shift) || r.arg > maxChunkNo(r.shift) {
			return r, errors.New("chunk record fields out of range")
		}
	case recDelta:
		if r.decLen != r.encLen || uint64(r.aux)+uint64(r.decLen) > cs || r.arg > maxChunkNo(r.shift) {
			return r, errors.New("delta record fields out of range")
		}
	case recSize:
		if r.encLen != 0 || r.arg > maxFileSize {
			return r, errors.New("size record fields out of range")
		}
	case recIndex:
		if r.arg > maxFileSize || r.encLen > maxIndexPayload {
			return r, errors.New("index record fields out of range")
		}
	default:
		return r, fmt.Errorf("unknown record type %d", r.typ)
	}
	if r.gen == 0 {
		return r, errors.New("record generation 0")
	}
	return r, nil
}

// fixRecHeader finds the one bit whose flip makes b a valid record header
// (magic included). CRC-32C tells single-bit errors in a 48-byte header
// apart, so the result is not a guess; anything else is left alone. The
// scanner uses it to learn where a damaged record belongs (its chunk still
// reads as EIO: readRecord stays strict).
func fixRecHeader(b []byte, salt uint32, shift uint8) (rec, bool) {
	if len(b) < recHdrSize {
		return rec{}, false
	}
	h := [recHdrSize]byte(b[:recHdrSize])
	var found rec
	n := 0
	for bit := 0; bit < recHdrSize*8; bit++ {
		h[bit/8] ^= 1 << (bit % 8)
		if r, err := parseRec(h[:], salt, shift); err == nil {
			found = r
			n++
		}
		h[bit/8] ^= 1 << (bit % 8)
	}
	return found, n == 1
}

const (
	maxFileSize     = 1 << 62
	maxIndexPayload = 1 << 30
)

func maxChunkNo(shift uint8) uint64 { return maxFileSize >> shift }

// op is one step of building a chunk's content from the log: the state of a
// chunk is a whole-chunk record followed by deltas and clips (truncations),
// in generation order.
type op struct {
	kind opKind
	rlen uint32 // the record's length, header included (base, delta)
	off  int64  // the record's offset (base, delta); the clipped length (clip)
	gen  uint64
}

type opKind uint8

const (
	opBase  opKind = 1
	opDelta opKind = 2
	opClip  opKind = 3
)

const indexEntrySize = 8 + 1 + 8 + 4 + 8

// marshalIndex encodes a checkpoint's payload: the ops of every chunk.
func marshalIndex(chunks map[int64][]op, order []int64) []byte {
	n := 0
	for _, c := range order {
		n += len(chunks[c])
	}
	b := make([]byte, 4, 4+n*indexEntrySize)
	binary.LittleEndian.PutUint32(b, uint32(n))
	for _, c := range order {
		for _, o := range chunks[c] {
			b = binary.LittleEndian.AppendUint64(b, uint64(c))
			b = append(b, byte(o.kind))
			b = binary.LittleEndian.AppendUint64(b, uint64(o.off))
			b = binary.LittleEndian.AppendUint32(b, o.rlen)
			b = binary.LittleEndian.AppendUint64(b, o.gen)
		}
	}
	return b
}

// parseIndex decodes a checkpoint's payload for a file with chunks of
// 1<<shift bytes, checking every entry.
func parseIndex(b []byte, shift uint8) (map[int64][]op, error) {
	if len(b) < 4 {
		return nil, errors.New("short index")
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(len(b)) != uint64(n)*indexEntrySize {
		return nil, errors.New("index length mismatch")
	}
	chunks := map[int64][]op{}
	cs := int64(1) << shift
	for i := uint32(0); i < n; i++ {
		e := b[i*indexEntrySize:]
		c := binary.LittleEndian.Uint64(e)
		o := op{
			kind: opKind(e[8]),
			off:  int64(binary.LittleEndian.Uint64(e[9:])),
			rlen: binary.LittleEndian.Uint32(e[17:]),
			gen:  binary.LittleEndian.Uint64(e[21:]),
		}
		if c > maxChunkNo(shift) {
			return nil, errors.New("index entry: chunk number out of range")
		}
		switch o.kind {
		case opBase, opDelta:
			if o.off < headerSize || o.rlen < recHdrSize || o.rlen > recHdrSize+maxPayload(shift) || o.gen == 0 {
				return nil, errors.New("index entry out of range")
			}
		case opClip:
			if o.off < 0 || o.off >= cs {
				return nil, errors.New("index entry: clip out of range")
			}
		default:
			return nil, fmt.Errorf("index entry of unknown kind %d", o.kind)
		}
		chunks[int64(c)] = append(chunks[int64(c)], o)
	}
	return chunks, nil
}
