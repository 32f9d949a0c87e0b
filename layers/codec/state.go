package codec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
	"time"

	"cairnfs.dev/cairn/layer"
)

// state is the shared state of one file (one lower inode), used by all its
// open handles. It holds the file's index: for every chunk, the ops that
// build its content from the log (exactly what replaying the log gives), plus
// chunks changed in memory and not yet written (dirty) and a few decoded
// chunks (cache).
type state struct {
	fs  *Engine
	ino layer.ID

	refs    int  // open handles; guarded by fs.mu
	removed bool // out of fs.states; guarded by fs.mu
	idle    bool // on fs.idle; guarded by fs.mu
	// idleAt is when the last handle was closed (its fold is due
	// FoldDelay after it); guarded by fs.mu.
	idleAt time.Time
	// stamp is the lower file's size and times when this engine last
	// knew it to hold exactly the state (after loading it, and after each
	// close and sync), if stampOK; only for a shared lower (Engine.shared).
	// Another client that changes the file changes them: the state is
	// then stale (dropStale). Guarded by mu.
	stamp   stamp
	stampOK bool
	// writers are the handles open for writing; wlocked: the lower file
	// holds this client's writer lock (lockWriter). Only for a shared
	// lower. Guarded by mu.
	writers int
	wlocked bool

	mu    sync.Mutex
	path  string // for log lines
	lower layer.File
	ro    bool

	shift uint8
	cs    int64
	salt  uint32

	size   int64            // logical size, dirty data included
	psize  int64            // the size the log gives
	chunks map[int64][]op   // the log's state
	dirty  map[int64]*dirty // changed, not yet written
	cache  map[int64][]byte // decoded chunks (clean)
	clock  uint64

	logEnd   int64 // where the next record goes; 0: the file is empty, no header yet
	nextGen  uint64
	hdrSeq   uint64
	ckptOff  int64
	ckptRecs int    // records since the checkpoint
	ckptLen  int64  // their bytes: what opening replays after the checkpoint
	live     int64  // bytes of records in chunks
	hdrStale bool   // the header does not describe the log
	whole    bool   // every generation from 1 or the newest reset is in the log (slotWhole)
	needCkpt bool   // gaps a crash left were accepted: the next sync writes a checkpoint
	lost     string // records known to be lost (damage): the file is not served
	missing  gaps   // their generations
	broken   error  // a failed append could not be cut off: no more writes until reopened

	problems []string // found while loading (for fsck)
	scanned  int      // records replayed while loading
}

// restamp notes the lower file's stamp as the state's (s.mu is held): the
// lower holds exactly what the state says (loaded, or just written out).
func (s *state) restamp(ctx context.Context) {
	if !s.fs.shared || s.chunks == nil || len(s.dirty) > 0 {
		return
	}
	a, err := s.lower.Getattr(ctx)
	s.stamp, s.stampOK = stampOf(&a), err == nil
}

// stamp is what tells that a lower file changed behind a state.
type stamp struct {
	size         uint64
	mtime, ctime layer.Time
}

func stampOf(a *layer.Attr) stamp { return stamp{a.Size, a.Mtime, a.Ctime} }

// dirty is a chunk changed in memory and not yet written.
type dirty struct {
	// buf is the chunk's content, when loaded. A write into a chunk that
	// the log holds and that is neither dirty nor decoded does not decode
	// it (a 1 MiB zstd chunk costs milliseconds each way): the chunk is
	// then not loaded, buf is nil, and its content is the log's with the
	// bytes of ext written over it, until something reads it (loadDirty).
	buf    []byte
	loaded bool
	// ext are the byte ranges changed since the log's content, sorted,
	// apart and not touching: each may be written as a delta record
	// (deltaable). Over a chunk not loaded they carry their bytes; over a
	// loaded one the bytes are in buf.
	ext []extent
	// whole: the chunk must be written as a chunk record (it has no
	// content in the log to amend, or too many changes to track).
	whole bool
	orig  int // the length of the chunk in the log (loaded): a delta cannot shorten it
	used  uint64
}

// extent is a changed range [lo, hi) of a dirty chunk, with its bytes when
// the chunk is not loaded.
type extent struct {
	lo, hi int
	b      []byte
}

// change notes that [lo, hi) of d changed; p are its bytes (kept when d is
// not loaded). Ranges that overlap or touch are merged.
func (d *dirty) change(lo, hi int, p []byte) {
	if d.whole {
		return
	}
	i := sort.Search(len(d.ext), func(i int) bool { return d.ext[i].hi >= lo })
	j := i
	for j < len(d.ext) && d.ext[j].lo <= hi {
		j++
	}
	e := extent{lo: lo, hi: hi}
	if i < j {
		e.lo, e.hi = min(lo, d.ext[i].lo), max(hi, d.ext[j-1].hi)
	}
	if !d.loaded {
		// A copy: p is the caller's (a request's buffer).
		e.b = make([]byte, e.hi-e.lo)
		for _, x := range d.ext[i:j] {
			copy(e.b[x.lo-e.lo:], x.b)
		}
		copy(e.b[lo-e.lo:], p)
	}
	d.ext = slices.Replace(d.ext, i, j, e)
}

// clip drops what d's changed ranges hold at or past n (a truncation).
func (d *dirty) clip(n int) {
	for i := len(d.ext) - 1; i >= 0; i-- {
		e := &d.ext[i]
		switch {
		case e.lo >= n:
			d.ext = d.ext[:i]
		case e.hi > n:
			e.hi = n
			if e.b != nil {
				e.b = e.b[:n-e.lo]
			}
		}
	}
}

const (
	maxDirtyBytes = 4 << 20 // dirty chunks per file before the oldest are written
	maxCacheBytes = 1 << 20 // decoded clean chunks kept per file
	scanBlock     = 4 << 20
	minCkptRecs   = 4
	copyMaxBytes  = 16 << 20
)

func (s *state) errorf(c int64, f string, a ...any) error {
	err := &CorruptError{Path: s.path, Chunk: c, Msg: fmt.Sprintf(f, a...)}
	s.fs.log().Error("codec: corrupt chunk", "path", s.path, "chunk", c, "offset", c*s.cs, "err", err.Msg)
	return err
}

// CorruptError is a chunk that cannot be read back: the application gets EIO.
type CorruptError struct {
	Path  string
	Chunk int64
	Msg   string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("codec: %s: chunk %d is corrupt: %s", e.Path, e.Chunk, e.Msg)
}

// ---- loading -------------------------------------------------------------

// scanned record, during loading.
type srec struct {
	r     rec
	off   int64
	crcOK bool
}

// load reads the file's index: the checkpoint the header names, then the
// records after it; with no usable header or checkpoint, the whole log.
func (s *state) load(ctx context.Context) error {
	s.chunks = map[int64][]op{}
	s.dirty = map[int64]*dirty{}
	s.cache = map[int64][]byte{}
	a, err := s.lower.Getattr(ctx)
	if err != nil {
		return err
	}
	fsize := int64(a.Size)
	s.nextGen = 1
	if fsize == 0 {
		s.shift = s.fs.shift
		s.cs = 1 << s.shift
		s.salt = s.fs.newSalt()
		s.whole = true
		return nil
	}
	area := make([]byte, headerSize)
	n, err := s.lower.ReadAt(ctx, area, 0)
	if err != nil && err != io.EOF {
		return err
	}
	sl, ok := bestSlot(area[:n])
	base := int64(headerSize)
	if !ok && fsize < headerSize && bytes.HasPrefix(area[:n], slotMagic[:min(n, len(slotMagic))]) {
		// The header of a new file, torn by a crash before any record was
		// written: the file is empty (and the header is written again
		// before the first record).
		s.shift = s.fs.shift
		s.cs = 1 << s.shift
		s.salt = s.fs.newSalt()
		s.whole = true
		return nil
	}
	if !ok {
		s.problems = append(s.problems, "header unreadable: the index is rebuilt from the records")
		// Learn the salt and chunk size from the first record.
		r, _, found, err := s.findRecord(ctx, headerSize, fsize, 0, 0)
		if err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("codec: %s: not a file of this layer (no header, no records)", s.path)
		}
		sl = slot{shift: r.shift, salt: r.salt}
		s.hdrStale = true
	}
	s.shift, s.salt = sl.shift, sl.salt
	s.cs = 1 << s.shift
	s.hdrSeq = sl.seq
	s.whole = sl.flags&slotWhole != 0
	var ckptGen uint64
	if sl.ckptOff != 0 {
		if g, end, err := s.loadCheckpoint(ctx, sl.ckptOff, fsize); err != nil {
			s.problems = append(s.problems, fmt.Sprintf("checkpoint at %d unusable (%v): the index is rebuilt from the records", sl.ckptOff, err))
			s.chunks = map[int64][]op{}
			s.size, s.psize = 0, 0
			s.hdrStale = true
		} else {
			ckptGen, base = g, end
			s.ckptOff = sl.ckptOff
		}
	}
	// A sound header whose log end is the file's end was written after
	// every record up to its generation had been written whole (a damaged
	// checkpoint does not change that).
	trusted := ok && sl.logEnd == fsize
	if sl.logEnd != fsize {
		s.hdrStale = true
	}
	recs, err := s.scan(ctx, base, fsize, nil)
	if err != nil {
		return err
	}
	// The next generation follows the newest record found, and the header's
	// only when it is trusted: a stale header (after a crash that lost
	// records it had counted, or a cut file) may name generations whose
	// records are gone, and a header written now must not claim them.
	maxGen := ckptGen
	if trusted {
		maxGen = max(maxGen, sl.gen)
	}
	validEnd := base
	found := map[uint64]bool{}
	var floor uint64 = 1 // generations below the newest reset record are dead
	var tail []srec
	for _, r := range recs {
		maxGen = max(maxGen, r.r.gen)
		validEnd = max(validEnd, r.off+recHdrSize+int64(r.r.encLen))
		if r.r.gen > ckptGen {
			found[r.r.gen] = true
			if r.r.typ != recIndex {
				tail = append(tail, r)
			}
		}
		if r.r.typ == recSize && r.r.flags&flagReset != 0 {
			floor = max(floor, r.r.gen)
		}
	}
	// Generations are given out one by one as records are written, so the
	// log holds every one after the checkpoint, and, in a file whose header
	// says so (slotWhole), every one from 1 or the newest reset record. One
	// that is not there is a record whose header was destroyed: which chunk
	// it changed is unknown, and serving the chunks as they were before it
	// could give stale bytes (or zeros).
	//
	// The newest generation is known when the header is sound and the file
	// ends at its log end (the header was written after every record up to
	// its generation). Otherwise (after a crash, or with the newest slot
	// damaged) the header is older than the log: every generation up to
	// its own must still be there, but later ones may be missing because a
	// crash tore or lost them (compaction writes its reset record after
	// copies of higher generations; without an fsync the disk may keep
	// later pages and lose earlier ones), which is what a crash may do to
	// records that no fsync acknowledged. Those gaps are accepted, and the
	// next sync writes a checkpoint so that they are not taken for damage
	// later.
	lo, hi := uint64(0), sl.gen
	switch {
	case s.ckptOff != 0:
		lo = ckptGen + 1
	case s.whole:
		lo = floor
	case trusted:
		lo = sl.gen // files without slotWhole: only the newest is known
	}
	for g := range found {
		hi = max(hi, g)
	}
	if lo != 0 && hi >= lo && ok {
		limit := hi // gaps up to here are damage
		if !trusted {
			limit = min(hi, sl.gen)
		}
		missing := findGaps(found, lo, limit)
		if !trusted && findGaps(found, max(lo, limit+1), hi).n > 0 {
			s.needCkpt, s.whole = true, false
		}
		if missing.n > 0 {
			s.lost = fmt.Sprintf("%d record(s) are missing (generations %d to %d): their headers are damaged, and the chunks they changed are unknown", missing.n, missing.first, missing.last)
			s.missing = missing
			s.problems = append(s.problems, s.lost)
		}
	}
	if validEnd < fsize && !trusted && !s.ro {
		// A torn record at the end (a crash during an append): cut it, so
		// that the next records do not land after a header that claims
		// their bytes as its payload.
		if _, err := s.lower.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(validEnd)}); err != nil {
			return err
		}
	}
	s.replay(tail)
	s.scanned = len(tail)
	s.ckptRecs = len(tail)
	s.ckptLen = validEnd - base
	s.nextGen = maxGen + 1
	s.logEnd = validEnd
	s.recount()
	return nil
}

// gaps are the generations missing from a range: how many, the first and
// the last.
type gaps struct{ n, first, last uint64 }

// findGaps returns the generations of [lo, hi] that are not in found,
// in time proportional to found (generations come from disk: a damaged
// or crafted record may carry a huge one).
func findGaps(found map[uint64]bool, lo, hi uint64) gaps {
	var g gaps
	if hi < lo {
		return g
	}
	in := make([]uint64, 0, len(found))
	for x := range found {
		if x >= lo && x <= hi {
			in = append(in, x)
		}
	}
	slices.Sort(in)
	next := lo                 // the lowest generation not yet seen
	add := func(a, b uint64) { // [a, b] is missing
		if g.n == 0 {
			g.first = a
		}
		g.n += b - a + 1
		g.last = b
	}
	for _, x := range in {
		if x > next {
			add(next, x-1)
		}
		next = x + 1
	}
	if next <= hi && next != 0 {
		add(next, hi)
	}
	return g
}

// loadCheckpoint loads the checkpoint record at off; it returns its
// generation and end.
func (s *state) loadCheckpoint(ctx context.Context, off, fsize int64) (uint64, int64, error) {
	hb := make([]byte, recHdrSize)
	if off+recHdrSize > fsize {
		return 0, 0, errors.New("beyond the end of the file")
	}
	if n, err := s.lower.ReadAt(ctx, hb, off); n < len(hb) {
		if err == nil || err == io.EOF {
			err = errors.New("cut short")
		}
		return 0, 0, err
	}
	r, err := parseRec(hb, s.salt, s.shift)
	if err != nil {
		return 0, 0, err
	}
	if r.typ != recIndex {
		return 0, 0, errors.New("not a checkpoint record")
	}
	end := off + recHdrSize + int64(r.encLen)
	if end > fsize {
		return 0, 0, errors.New("truncated")
	}
	p := make([]byte, r.encLen)
	if n, err := s.lower.ReadAt(ctx, p, off+recHdrSize); n < len(p) {
		if err == nil || err == io.EOF {
			err = errors.New("payload cut short")
		}
		return 0, 0, err
	}
	if crc(p) != r.dataCRC {
		return 0, 0, errors.New("checksum mismatch")
	}
	chunks, err := parseIndex(p, s.shift)
	if err != nil {
		return 0, 0, err
	}
	for _, ops := range chunks {
		for _, o := range ops {
			if o.kind != opClip && (o.off+int64(o.rlen) > off || o.gen >= r.gen) {
				return 0, 0, errors.New("entry points past the checkpoint")
			}
		}
	}
	s.chunks = chunks
	s.size, s.psize = int64(r.arg), int64(r.arg)
	return r.gen, end, nil
}

// findRecord returns the first record header in [from, end) that parses.
func (s *state) findRecord(ctx context.Context, from, end int64, salt uint32, shift uint8) (rec, int64, bool, error) {
	var found rec
	var at int64
	ok := false
	_, err := s.scanWith(ctx, from, end, salt, shift, func(r srec) bool {
		found, at, ok = r.r, r.off, true
		return false
	})
	return found, at, ok, err
}

// scan returns the records in [from, end) (see scanWith).
func (s *state) scan(ctx context.Context, from, end int64, fn func(srec)) ([]srec, error) {
	var out []srec
	_, err := s.scanWith(ctx, from, end, s.salt, s.shift, func(r srec) bool {
		out = append(out, r)
		if fn != nil {
			fn(r)
		}
		return true
	})
	return out, err
}

// scanWith walks the log in [from, end): a record whose header parses is
// taken whole and skipped; anything else (a torn record, garbage) is passed
// byte by byte until the next record magic. Payload checksums are checked.
// It returns the number of bytes skipped as garbage.
func (s *state) scanWith(ctx context.Context, from, end int64, salt uint32, shift uint8, fn func(srec) bool) (int64, error) {
	buf := make([]byte, 0, max(min(scanBlock, end-from), recHdrSize))
	var bstart int64 // file offset of buf[0]
	var skipped int64
	fill := func(at int64) error {
		n := max(min(int64(cap(buf)), end-at), 0)
		buf = buf[:n]
		k, err := s.lower.ReadAt(ctx, buf, at)
		if err != nil && err != io.EOF {
			return err
		}
		buf = buf[:k]
		bstart = at
		return nil
	}
	if err := fill(from); err != nil {
		return 0, err
	}
	p := from
	next := from // where the next record should start
	for p+recHdrSize <= end {
		if p < bstart || p+recHdrSize > bstart+int64(len(buf)) {
			if err := fill(p); err != nil {
				return skipped, err
			}
			if int64(len(buf)) < recHdrSize {
				break
			}
		}
		b := buf[p-bstart:]
		r, err := parseRec(b, salt, shift)
		if err != nil && salt != 0 && (p == next || [4]byte(b[:4]) == recMagic) {
			// One flipped bit in a header: the record is still placed
			// (its chunk reads as EIO) rather than lost.
			if fixed, ok := fixRecHeader(b, salt, shift); ok {
				r, err = fixed, nil
			}
		}
		if err == nil {
			rend := p + recHdrSize + int64(r.encLen)
			if rend <= end {
				if rend > bstart+int64(len(buf)) {
					if err := fill(p); err != nil {
						return skipped, err
					}
					b = buf[p-bstart:]
				}
				if int64(len(b)) >= rend-p {
					payload := b[recHdrSize : rend-p]
					ok := crc(payload) == r.dataCRC
					if !fn(srec{r: r, off: p, crcOK: ok}) {
						return skipped, nil
					}
					if ok {
						p, next = rend, rend
						continue
					}
					// A payload that does not check may be a record torn
					// by a crash whose space later records reused: look
					// for records inside it rather than skip them.
				}
			}
		}
		// Not a record here: look for the next magic.
		i := bytes.Index(b[1:], recMagic[:])
		if i < 0 {
			adv := max(int64(len(b))-3, 1)
			skipped += adv
			p += adv
			continue
		}
		skipped += int64(i + 1)
		p += int64(i + 1)
	}
	return skipped, nil
}

// replay applies records in generation order. Among copies of one
// generation (left by compaction), one whose payload checks wins.
func (s *state) replay(recs []srec) {
	sort.SliceStable(recs, func(i, j int) bool {
		if recs[i].r.gen != recs[j].r.gen {
			return recs[i].r.gen < recs[j].r.gen
		}
		return recs[i].crcOK && !recs[j].crcOK
	})
	var last uint64
	for _, r := range recs {
		if r.r.gen == last {
			continue // a copy of the record just applied
		}
		last = r.r.gen
		s.apply(r.r, r.off)
	}
	s.size = s.psize
}

// apply updates the index for one record, as written or replayed.
func (s *state) apply(r rec, off int64) {
	rlen := uint32(recHdrSize) + r.encLen
	switch r.typ {
	case recChunk:
		c := int64(r.arg)
		s.chunks[c] = []op{{kind: opBase, off: off, rlen: rlen, gen: r.gen}}
		s.psize = max(s.psize, c*s.cs+int64(r.decLen))
	case recDelta:
		c := int64(r.arg)
		s.chunks[c] = append(s.chunks[c], op{kind: opDelta, off: off, rlen: rlen, gen: r.gen})
		s.psize = max(s.psize, c*s.cs+int64(r.aux)+int64(r.decLen))
	case recSize:
		if r.flags&flagReset != 0 {
			s.chunks = map[int64][]op{}
			s.psize = int64(r.arg)
		} else {
			s.setSize(int64(r.arg))
		}
	}
}

// setSize truncates (or extends) the index to n bytes, as a size record
// does: chunks past the end go, the chunk that holds the end is clipped.
func (s *state) setSize(n int64) {
	if n < s.psize {
		first := (n + s.cs - 1) / s.cs // first chunk wholly past the end
		for c := range s.chunks {
			if c >= first {
				delete(s.chunks, c)
			}
		}
		if n%s.cs != 0 {
			c := n / s.cs
			if ops, ok := s.chunks[c]; ok {
				s.chunks[c] = append(ops, op{kind: opClip, off: n % s.cs})
			}
		}
	}
	s.psize = n
}

// recount computes the live bytes.
func (s *state) recount() {
	s.live = 0
	for _, ops := range s.chunks {
		for _, o := range ops {
			if o.kind != opClip {
				s.live += int64(o.rlen)
			}
		}
	}
}

// ---- reading -------------------------------------------------------------

// span is a stretch of the lower file read at once: a chunk's base and
// deltas usually lie close together, and one read beats hundreds.
type span struct {
	off int64
	b   []byte
}

// readSpan reads the records of ops in one read when they lie within a few
// chunks of each other.
func (s *state) readSpan(ctx context.Context, ops []op) *span {
	if len(ops) < 3 {
		return nil
	}
	lo, hi := int64(-1), int64(0)
	for _, o := range ops {
		if o.kind == opClip {
			continue
		}
		if lo < 0 || o.off < lo {
			lo = o.off
		}
		hi = max(hi, o.off+int64(o.rlen))
	}
	if lo < 0 || hi-lo > 4*s.cs+(64<<10) {
		return nil
	}
	b := make([]byte, hi-lo)
	n, err := s.lower.ReadAt(ctx, b, lo)
	if err != nil && err != io.EOF {
		return nil
	}
	return &span{off: lo, b: b[:n]}
}

// readRecord reads the record an op names and checks it.
func (s *state) readRecord(ctx context.Context, c int64, o op, want uint8, sp *span) (rec, []byte, error) {
	var b []byte
	if sp != nil && o.off >= sp.off && o.off+int64(o.rlen) <= sp.off+int64(len(sp.b)) {
		b = sp.b[o.off-sp.off : o.off-sp.off+int64(o.rlen)]
	} else {
		b = make([]byte, o.rlen)
		n, err := s.lower.ReadAt(ctx, b, o.off)
		if err != nil && err != io.EOF {
			return rec{}, nil, err
		}
		if n < int(o.rlen) {
			return rec{}, nil, s.errorf(c, "record at %d is cut short", o.off)
		}
	}
	r, err := parseRec(b, s.salt, s.shift)
	if err != nil {
		return rec{}, nil, s.errorf(c, "record at %d: %v", o.off, err)
	}
	if r.typ != want || int64(r.arg) != c || r.gen != o.gen || recHdrSize+r.encLen != o.rlen {
		return rec{}, nil, s.errorf(c, "record at %d is not the one the index names", o.off)
	}
	p := b[recHdrSize:]
	if crc(p) != r.dataCRC {
		return rec{}, nil, s.errorf(c, "record at %d: checksum mismatch", o.off)
	}
	return r, p, nil
}

// decodeChunk builds chunk c's content from the log.
func (s *state) decodeChunk(ctx context.Context, c int64) ([]byte, error) {
	var buf []byte
	ops := s.chunks[c]
	sp := s.readSpan(ctx, ops)
	for _, o := range ops {
		switch o.kind {
		case opBase:
			r, p, err := s.readRecord(ctx, c, o, recChunk, sp)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, 0, s.cs)
			switch {
			case r.decLen == 0:
				if len(p) != 0 {
					return nil, s.errorf(c, "empty chunk with a payload")
				}
			case r.flags&flagRaw != 0:
				if len(p) != int(r.decLen) {
					return nil, s.errorf(c, "raw chunk length mismatch")
				}
				buf = append(buf, p...)
			default:
				dec, err := decoder(r.codec)
				if err != nil {
					return nil, s.errorf(c, "%v", err)
				}
				out, err := safeDecode(dec, buf, p, int(r.decLen))
				if err != nil {
					return nil, s.errorf(c, "%v", err)
				}
				buf = out
			}
		case opDelta:
			r, p, err := s.readRecord(ctx, c, o, recDelta, sp)
			if err != nil {
				return nil, err
			}
			buf = writeInto(buf, int(r.aux), p)
		case opClip:
			buf = buf[:min(int64(len(buf)), o.off)]
		}
	}
	return buf, nil
}

// safeDecode turns a decoder's panic into an error: a corrupt chunk must
// never take the daemon down.
func safeDecode(c Codec, dst, src []byte, n int) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("decoder failed: %v", r)
		}
	}()
	return c.Decode(dst, src, n)
}

// writeInto writes p at off in buf, growing it with zeros as needed.
func writeInto(buf []byte, off int, p []byte) []byte {
	if end := off + len(p); end > len(buf) {
		if end > cap(buf) {
			nb := make([]byte, len(buf), max(end, 2*cap(buf)))
			copy(nb, buf)
			buf = nb
		}
		clear(buf[len(buf):end])
		buf = buf[:end]
	}
	copy(buf[off:], p)
	return buf
}

// content returns chunk c's current content (not to be modified).
func (s *state) content(ctx context.Context, c int64) ([]byte, error) {
	if d := s.dirty[c]; d != nil {
		if err := s.loadDirty(ctx, c, d); err != nil {
			return nil, err
		}
		return d.buf, nil
	}
	if b, ok := s.cache[c]; ok {
		return b, nil
	}
	if _, ok := s.chunks[c]; !ok {
		return nil, nil
	}
	b, err := s.decodeChunk(ctx, c)
	if err != nil {
		return nil, err
	}
	s.remember(c, b)
	return b, nil
}

// loadDirty decodes dirty chunk c, if it is not loaded, and writes its changes
// over it.
func (s *state) loadDirty(ctx context.Context, c int64, d *dirty) error {
	if d.loaded {
		return nil
	}
	var b []byte
	if len(d.ext) == 1 && d.ext[0].lo == 0 && int64(d.ext[0].hi) == s.cs {
		// Written over whole: nothing of the log's content is left.
		b, d.whole = d.ext[0].b, true
	} else {
		var err error
		if b, err = s.decodeChunk(ctx, c); err != nil {
			return err
		}
		if b == nil {
			b = make([]byte, 0, s.cs)
		}
		d.orig = len(b)
		for _, e := range d.ext {
			b = writeInto(b, e.lo, e.b)
		}
	}
	for i := range d.ext {
		d.ext[i].b = nil
	}
	d.buf, d.loaded = b, true
	return nil
}

// maxDeltas is the number of deltas a chunk may carry before it is
// encoded whole: 256, and one per KiB of larger chunks, so that the
// encoding of a big chunk is spread over as many appends.
func (s *state) maxDeltas() int { return int(max(256, s.cs>>10)) }

// deltaable says whether dirty chunk c may be written as delta records,
// one per changed range, over its content in the log, rather than encoded
// whole: with fast tails, over a chunk that has content in the log, and
// while the chunk's deltas stay within maxDeltas, each under half a chunk
// and all together within a chunk's bytes (reading the chunk applies them
// all). An append that fills the chunk encodes it (fast tails).
func (s *state) deltaable(c int64, d *dirty) bool {
	ops, stored := s.chunks[c]
	if !s.fs.fastTails || d.whole || !stored || len(d.ext) == 0 {
		return false
	}
	if d.loaded && (d.orig == 0 || len(d.buf) < d.orig || len(d.buf) > d.orig && int64(len(d.buf)) >= s.cs) {
		return false
	}
	n, bytes := len(d.ext), 0
	for _, e := range d.ext {
		if int64(e.hi-e.lo) >= s.cs/2 {
			return false
		}
		bytes += e.hi - e.lo
	}
	for _, o := range ops {
		if o.kind == opDelta {
			n++
			bytes += int(o.rlen) - recHdrSize
		}
	}
	return n <= s.maxDeltas() && int64(bytes) <= s.cs
}

// maxDirty is the number of dirty chunks a file may hold.
func (s *state) maxDirty() int { return max(4, int(maxDirtyBytes/s.cs)) }

func (s *state) remember(c int64, b []byte) {
	if len(s.cache) >= max(4, int(maxCacheBytes/s.cs)) {
		for k := range s.cache { // any one: map order is random
			delete(s.cache, k)
			break
		}
	}
	s.cache[c] = b
}

func (s *state) readAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off >= s.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), s.size-off))
	for done := 0; done < n; {
		c := (off + int64(done)) / s.cs
		in := int((off + int64(done)) % s.cs)
		k := min(n-done, int(s.cs)-in)
		b, err := s.content(ctx, c)
		if err != nil {
			return done, err
		}
		dst := p[done : done+k]
		m := 0
		if in < len(b) {
			m = copy(dst, b[in:])
		}
		clear(dst[m:])
		done += k
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// ---- writing -------------------------------------------------------------

// dirtyChunk returns chunk c for changing; with load, its content is in
// buf. Without, a chunk the log holds and that is not decoded is not
// decoded now (see dirty).
func (s *state) dirtyChunk(ctx context.Context, c int64, load bool) (*dirty, error) {
	s.clock++
	d := s.dirty[c]
	if d == nil {
		_, stored := s.chunks[c]
		_, cached := s.cache[c]
		if stored && !cached && !load && s.fs.fastTails {
			d = &dirty{}
		} else {
			b, err := s.content(ctx, c)
			if err != nil {
				return nil, err
			}
			// The decoded chunk becomes the dirty one: cached chunks
			// are owned by the state (readers copy out of them), so it
			// moves without a copy, which matters to appends (a copy of
			// a whole chunk each time).
			delete(s.cache, c)
			if b == nil {
				b = make([]byte, 0, s.cs)
			}
			d = &dirty{buf: b, loaded: true, orig: len(b), whole: !stored}
		}
		s.dirty[c] = d
	}
	d.used = s.clock
	if load {
		if err := s.loadDirty(ctx, c, d); err != nil {
			return nil, err
		}
	}
	return d, nil
}

func (s *state) writeAt(ctx context.Context, p []byte, off int64) (int, error) {
	s.stampOK = false // the lower changes: restamp says when it is known again
	if s.ro {
		return 0, errReadOnly
	}
	if off < 0 || off+int64(len(p)) > maxFileSize {
		return 0, errFileTooBig
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		c, in := pos/s.cs, int(pos%s.cs)
		k := min(len(p)-done, int(s.cs)-in)
		d, err := s.dirtyChunk(ctx, c, false)
		if err != nil {
			return done, err
		}
		if !d.whole && len(d.ext) >= s.maxDeltas() {
			// Too scattered for deltas: the chunk is encoded whole.
			if err := s.loadDirty(ctx, c, d); err != nil {
				return done, err
			}
			d.whole, d.ext = true, nil
		}
		if d.loaded {
			d.buf = writeInto(d.buf, in, p[done:done+k])
		}
		d.change(in, in+k, p[done:done+k])
		done += k
		s.size = max(s.size, pos+int64(k))
	}
	if len(s.dirty) > s.maxDirty() {
		if err := s.writeOldest(ctx); err != nil {
			return done, err
		}
	}
	return done, nil
}

// writeOldest writes the least recently changed half of the dirty chunks.
func (s *state) writeOldest(ctx context.Context) error {
	cs := make([]int64, 0, len(s.dirty))
	for c := range s.dirty {
		cs = append(cs, c)
	}
	sort.Slice(cs, func(i, j int) bool { return s.dirty[cs[i]].used < s.dirty[cs[j]].used })
	cs = cs[:len(cs)/2]
	slices.Sort(cs)
	return s.persist(ctx, cs)
}

// flushDirty writes every dirty chunk.
// flushDirty writes every dirty chunk, and the size if the chunks do not
// give it (a hole at the end).
func (s *state) flushDirty(ctx context.Context) error {
	s.stampOK = false // the lower changes: restamp says when it is known again
	if len(s.dirty) > 0 {
		cs := make([]int64, 0, len(s.dirty))
		for c := range s.dirty {
			cs = append(cs, c)
		}
		slices.Sort(cs)
		if err := s.persist(ctx, cs); err != nil {
			return err
		}
	}
	if s.size != s.psize {
		return s.writeSize(ctx)
	}
	return nil
}

// writeSize appends a size record for the current size.
func (s *state) writeSize(ctx context.Context) error {
	r := rec{typ: recSize, shift: s.shift, salt: s.salt, gen: s.nextGen, arg: uint64(s.size)}
	s.nextGen++
	off, err := s.appendRaw(ctx, appendRecord(nil, r, nil))
	if err != nil {
		s.nextGen-- // no generation without its record (see load)
		return err
	}
	s.apply(r, off)
	s.ckptRecs++
	s.ckptLen += recHdrSize
	return nil
}

// persist writes records for the given dirty chunks in one append.
func (s *state) persist(ctx context.Context, cs []int64) error {
	if err := s.initLog(ctx); err != nil {
		return err
	}
	var out []byte
	type placed struct {
		c   int64
		r   rec
		off int64
	}
	var done []placed
	// Which chunks are written as deltas, and the encodings of the
	// others, made in parallel (a flush of many chunks uses every core).
	delta := make([]bool, len(cs))
	encs := make([][]byte, len(cs))
	errs := make([]error, len(cs))
	for i, c := range cs {
		d := s.dirty[c]
		// The chunk may reach past the end after a truncation.
		lim := max(s.size-c*s.cs, 0)
		if d.loaded && int64(len(d.buf)) > lim {
			d.buf = d.buf[:lim]
			d.orig = min(d.orig, len(d.buf))
		}
		if d.loaded {
			d.clip(len(d.buf))
		} else {
			d.clip(int(min(lim, s.cs)))
		}
		// A chunk written from nothing (a file written and closed, as
		// cp and tar write them) is encoded at once, so that what is at
		// rest is compressed; a change to a chunk the log holds (an
		// append, a write in the middle) is written as deltas, until
		// the chunk carries too many (deltaable), then encoded whole.
		if delta[i] = s.deltaable(c, d); !delta[i] {
			if err := s.loadDirty(ctx, c, d); err != nil {
				return err
			}
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, c := range cs {
		d := s.dirty[c]
		if delta[i] || len(d.buf) == 0 {
			continue
		}
		if len(cs) == 1 {
			encs[i], errs[i] = s.fs.codec.Encode(nil, d.buf)
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			encs[i], errs[i] = s.fs.codec.Encode(nil, d.buf)
			<-sem
		}()
	}
	wg.Wait()
	for i, c := range cs {
		if errs[i] != nil {
			return fmt.Errorf("codec: encoding chunk %d of %s: %w", c, s.path, errs[i])
		}
	}
	gen0 := s.nextGen
	add := func(r rec, payload []byte) {
		r.shift, r.salt, r.gen = s.shift, s.salt, s.nextGen
		s.nextGen++
		off := s.logEnd + int64(len(out))
		out = appendRecord(out, r, payload)
		r.encLen = uint32(s.logEnd + int64(len(out)) - off - recHdrSize)
		done = append(done, placed{int64(r.arg), r, off})
	}
	for i, c := range cs {
		d := s.dirty[c]
		if delta[i] {
			// The changed bytes, unencoded, over the chunk's content.
			for _, e := range d.ext {
				b := e.b
				if d.loaded {
					b = d.buf[e.lo:e.hi]
				}
				add(rec{typ: recDelta, arg: uint64(c), aux: uint32(e.lo), decLen: uint32(e.hi - e.lo)}, b)
			}
			continue
		}
		r := rec{typ: recChunk, codec: s.fs.kind.ID, arg: uint64(c), decLen: uint32(len(d.buf))}
		enc := encs[i]
		if s.fs.kind.Shrinks && len(enc) >= len(d.buf) {
			enc, r.flags = d.buf, flagRaw
		}
		add(r, enc)
	}
	if err := s.appendLower(ctx, out, true); err != nil {
		s.nextGen = gen0
		return err
	}
	s.logEnd += int64(len(out))
	s.hdrStale = true
	for _, p := range done {
		s.applyLive(p.r, p.off)
	}
	for _, c := range cs {
		d := s.dirty[c]
		delete(s.dirty, c)
		if d.loaded && len(d.buf) > 0 {
			s.remember(c, d.buf)
		}
	}
	s.ckptRecs += len(done)
	s.ckptLen += int64(len(out))
	return nil
}

// applyLive applies a record just written, keeping the live count.
func (s *state) applyLive(r rec, off int64) {
	c := int64(r.arg)
	if r.typ == recChunk {
		for _, o := range s.chunks[c] {
			if o.kind != opClip {
				s.live -= int64(o.rlen)
			}
		}
	}
	s.live += recHdrSize + int64(r.encLen)
	s.apply(r, off)
}

var (
	errReadOnly   = errors.New("codec: the file's lower file is read-only here")
	errFileTooBig = errors.New("codec: file too big")
)

// initLog writes the header of an empty file.
func (s *state) initLog(ctx context.Context) error {
	if s.logEnd != 0 {
		return nil
	}
	// Both slots describe the empty log (no generation yet: the record
	// being appended, which may have taken one, is not there).
	s.hdrSeq = 1
	sl := s.slot()
	sl.size, sl.logEnd, sl.ckptOff, sl.gen = 0, headerSize, 0, 0
	b := append(sl.marshal(), sl.marshal()...)
	// Not flushed: a record follows at once, and its flush writes both.
	if err := s.appendLower(ctx, b, false); err != nil {
		return err
	}
	s.hdrSeq = 1
	s.logEnd = headerSize
	return nil
}

func (s *state) slot() slot {
	sl := slot{codec: s.fs.kind.ID, shift: s.shift, salt: s.salt, seq: s.hdrSeq, size: s.size,
		logEnd: s.logEnd, ckptOff: s.ckptOff, gen: s.nextGen - 1}
	if s.whole {
		sl.flags = slotWhole
	}
	return sl
}

// writeLower writes all of b at off in the lower file: a short count is an
// error even when the lower gives no reason (the application gets EIO).
// With flush (and outside a settle, which goes down the links of a chain
// one after the other: see Engine.Settle), the write is done when the
// lower has written it: a lower that is not the kernel's file (no
// layer.CapPassthrough) and may keep writes in memory (the next codec link
// of a chain) is flushed,
// so that its errors (a full disk) come here, before the caller commits
// what it wrote (a record to the index), not later, when the lower writes
// it out. Headers are written without (a header that does not reach the
// disk costs a replay of the log at the next open, nothing more, and a
// flush of each header would write the links below again for every link
// above: through 64 links a conversion of a 100-byte file took minutes).
func (s *state) writeLower(ctx context.Context, b []byte, off int64, flush bool) error {
	n, err := s.lower.WriteAt(ctx, b, off)
	if err == nil && n < len(b) {
		err = fmt.Errorf("codec: %s: short write to the lower file: %d of %d bytes at %d", s.path, n, len(b), off)
	}
	if err == nil && flush && s.lower.Caps()&layer.CapPassthrough == 0 && ctx.Value(settling{}) == nil {
		err = s.lower.Flush(ctx)
	}
	if err != nil {
		s.fs.log().Error("codec: write to the lower file failed", "path", s.path, "offset", off, "bytes", len(b), "written", n, "err", err)
	}
	return err
}

// appendLower writes b at the log's end. When that fails (a full disk),
// the file is cut back to the log's end: no part of records whose
// generations are taken back may stay in the log, where a later scan would
// take them for records. If even the cut fails, the file's tail is unknown
// and it takes no more writes until it is opened again (opening cuts a torn
// tail).
func (s *state) appendLower(ctx context.Context, b []byte, flush bool) error {
	if s.broken != nil {
		return s.broken
	}
	err := s.writeLower(ctx, b, s.logEnd, flush)
	if err == nil {
		return nil
	}
	if _, terr := s.lower.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(s.logEnd)}); terr != nil {
		s.broken = fmt.Errorf("codec: %s: an append failed (%v) and could not be cut off (%v): no more writes until the file is opened again", s.path, err, terr)
		s.fs.log().Error("codec: cannot cut a failed append", "path", s.path, "err", s.broken)
		return s.broken
	}
	return err
}

// appendRecords appends ready-made records.
func (s *state) appendRaw(ctx context.Context, b []byte) (int64, error) {
	if err := s.initLog(ctx); err != nil {
		return 0, err
	}
	off := s.logEnd
	if err := s.appendLower(ctx, b, true); err != nil {
		return 0, err
	}
	s.logEnd += int64(len(b))
	s.hdrStale = true
	return off, nil
}

// truncate sets the size: a size record is written at once, so that the
// log alone says which older bytes are gone.
func (s *state) truncate(ctx context.Context, n int64) error {
	s.stampOK = false // the lower changes: restamp says when it is known again
	if s.ro {
		return errReadOnly
	}
	if n < 0 || n > maxFileSize {
		return errFileTooBig
	}
	if n == s.size {
		return nil
	}
	if n == 0 {
		// Start the file afresh.
		if _, err := s.lower.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 0}); err != nil {
			return err
		}
		s.chunks = map[int64][]op{}
		s.dirty = map[int64]*dirty{}
		s.cache = map[int64][]byte{}
		s.size, s.psize, s.logEnd, s.live, s.ckptOff, s.ckptRecs, s.ckptLen, s.hdrSeq = 0, 0, 0, 0, 0, 0, 0, 0
		s.hdrStale, s.broken = false, nil
		// The log starts again at generation 1: nothing of the old one is left.
		s.nextGen, s.whole = 1, true
		return nil
	}
	if n < s.size {
		first := (n + s.cs - 1) / s.cs
		for c := range s.dirty {
			if c >= first {
				delete(s.dirty, c)
			}
		}
		for c := range s.cache {
			if c >= first {
				delete(s.cache, c)
			}
		}
		c := n / s.cs
		lim := int(n % s.cs)
		if d := s.dirty[c]; d != nil {
			if d.loaded {
				d.buf = d.buf[:min(len(d.buf), lim)]
				d.orig = min(d.orig, lim)
			}
			d.clip(lim) // the size record clips the log's content alike
		}
		if b, ok := s.cache[c]; ok && len(b) > lim {
			s.cache[c] = b[:lim]
		}
	}
	s.size = n
	if err := s.writeSize(ctx); err != nil {
		return err
	}
	s.recount() // live bytes of dropped chunks go
	return nil
}

// punch zeroes [off, off+n) within the file.
func (s *state) punch(ctx context.Context, off, n int64) error {
	s.stampOK = false // the lower changes: restamp says when it is known again
	end := min(off+n, s.size)
	for off < end {
		c, in := off/s.cs, int(off%s.cs)
		k := min(end-off, s.cs-int64(in))
		_, stored := s.chunks[c]
		if s.dirty[c] == nil && !stored {
			off += k // already a hole
			continue
		}
		if in == 0 && k == s.cs {
			// The whole chunk: no need to decode it.
			delete(s.cache, c)
			s.clock++
			s.dirty[c] = &dirty{buf: make([]byte, 0, s.cs), loaded: true, whole: true, used: s.clock}
			off += k
			continue
		}
		d, err := s.dirtyChunk(ctx, c, true)
		if err != nil {
			return err
		}
		if in < len(d.buf) {
			e := min(in+int(k), len(d.buf))
			clear(d.buf[in:e])
			if e == len(d.buf) {
				// Zeros at the end of a chunk need not be stored; but a
				// chunk shorter than the log's cannot be deltas over it
				// (the log's bytes past the end would come back).
				d.buf = d.buf[:in]
				if in < d.orig {
					d.whole, d.ext = true, nil
				}
				d.clip(in)
			} else {
				d.change(in, e, nil)
			}
		}
		off += k
	}
	if len(s.dirty) > s.maxDirty() {
		return s.writeOldest(ctx)
	}
	return nil
}

// ---- syncing -------------------------------------------------------------

// sync writes what is in memory; with durable, it makes the records
// durable before writing the header. It checkpoints when the log after the
// last checkpoint has grown, and compacts when dead records dominate.
func (s *state) sync(ctx context.Context, durable, mayCompact bool) error {
	s.stampOK = false // the lower changes: restamp says when it is known again
	if s.ro {
		return nil
	}
	if s.broken != nil {
		return s.broken
	}
	if err := s.flushDirty(ctx); err != nil {
		return err
	}
	if s.logEnd == 0 {
		return nil
	}
	if mayCompact && s.shouldCompact() {
		if err := s.compact(ctx); err != nil {
			s.fs.log().Error("codec: compaction failed", "path", s.path, "err", err)
			return err
		}
	}
	if s.checkpointDue() || s.needCkpt {
		if err := s.checkpoint(ctx); err != nil {
			return err
		}
	}
	if durable {
		if err := s.lower.Fsync(ctx, true); err != nil {
			return err
		}
	}
	if s.hdrStale {
		return s.writeHeader(ctx)
	}
	return nil
}

// order returns the chunk numbers in order.
func (s *state) order() []int64 {
	cs := make([]int64, 0, len(s.chunks))
	for c := range s.chunks {
		cs = append(cs, c)
	}
	slices.Sort(cs)
	return cs
}

// checkpointDue says when the records since the last checkpoint are worth
// a new one: when replaying them at open time would read more than a chunk
// and more than the checkpoint itself would take. The log thus holds at
// most about as many bytes of checkpoints as of other records, and small
// appends (fast tails) do not write an index every few records.
func (s *state) checkpointDue() bool {
	need := int64(recHdrSize+4) + int64(len(s.chunks))*indexEntrySize
	if s.ckptRecs < minCkptRecs || s.ckptLen < max(need, s.cs) {
		return false
	}
	for _, ops := range s.chunks {
		need += int64(len(ops)-1) * indexEntrySize // deltas and clips
	}
	return s.ckptLen >= need
}

// checkpoint appends an index record of the current state.
func (s *state) checkpoint(ctx context.Context) error {
	s.stampOK = false // the lower changes: restamp says when it is known again
	r := rec{typ: recIndex, shift: s.shift, salt: s.salt, gen: s.nextGen, arg: uint64(s.size)}
	s.nextGen++
	off, err := s.appendRaw(ctx, appendRecord(nil, r, marshalIndex(s.chunks, s.order())))
	if err != nil {
		s.nextGen--
		return err
	}
	s.ckptOff, s.ckptRecs, s.ckptLen, s.needCkpt = off, 0, 0, false
	return nil
}

// writeHeader writes the next header slot.
func (s *state) writeHeader(ctx context.Context) error {
	s.stampOK = false // the lower changes: restamp says when it is known again
	if s.broken != nil {
		return s.broken
	}
	s.hdrSeq++
	sl := s.slot()
	if err := s.writeLower(ctx, sl.marshal(), int64(sl.seq%2)*slotSize, false); err != nil {
		// The slot may be torn: the next try writes the same slot again,
		// not the other (sound) one.
		s.hdrSeq--
		return err
	}
	s.hdrStale = false
	return nil
}

// ---- compaction ----------------------------------------------------------

func (s *state) shouldCompact() bool {
	dead := s.logEnd - headerSize - s.live
	return dead > s.fs.compactMin && dead > s.live
}

// compact rewrites the live records at the front of the file. Phase one
// appends copies of them (new generations) and a reset record, so that the
// log at its end holds the whole file; phase two copies that block to the
// front and cuts the file after it. At every moment the log replays to the
// file's content: see docs/codec-format.md.
func (s *state) compact(ctx context.Context) error {
	s.stampOK = false // the lower changes: restamp says when it is known again
	e := s.logEnd
	// No generation may be given out without its record (see load): until
	// the copies are written, a failure takes them back.
	gen0, written := s.nextGen, false
	defer func() {
		if !written {
			s.nextGen = gen0
		}
	}()
	reset := rec{typ: recSize, flags: flagReset, shift: s.shift, salt: s.salt, gen: s.nextGen, arg: uint64(s.size)}
	s.nextGen++
	var block []byte
	newChunks := map[int64][]op{}
	for _, c := range s.order() {
		ops := s.chunks[c]
		gen := s.nextGen
		s.nextGen++
		off := e + int64(len(block))
		if len(ops) == 1 && ops[0].kind == opBase {
			// Copy the record as it is, with its new generation.
			b := make([]byte, ops[0].rlen)
			if n, err := s.lower.ReadAt(ctx, b, ops[0].off); n < len(b) {
				if err != nil && err != io.EOF {
					return err
				}
				return s.errorf(c, "record at %d is cut short", ops[0].off)
			}
			r, err := parseRec(b, s.salt, s.shift)
			if err != nil || r.typ != recChunk || int64(r.arg) != c || r.gen != ops[0].gen {
				return s.errorf(c, "record at %d does not match the index", ops[0].off)
			}
			r.gen = gen
			r.marshal(b)
			block = append(block, b...)
		} else {
			// Deltas and clips: fold them into one chunk record.
			buf, err := s.decodeChunk(ctx, c)
			if err != nil {
				return err
			}
			r := rec{typ: recChunk, codec: s.fs.kind.ID, shift: s.shift, salt: s.salt, gen: gen, arg: uint64(c), decLen: uint32(len(buf))}
			var enc []byte
			if len(buf) > 0 {
				if enc, err = s.fs.codec.Encode(nil, buf); err != nil {
					return err
				}
				if s.fs.kind.Shrinks && len(enc) >= len(buf) {
					enc, r.flags = buf, flagRaw
				}
			}
			block = appendRecord(block, r, enc)
		}
		rl := uint32(e + int64(len(block)) - off)
		newChunks[c] = []op{{kind: opBase, off: off, rlen: rl, gen: gen}}
	}
	block = appendRecord(block, reset, nil)
	// Phase one.
	if err := s.appendLower(ctx, block, true); err != nil {
		return err
	}
	written = true
	s.logEnd = e + int64(len(block))
	s.chunks = newChunks
	s.recount()
	s.hdrStale = true
	if err := s.lower.Fsync(ctx, true); err != nil {
		return err
	}
	if err := s.checkpoint(ctx); err != nil {
		return err
	}
	if err := s.writeHeader(ctx); err != nil {
		return err
	}
	// Phase two: the block and a checkpoint fit before e, where everything
	// is dead.
	nops := 0
	for _, ops := range s.chunks {
		nops += len(ops)
	}
	if headerSize+int64(len(block))+recHdrSize+4+int64(nops)*indexEntrySize > e {
		return nil
	}
	if err := s.writeLower(ctx, block, headerSize, true); err != nil {
		return err
	}
	for c, ops := range s.chunks {
		ops[0].off = ops[0].off - e + headerSize
		s.chunks[c] = ops
	}
	s.logEnd = headerSize + int64(len(block))
	if err := s.checkpoint(ctx); err != nil {
		return err
	}
	if err := s.lower.Fsync(ctx, true); err != nil {
		return err
	}
	if err := s.writeHeader(ctx); err != nil {
		return err
	}
	if _, err := s.lower.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(s.logEnd)}); err != nil {
		return err
	}
	s.fs.log().Debug("codec: compacted", "path", s.path, "from", e, "to", s.logEnd)
	return nil
}

func (fs *Engine) newSalt() uint32 {
	if fs.salt != 0 {
		return fs.salt
	}
	for {
		if v := rand.Uint32(); v != 0 {
			return v
		}
	}
}

func (fs *Engine) log() *slog.Logger {
	if fs.logger != nil {
		return fs.logger
	}
	return slog.Default()
}
