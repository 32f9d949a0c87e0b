package crypt

import (
	"bytes"
	"context"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"syscall"

	"cairnfs.dev/cairn/layer"
)

// The journal of in-place rewrites. A block of the lower file that is
// rewritten in place (a write into an existing block, the old last block
// when the file grows, the new last block of a truncation) is written by one
// pwrite that a crash can cut in the middle (a killed process stops between
// two pages): the block would then be half old, half new, and would never
// authenticate again, losing data that an earlier fsync had acknowledged.
// So before such a write the old sealed blocks, and the lower size, go to
// the file's journal, .cairn-journal/<inode> at the root of the lower
// layer, overwritten by each such write. The journal is removed when the
// file's last handle is released; one found when the file is next opened
// (after a crash) is replayed: if the blocks it names, or the file's last
// block, do not authenticate, the old blocks are written back and the file
// cut to its old size (the interrupted write is lost, as unsynced data may
// be). A journal record is sealed data of the file itself: it cannot make
// the layer return anything the file did not hold (docs/crypt.md).
//
// The journal is not fsync'ed before the block is rewritten (that would
// cost an fsync per write): it covers a crash of the process (kill -9, an
// out-of-memory kill), when the kernel keeps every page that was written;
// after a power failure a block rewritten since the last fsync can still
// be torn.
//
// Each write's entry goes at the next 4 KiB boundary of a 1 MiB ring
// (rewriting one page again and again would wait for its writeback); the
// entry with the highest sequence number is the last. Entry format:
// "cairnj01" sequence(8) fileID(16) lowerSize(8) count(4) then count
// records block(8) length(4) sealed bytes, then SHA-256 of all that (an
// entry torn by a crash while it was written is ignored: the file was not
// touched yet).

const (
	journalDir   = ".cairn-journal"
	journalMagic = "cairnj01"
	maxJournal   = 64 << 20
	journalRing  = 1 << 20
)

// journalPath is the journal of the file whose lower identity is id: its
// inode number in hex, and, for a file of another file system than the
// lower's root (one mounted inside the lower) or of another branch, its
// device and branch too, so that two files with equal inode numbers never
// share a journal.
func (fs *Content) journalPath(id layer.ID) string {
	n := strconv.FormatUint(id.Ino, 16)
	if id.Dev != fs.root.Dev || id.Branch != fs.root.Branch {
		n += "-" + strconv.FormatUint(id.Dev, 16) + "-" + strconv.FormatUint(id.Branch, 16)
	}
	return journalDir + "/" + n
}

// jrec is a run of sealed blocks from block blk on.
type jrec struct {
	blk    int64
	sealed []byte
}

// loadPending notes the journals left by a crash (at New).
func (fs *Content) loadPending(ctx context.Context) {
	ents, err := fs.Lower.ReadDir(ctx, journalDir, false)
	if err != nil {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, e := range ents {
		if fs.pending == nil {
			fs.pending = map[string]bool{}
		}
		fs.pending[journalDir+"/"+e.Name] = true
	}
}

func (fs *Content) pendingJournal(id layer.ID) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.pending[fs.journalPath(id)]
}

// writeJournal replaces the file's journal (the caller holds st.mu).
func (f *file) writeJournal(ctx context.Context, id []byte, lowerSize int64, recs []jrec) error {
	st := f.st
	if f.fs.noJournal {
		return nil
	}
	// The journal is the layer's own file, made as the daemon: the caller
	// may be any user who can write the file.
	ctx = layer.AsSelf(ctx)
	if st.jf == nil {
		p := f.fs.journalPath(st.ino)
		jf, _, err := f.fs.Lower.Create(ctx, p, syscall.O_RDWR|syscall.O_TRUNC, 0o600)
		if errors.Is(err, syscall.ENOENT) {
			if _, err = f.fs.Lower.Mkdir(ctx, journalDir, 0o700); err == nil || errors.Is(err, syscall.EEXIST) {
				jf, _, err = f.fs.Lower.Create(ctx, p, syscall.O_RDWR|syscall.O_TRUNC, 0o600)
			}
		}
		if err != nil {
			return err
		}
		st.jf, st.jpos = jf, 0
	}
	bp := getBuf(0)
	defer putBuf(bp)
	st.jseq++
	b := appendJournal((*bp)[:0], st.jseq, id, lowerSize, recs)
	*bp = b
	if st.jpos+int64(len(b)) > journalRing {
		st.jpos = 0
	}
	_, err := writeFull(ctx, st.jf, b, st.jpos)
	st.jpos = (st.jpos + int64(len(b)) + 4095) &^ 4095
	return err
}

// journalBytes encodes a journal entry.
func journalBytes(seq uint64, id []byte, lowerSize int64, recs []jrec) []byte {
	return appendJournal(nil, seq, id, lowerSize, recs)
}

func appendJournal(b []byte, seq uint64, id []byte, lowerSize int64, recs []jrec) []byte {
	b = append(b, journalMagic...)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = append(b, id...)
	b = binary.BigEndian.AppendUint64(b, uint64(lowerSize))
	b = binary.BigEndian.AppendUint32(b, uint32(len(recs)))
	for _, r := range recs {
		b = binary.BigEndian.AppendUint64(b, uint64(r.blk))
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.sealed)))
		b = append(b, r.sealed...)
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

// lastEntry returns the journal's entry of highest sequence number.
func lastEntry(b []byte) (id []byte, lowerSize int64, recs []jrec, ok bool) {
	var best uint64
	for off := 0; off < len(b); off += 4096 {
		seq, i, l, r, good := parseJournal(b[off:])
		if good && (!ok || seq > best) {
			best, id, lowerSize, recs, ok = seq, i, l, r, true
		}
	}
	return id, lowerSize, recs, ok
}

// parseJournal reads a journal entry; ok is false if it is torn or not one.
func parseJournal(b []byte) (seq uint64, id []byte, lowerSize int64, recs []jrec, ok bool) {
	h := len(journalMagic) + 8 + fileIDSize + 12
	if len(b) < h+sha256.Size || string(b[:len(journalMagic)]) != journalMagic {
		return 0, nil, 0, nil, false
	}
	seq = binary.BigEndian.Uint64(b[len(journalMagic):])
	id = b[len(journalMagic)+8 : len(journalMagic)+8+fileIDSize]
	lowerSize = int64(binary.BigEndian.Uint64(b[h-12:]))
	count := binary.BigEndian.Uint32(b[h-4:])
	pos := h
	for i := uint32(0); i < count; i++ {
		if len(b)-pos < 12 {
			return 0, nil, 0, nil, false
		}
		blk := int64(binary.BigEndian.Uint64(b[pos:]))
		n := int(binary.BigEndian.Uint32(b[pos+8:]))
		pos += 12
		if n > len(b)-pos || blk < 0 {
			return 0, nil, 0, nil, false
		}
		recs = append(recs, jrec{blk: blk, sealed: b[pos : pos+n]})
		pos += n
	}
	if len(b)-pos < sha256.Size || lowerSize < 0 {
		return 0, nil, 0, nil, false
	}
	sum := sha256.Sum256(b[:pos])
	if !bytes.Equal(sum[:], b[pos:pos+sha256.Size]) {
		return 0, nil, 0, nil, false
	}
	return seq, id, lowerSize, recs, true
}

// recoverJournal replays the journal a crash left for this file, whose
// lower path is lp (the caller holds st.mu), then removes it.
func (f *file) recoverJournal(ctx context.Context, lp string) error {
	// The journal is the layer's own file, not the caller's.
	ctx = layer.AsSelf(ctx)
	fs, c, st := f.fs, f.fs.c, f.st
	p := fs.journalPath(st.ino)
	defer func() {
		fs.mu.Lock()
		delete(fs.pending, p)
		fs.mu.Unlock()
	}()
	jf, err := fs.Lower.Open(ctx, p, syscall.O_RDONLY)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	a, err := jf.Getattr(ctx)
	if err != nil || a.Size > maxJournal {
		jf.Release(ctx)
		return err
	}
	b := make([]byte, a.Size)
	n, err := readFull(ctx, jf, b, 0)
	jf.Release(ctx)
	if err != nil {
		return err
	}
	jid, oldLower, recs, ok := lastEntry(b[:n])
	done := func() error {
		if st.jf != nil {
			st.jf.Release(ctx)
			st.jf = nil
		}
		return fs.Lower.Unlink(ctx, p)
	}
	if !ok {
		return done()
	}
	id, aead, err := f.loadKey(ctx, nil)
	if err != nil || !bytes.Equal(id, jid) {
		// Empty, damaged, or another file now (a new ID): not ours.
		st.setKey(nil, nil)
		return done()
	}
	st.sized = false
	st.setHoles(holesUnknown)
	if f.journalOK(ctx, aead, id, recs) {
		return done()
	}
	// This open may be read-only: the repair has a handle of its own.
	w, err := fs.Lower.Open(ctx, lp, syscall.O_RDWR)
	if err != nil {
		return fmt.Errorf("crypt: /%s: cannot open it to undo a write a crash interrupted: %w", f.path, err)
	}
	defer w.Release(ctx)
	for _, r := range recs {
		if _, err := writeFull(ctx, w, r.sealed, c.blockOffset(uint64(r.blk))); err != nil {
			return err
		}
	}
	if _, err := w.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(oldLower)}); err != nil {
		return err
	}
	st.sized = false
	st.setHoles(holesUnknown)
	if err := w.Fsync(ctx, false); err != nil {
		return err
	}
	slog.Warn("crypt: a write interrupted by a crash was undone from the journal", "file", "/"+f.path, "journal", p)
	return done()
}

// journalOK reports whether the blocks a journal names, and the file's
// last block, authenticate where they are: the interrupted write was
// complete, or had not begun.
func (f *file) journalOK(ctx context.Context, aead cipher.AEAD, id []byte, recs []jrec) bool {
	c := f.fs.c
	a, err := f.lower.Getattr(ctx)
	if err != nil {
		return false
	}
	size, ok := c.plainSize(a.Size)
	if !ok {
		return false
	}
	if size == 0 {
		return true
	}
	final := int64(size-1) / int64(c.bs)
	pp := getBuf(c.bs)
	defer putBuf(pp)
	check := func(blk int64) bool {
		_, err := f.readBlock(ctx, (*pp)[:0], id, aead, blk, blk == final)
		return err == nil
	}
	if !check(final) {
		return false
	}
	for _, r := range recs {
		nb := int64((len(r.sealed) + c.cbs - 1) / c.cbs)
		for blk := r.blk; blk < r.blk+nb && blk <= final; blk++ {
			if !check(blk) {
				return false
			}
		}
	}
	return true
}
