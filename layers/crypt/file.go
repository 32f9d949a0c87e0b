package crypt

import (
	"cmp"
	"context"
	"crypto/cipher"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// fileState is shared by all open files of one lower inode (hard links and
// renames keep it): the lock that orders reads and writes, the file's ID and
// key, and its size while it is open.
type fileState struct {
	mu   sync.RWMutex // readers: ReadAt; writers: everything that changes the file
	refs int          // guarded by FS.mu
	ino  layer.ID

	hmu   sync.Mutex // guards id, aead and holes (set by readers too)
	id    []byte     // nil: not known yet (or the file is empty)
	aead  cipher.AEAD
	holes byte // holesUnknown, holesNone or holesMaybe: the mark of the last block

	jf   layer.File // the journal file of in-place rewrites (journal.go); guarded by mu
	jpos int64      // where its next entry goes
	jseq uint64     // the sequence number of its last entry

	size  int64 // plaintext size; valid when sized (guarded by mu, written with mu held)
	sized bool
}

func (s *fileState) key() ([]byte, cipher.AEAD) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	return s.id, s.aead
}

func (s *fileState) setKey(id []byte, a cipher.AEAD) {
	s.hmu.Lock()
	s.id, s.aead = id, a
	if id == nil {
		s.holes = holesUnknown
	}
	s.hmu.Unlock()
}

func (s *fileState) getHoles() byte {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	return s.holes
}

func (s *fileState) setHoles(h byte) {
	s.hmu.Lock()
	s.holes = h
	s.hmu.Unlock()
}

func (fs *Content) state(ino layer.ID) *fileState {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	s := fs.files[ino]
	if s == nil {
		s = &fileState{ino: ino}
		fs.files[ino] = s
	}
	s.refs++
	return s
}

func (fs *Content) unref(ctx context.Context, s *fileState) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if s.refs--; s.refs == 0 {
		delete(fs.files, s.ino)
		// No write of this file is under way: its journal is done.
		if s.jf != nil {
			s.jf.Release(ctx)
			s.jf = nil
			fs.Lower.Unlink(layer.AsSelf(ctx), fs.journalPath(s.ino))
		}
	}
}

// file is an open regular file of the crypt layer.
type file struct {
	fs     *Content
	lower  layer.File
	st     *fileState
	path   string // plaintext, at open, for error messages
	append bool
	seq    atomic.Bool // the lower was told that reads are sequential
}

var _ layer.File = (*file)(nil)

// lowerFlags are the flags the lower file is opened with: always readable
// (partial blocks are read, changed and written back), never O_APPEND (the
// layer places every block itself), no O_TRUNC (done under the file's
// lock), no O_DIRECT (blocks are not aligned).
func lowerFlags(flags int) int {
	flags &^= unix.O_APPEND | unix.O_TRUNC | layer.ODirect | unix.O_CREAT | unix.O_EXCL
	if flags&unix.O_ACCMODE == unix.O_WRONLY {
		flags = flags&^unix.O_ACCMODE | unix.O_RDWR
	}
	return flags
}

func (fs *FS) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return nil, err
	}
	return fs.t.open(ctx, lp, path, flags)
}

// Open opens the stored file at lp (layer.Transform); path is its name.
func (fs *Content) Open(ctx context.Context, lp, path string, flags int) (layer.File, error) {
	return fs.open(ctx, lp, path, flags)
}

func (fs *Content) open(ctx context.Context, lp, path string, flags int) (*file, error) {
	lf, err := fs.Lower.Open(ctx, lp, lowerFlags(flags))
	if errors.Is(err, syscall.EACCES) && flags&unix.O_ACCMODE == unix.O_WRONLY {
		// A write-only file: partial blocks will fail, whole ones work.
		lf, err = fs.Lower.Open(ctx, lp, lowerFlags(flags)&^unix.O_ACCMODE|unix.O_WRONLY)
	}
	if err != nil {
		return nil, err
	}
	a, err := lf.Getattr(ctx)
	if err != nil {
		lf.Release(ctx)
		return nil, err
	}
	return fs.newFile(ctx, path, lp, lf, &a, flags)
}

func (fs *Content) newFile(ctx context.Context, path, lp string, lf layer.File, a *layer.Attr, flags int) (*file, error) {
	if a.IsRegular() {
		if _, ok := fs.c.plainSize(a.Size); !ok {
			lf.Release(ctx)
			return nil, corruptf("/"+path, "the file's size (%d bytes below) is not that of a whole number of blocks: truncated", a.Size)
		}
	}
	f := &file{fs: fs, lower: lf, st: fs.state(a.ID()), path: path, append: flags&unix.O_APPEND != 0}
	if a.IsRegular() && fs.pendingJournal(a.ID()) {
		f.st.mu.Lock()
		err := f.recoverJournal(ctx, lp)
		f.st.mu.Unlock()
		if err != nil {
			f.Release(ctx)
			return nil, err
		}
	}
	if flags&unix.O_TRUNC != 0 && flags&unix.O_ACCMODE != unix.O_RDONLY && a.IsRegular() {
		f.st.mu.Lock()
		err := f.truncate(ctx, 0)
		f.st.mu.Unlock()
		if err != nil {
			f.Release(ctx)
			return nil, err
		}
		a.Size = 0
	}
	return f, nil
}

func (fs *FS) Create(ctx context.Context, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	lp, _, long, err := fs.lowerEntry(ctx, path)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	if err := fs.writeLong(ctx, lp, long); err != nil {
		return nil, layer.Attr{}, err
	}
	lf, a, err := fs.Lower.Create(ctx, lp, lowerFlags(flags)|flags&unix.O_EXCL, mode)
	if err != nil {
		if !errors.Is(err, syscall.EEXIST) {
			fs.dropLong(ctx, lp, long)
		}
		return nil, a, err
	}
	return fs.t.created(ctx, lp, path, lf, a, flags)
}

// Create creates the stored file at lp (layer.Transform); path is its
// name.
func (fs *Content) Create(ctx context.Context, lp, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	lf, a, err := fs.Lower.Create(ctx, lp, lowerFlags(flags)|flags&unix.O_EXCL, mode)
	if err != nil {
		return nil, a, err
	}
	return fs.created(ctx, lp, path, lf, a, flags)
}

func (fs *Content) created(ctx context.Context, lp, path string, lf layer.File, a layer.Attr, flags int) (layer.File, layer.Attr, error) {
	f, err := fs.newFile(ctx, path, lp, lf, &a, flags)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	fs.Stat(ctx, lp, &a)
	return f, a, nil
}

// --- sizes and keys (callers hold st.mu) ---

// size returns the plaintext size; the caller holds st.mu for writing.
func (f *file) size(ctx context.Context) (int64, error) {
	s := f.st
	if s.sized {
		return s.size, nil
	}
	a, err := f.lower.Getattr(ctx)
	if err != nil {
		return 0, err
	}
	p, ok := f.fs.c.plainSize(a.Size)
	if !ok {
		return 0, corruptf("/"+f.path, "the file's size (%d bytes below) is not that of a whole number of blocks: truncated", a.Size)
	}
	s.size, s.sized = int64(p), true
	return s.size, nil
}

func (f *file) setSize(n int64) { f.st.size, f.st.sized = n, true }

// loadKey reads the header of a non-empty file when its key is not known.
func (f *file) loadKey(ctx context.Context, h []byte) ([]byte, cipher.AEAD, error) {
	if id, a := f.st.key(); id != nil {
		return id, a, nil
	}
	if h == nil {
		h = make([]byte, headerSize)
		n, err := readFull(ctx, f.lower, h, 0)
		if err != nil {
			return nil, nil, err
		}
		if n == 0 {
			return nil, nil, io.EOF
		}
		h = h[:n]
	}
	id, _, err := parseHeader(h)
	if err != nil {
		return nil, nil, corruptf("/"+f.path, "%v", err)
	}
	a := f.fs.c.fileAEAD(id)
	f.st.setKey(id, a)
	return id, a, nil
}

// --- buffers ---

var bufPool sync.Pool

func getBuf(n int) *[]byte {
	if b, ok := bufPool.Get().(*[]byte); ok && cap(*b) >= n {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, max(n, 132<<10))
	return &b
}

func putBuf(b *[]byte) { bufPool.Put(b) }

// --- reading ---

func (f *file) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if off < 0 {
		return 0, syscall.EINVAL
	}
	f.st.mu.RLock()
	defer f.st.mu.RUnlock()
	c := f.fs.c
	bs, cbs := int64(c.bs), c.cbs
	b0, b1 := off/bs, (off+int64(len(p))-1)/bs
	// One byte more than the blocks asked for says whether the last of
	// them is the file's last.
	clen := int(b1-b0+1)*cbs + 1
	cstart := c.blockOffset(uint64(b0))
	id, aead := f.st.key()
	withHeader := id == nil && b0 == 0
	if withHeader {
		cstart, clen = 0, clen+headerSize
	}
	bp := getBuf(clen)
	defer putBuf(bp)
	buf := *bp
	if len(p) >= readaheadMin && !f.seq.Swap(true) {
		if fd, ok := f.lower.PassthroughFd(); ok {
			adviseSequential(fd)
			unix.Close(fd)
		}
	}
	n, err := readFull(ctx, f.lower, buf, cstart)
	if err != nil {
		return 0, err
	}
	if id == nil {
		var h []byte
		if withHeader {
			if n == 0 {
				return 0, io.EOF
			}
			h, buf, n = buf[:min(n, headerSize)], buf[min(n, headerSize):], n-min(n, headerSize)
		}
		if id, aead, err = f.loadKey(ctx, h); err != nil {
			if err == io.EOF {
				return 0, io.EOF
			}
			return 0, err
		}
	}
	// Plan the blocks, then open them (in parallel when there are many):
	// whole blocks straight into p, the partial first or last through a
	// scratch buffer.
	type plan struct {
		sealed []byte
		dst    []byte // where the plaintext goes (cap: its size)
		direct bool   // dst is in p
		skip   int    // of a scratch block: bytes before the part asked for
		pOff   int    // where its part goes in p
		last   bool
	}
	ps := make([]plan, 0, b1-b0+1)
	total, pos, skip := 0, 0, int(off-b0*bs)
	var scratch [2]*[]byte
	for blk := b0; blk <= b1 && pos < n; blk++ {
		avail := n - pos
		cl := min(avail, cbs)
		sealed := buf[pos : pos+cl]
		pos += cl
		last := avail <= cbs
		pl := cl - c.overhead()
		if pl <= 0 {
			return 0, corruptf("/"+f.path, "block %d is truncated", blk)
		}
		pn := plan{sealed: sealed, last: last, pOff: total, skip: skip}
		if skip == 0 && len(p)-total >= pl {
			pn.dst, pn.direct = p[total:total:total+pl], true
			total += pl
		} else {
			k := 0
			if scratch[0] != nil {
				k = 1
			}
			scratch[k] = getBuf(c.bs)
			defer putBuf(scratch[k])
			pn.dst = (*scratch[k])[:0]
			total += min(max(pl-skip, 0), len(p)-total)
		}
		ps = append(ps, pn)
		skip = 0
		if last {
			break
		}
	}
	err = parallel(len(ps), func(i int) error {
		pn := &ps[i]
		blk := b0 + int64(i)
		out, err := f.openBlock(ctx, aead, id, pn.dst, pn.sealed, blk, pn.last)
		if err != nil {
			return err
		}
		if !pn.direct && pn.skip < len(out) {
			copy(p[pn.pOff:], out[pn.skip:])
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if total < len(p) {
		return total, io.EOF
	}
	return total, nil
}

// parallel runs fn(0..n-1), in a few goroutines when n is large, and
// returns the first error.
func parallel(n int, fn func(i int) error) error {
	const minPer = 16
	w := min(runtime.GOMAXPROCS(0), 4, n/minPer)
	if w < 2 {
		for i := 0; i < n; i++ {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	}
	errs := make([]error, w)
	var wg sync.WaitGroup
	for k := 0; k < w; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			for i := k * n / w; i < (k+1)*n/w; i++ {
				if err := fn(i); err != nil {
					errs[k] = err
					return
				}
			}
		}(k)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// readaheadMin is the size of read that looks like streaming: the lower
// file is then told that reads are sequential (a larger readahead window),
// so that reading ciphertext from the disk overlaps decrypting it.
const readaheadMin = 128 << 10

func (f *file) blockError(blk int64, last bool) error {
	if last {
		return corruptf("/"+f.path, "block %d (the last) does not authenticate: changed, moved or truncated", blk)
	}
	return corruptf("/"+f.path, "block %d does not authenticate: changed, moved or cut", blk)
}

// openBlock returns the plaintext of sealed block blk (appended to dst,
// whose capacity must hold a block). The last block opens with either
// last mark, which tells whether the file may have holes; another block
// that is all zeros is a hole, and reads as zeros, only when the file's
// authenticated last block says that it may have holes.
func (f *file) openBlock(ctx context.Context, aead cipher.AEAD, id, dst, sealed []byte, blk int64, last bool) ([]byte, error) {
	c := f.fs.c
	if last {
		h := f.st.getHoles()
		for _, mark := range []byte{markLast, markLastSparse} {
			if h != holesUnknown && mark != h {
				continue
			}
			if out, err := c.open(aead, dst, sealed, id, uint64(blk), mark); err == nil {
				f.st.setHoles(mark)
				return out, nil
			}
		}
		return nil, f.blockError(blk, true)
	}
	if out, err := c.open(aead, dst, sealed, id, uint64(blk), markInner); err == nil {
		return out, nil
	}
	if c.isHole(sealed) {
		h, err := f.learnHoles(ctx, aead, id)
		if err != nil {
			return nil, err
		}
		if h == holesMaybe {
			out := dst[:len(dst)+c.bs]
			clear(out[len(dst):])
			return out, nil
		}
	}
	return nil, f.blockError(blk, false)
}

// learnHoles reads the file's last block, whose mark says whether the file
// may have holes (when that is not known yet).
func (f *file) learnHoles(ctx context.Context, aead cipher.AEAD, id []byte) (byte, error) {
	if h := f.st.getHoles(); h != holesUnknown {
		return h, nil
	}
	c := f.fs.c
	a, err := f.lower.Getattr(ctx)
	if err != nil {
		return 0, err
	}
	size, ok := c.plainSize(a.Size)
	if !ok {
		return 0, corruptf("/"+f.path, "the file's size (%d bytes below) is not that of a whole number of blocks: truncated", a.Size)
	}
	if size == 0 {
		return holesNone, nil
	}
	last := int64(size-1) / int64(c.bs)
	bp := getBuf(c.cbs)
	defer putBuf(bp)
	n, err := readFull(ctx, f.lower, *bp, c.blockOffset(uint64(last)))
	if err != nil {
		return 0, err
	}
	pp := getBuf(c.bs)
	defer putBuf(pp)
	if _, err := f.openBlock(ctx, aead, id, (*pp)[:0], (*bp)[:n], last, true); err != nil {
		return 0, err
	}
	return f.st.getHoles(), nil
}

// readBlock returns the plaintext of block blk (the caller holds st.mu).
func (f *file) readBlock(ctx context.Context, dst []byte, id []byte, aead cipher.AEAD, blk int64, last bool) ([]byte, error) {
	c := f.fs.c
	bp := getBuf(c.cbs)
	defer putBuf(bp)
	n, err := readFull(ctx, f.lower, *bp, c.blockOffset(uint64(blk)))
	if err != nil {
		return nil, err
	}
	return f.openBlock(ctx, aead, id, dst[:0], (*bp)[:n], blk, last)
}

// --- writing ---

func (f *file) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, syscall.EINVAL
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	size, err := f.size(ctx)
	if err != nil {
		return 0, err
	}
	if f.append {
		off = size
	}
	if len(p) == 0 {
		return 0, nil
	}
	// At most maxChunk blocks a time: the old blocks of each are kept in
	// memory and in the journal.
	step := maxChunk * f.fs.c.bs
	done := 0
	for done < len(p) {
		n := min(len(p)-done, step)
		if err := f.write(ctx, p[done:done+n], off+int64(done), int64(n), size, true); err != nil {
			if done > 0 {
				return done, nil // a short write, as pwrite makes
			}
			return 0, err
		}
		done += n
		size = f.st.size
	}
	return done, nil
}

// maxChunk is the most blocks sealed for one lower write.
const maxChunk = 256

// span is a range of blocks, from..to inclusive.
type span struct{ from, to int64 }

// write writes n bytes of p (zeros if p is nil) at off into a file of size
// bytes; the caller holds st.mu for writing. With sparse, whole blocks of
// zeros past the old end of the file (but the new last block) are left as
// holes in the lower file rather than written.
//
// A block that is rewritten in place is first copied to the file's
// journal (journal.go), so that a crash in the middle of the write leaves
// the old block, or the new, never half of each; if the lower fails the
// write (ENOSPC, a short write, EFBIG), the blocks it changed are put back
// and the lower size restored, and the error is the caller's.
func (f *file) write(ctx context.Context, p []byte, off, n, size int64, sparse bool) error {
	c := f.fs.c
	bs := int64(c.bs)
	end := off + n
	if end > c.maxPlain() || end < off {
		return syscall.EFBIG
	}
	newSize := max(size, end)
	var id []byte
	var aead cipher.AEAD
	fresh := size == 0
	holes := byte(holesNone)
	if fresh {
		// An empty file gets a new ID (and key) on its first write.
		id = make([]byte, fileIDSize)
		if _, err := io.ReadFull(c.rand, id); err != nil {
			return randErr(err)
		}
		aead = c.fileAEAD(id)
		f.st.setKey(id, aead)
		f.st.setHoles(holesNone)
	} else {
		var err error
		if id, aead, err = f.loadKey(ctx, nil); err != nil {
			if err == io.EOF {
				return corruptf("/"+f.path, "the file lost its header")
			}
			return err
		}
		if holes, err = f.learnHoles(ctx, aead, id); err != nil {
			return err
		}
	}
	oldFinal := int64(-1)
	if size > 0 {
		oldFinal = (size - 1) / bs
	}
	newFinal := (newSize - 1) / bs

	// The blocks to write.
	var spans []span
	add := func(a, b int64) {
		if a <= b {
			spans = append(spans, span{a, b})
		}
	}
	if !sparse {
		add(min(off, size)/bs, (end-1)/bs)
		if newSize > size && oldFinal >= 0 {
			add(oldFinal, oldFinal)
		}
	} else {
		if newSize > size && oldFinal >= 0 {
			add(oldFinal, oldFinal) // its last mark goes
		}
		if p != nil {
			add(off/bs, (end-1)/bs)
		} else if off < size {
			add(off/bs, (min(end, size)-1)/bs)
		}
		if newSize > size {
			add(newFinal, newFinal)
		}
	}
	spans = mergeSpans(spans)
	// Holes: blocks between the old last one and the new last one that
	// are not written.
	if newSize > size {
		covered := int64(0)
		for _, sp := range spans {
			covered += max(0, min(sp.to, newFinal)-max(sp.from, oldFinal+1)+1)
		}
		if covered < newFinal-oldFinal {
			holes = holesMaybe
		}
	}
	oldHoles := f.st.getHoles()
	if fresh {
		oldHoles = holesNone
	}

	// The old sealed bytes of the blocks rewritten in place, to the
	// journal before anything changes.
	oldLower := int64(c.lowerSize(uint64(size)))
	var before [][]byte // per span: the lower bytes it covers now
	var recs []jrec
	for _, sp := range spans {
		var b []byte
		if sp.from <= oldFinal {
			lo := c.blockOffset(uint64(sp.from))
			hi := min(c.blockOffset(uint64(min(sp.to, oldFinal)+1)), oldLower)
			b = make([]byte, hi-lo)
			if m, err := readFull(ctx, f.lower, b, lo); err != nil {
				return err
			} else if m != len(b) {
				return corruptf("/"+f.path, "the file is shorter below than its size says")
			}
			recs = append(recs, jrec{blk: sp.from, sealed: b})
		}
		before = append(before, b)
	}
	if len(recs) > 0 {
		if err := f.writeJournal(ctx, id, oldLower, recs); err != nil {
			return err
		}
	}
	if holes == holesMaybe && oldHoles != holesMaybe && !fresh {
		// Tell older readers (header version); the last block's mark is
		// what counts.
		if _, err := writeFull(ctx, f.lower, header(id, sparseVersion), 0); err != nil {
			return f.undo(ctx, err, oldLower, spans, before, oldHoles)
		}
	}
	lastMark := holes

	var scratch []*[]byte // partial blocks: at most two per chunk and span
	defer func() {
		for _, b := range scratch {
			putBuf(b)
		}
	}()
	plains := make([][]byte, 0, maxChunk)
	// The spans past the old end first: a full disk then fails the write
	// before any block is changed in place.
	for si := len(spans) - 1; si >= 0; si-- {
		sp := spans[si]
		for cb := sp.from; cb <= sp.to; cb += maxChunk {
			ce := min(cb+maxChunk-1, sp.to)
			nblk := int(ce - cb + 1)
			// The plaintext of each block: a slice of p for whole blocks,
			// zeros for gaps, and a scratch block (old content, zeros and
			// part of p) for the partial ones.
			plains = plains[:0]
			k := 0
			for blk := cb; blk <= ce; blk++ {
				bstart := blk * bs
				blen := min(bs, newSize-bstart)
				ws, we := max(off, bstart)-bstart, min(end, bstart+blen)-bstart
				switch {
				case ws == 0 && we == blen && p != nil:
					plains = append(plains, p[bstart-off:bstart-off+blen])
				case bstart >= size && (p == nil || we <= ws), p == nil && ws == 0 && we == blen:
					plains = append(plains, zeroBlock[:blen])
				default:
					if k == len(scratch) {
						scratch = append(scratch, getBuf(c.bs))
					}
					plain := (*scratch[k])[:blen]
					k++
					if bstart < size {
						o := (blk - sp.from) * int64(c.cbs)
						sealed := before[si][o:min(o+int64(c.cbs), int64(len(before[si])))]
						old, err := f.openBlock(ctx, aead, id, plain[:0], sealed, blk, blk == oldFinal)
						if err != nil {
							return err
						}
						clear(plain[min(len(old), len(plain)):])
					} else {
						clear(plain)
					}
					if we > ws {
						if p != nil {
							copy(plain[ws:we], p[bstart+ws-off:])
						} else {
							clear(plain[ws:we])
						}
					}
					plains = append(plains, plain)
				}
			}
			op := getBuf(headerSize + nblk*c.cbs)
			out := (*op)[:0]
			wo := c.blockOffset(uint64(cb))
			if fresh && cb == 0 {
				v := uint16(formatVersion)
				if holes == holesMaybe {
					v = sparseVersion
				}
				out = append(out, header(id, v)...)
				wo = 0
			}
			nonces := make([]byte, nblk*c.ns)
			if _, err := io.ReadFull(c.rand, nonces); err != nil {
				putBuf(op)
				return f.undo(ctx, randErr(err), oldLower, spans, before, oldHoles)
			}
			// Every block but the file's last has the same sealed size, so
			// each has a fixed place in out.
			base := len(out)
			parallel(nblk, func(i int) error {
				at := base + i*c.cbs
				mark := byte(markInner)
				if cb+int64(i) == newFinal {
					mark = lastMark
				}
				c.seal(aead, out[at:at], nonces[i*c.ns:(i+1)*c.ns], plains[i], id, uint64(cb)+uint64(i), mark)
				return nil
			})
			out = out[:base+(nblk-1)*c.cbs+c.overhead()+len(plains[nblk-1])]
			_, err := writeFull(ctx, f.lower, out, wo)
			putBuf(op)
			if err != nil {
				return f.undo(ctx, err, oldLower, spans, before, oldHoles)
			}
		}
	}
	if fresh && (len(spans) == 0 || spans[0].from > 0) {
		// The first block is a hole: the header goes alone.
		v := uint16(formatVersion)
		if holes == holesMaybe {
			v = sparseVersion
		}
		if _, err := writeFull(ctx, f.lower, header(id, v), 0); err != nil {
			return f.undo(ctx, err, oldLower, spans, before, oldHoles)
		}
	}
	f.st.setHoles(lastMark)
	f.setSize(newSize)
	return nil
}

// mergeSpans sorts spans and joins those that overlap or touch.
func mergeSpans(s []span) []span {
	slices.SortFunc(s, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	var out []span
	for _, sp := range s {
		if n := len(out); n > 0 && sp.from <= out[n-1].to+1 {
			out[n-1].to = max(out[n-1].to, sp.to)
			continue
		}
		out = append(out, sp)
	}
	return out
}

// undo puts back what a failed write changed: the blocks it rewrote in
// place (their old sealed bytes are in before) and the lower size. It
// returns the write's error (the application gets it: ENOSPC, EFBIG, EIO).
func (f *file) undo(ctx context.Context, err error, oldLower int64, spans []span, before [][]byte, oldHoles byte) error {
	c := f.fs.c
	f.st.sized = false
	f.st.setHoles(oldHoles)
	var uerr error
	for i, sp := range spans {
		if len(before[i]) > 0 {
			if _, e := writeFull(ctx, f.lower, before[i], c.blockOffset(uint64(sp.from))); e != nil && uerr == nil {
				uerr = e
			}
		}
	}
	if _, e := f.lower.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(oldLower)}); e != nil && uerr == nil {
		uerr = e
	}
	if oldLower == 0 {
		f.st.setKey(nil, nil)
	}
	if uerr != nil {
		slog.Error("crypt: a failed write could not be undone: the file may not read back", "file", "/"+f.path, "write", err, "undo", uerr)
	}
	return err
}

// zeroBlock is the plaintext of a block of zeros.
var zeroBlock = make([]byte, 1<<20)

// writeFull writes all of p at off; it returns how much was written when
// it fails (a short write is an error: io.ErrShortWrite, or the lower's).
func writeFull(ctx context.Context, f layer.File, p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := f.WriteAt(ctx, p[done:], off+int64(done))
		done += max(n, 0)
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, io.ErrShortWrite
		}
	}
	return done, nil
}

// truncate sets the plaintext size; the caller holds st.mu for writing.
func (f *file) truncate(ctx context.Context, newSize int64) error {
	c := f.fs.c
	if newSize > c.maxPlain() {
		return syscall.EFBIG
	}
	size, err := f.size(ctx)
	if err != nil {
		return err
	}
	lowerTo := func(n int64) error {
		_, err := f.lower.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(n)})
		return err
	}
	switch {
	case newSize == size:
		return nil
	case newSize == 0:
		if err := lowerTo(0); err != nil {
			f.st.sized = false
			return err
		}
		f.st.setKey(nil, nil)
	case newSize < size:
		id, aead, err := f.loadKey(ctx, nil)
		if err != nil {
			return err
		}
		holes, err := f.learnHoles(ctx, aead, id)
		if err != nil {
			return err
		}
		bs := int64(c.bs)
		nb := (newSize - 1) / bs
		oldLower := int64(c.lowerSize(uint64(size)))
		// The old block, to the journal; then the new last block in
		// place; then the lower file is cut after it.
		lo := c.blockOffset(uint64(nb))
		old := make([]byte, min(int64(c.cbs), oldLower-lo))
		if m, err := readFull(ctx, f.lower, old, lo); err != nil {
			return err
		} else if m != len(old) {
			return corruptf("/"+f.path, "the file is shorter below than its size says")
		}
		bp := getBuf(c.bs)
		defer putBuf(bp)
		plain, err := f.openBlock(ctx, aead, id, (*bp)[:0], old, nb, nb == (size-1)/bs)
		if err != nil {
			return err
		}
		nonce := make([]byte, c.ns)
		if _, err := io.ReadFull(c.rand, nonce); err != nil {
			return randErr(err)
		}
		sealed := c.seal(aead, nil, nonce, plain[:newSize-nb*bs], id, uint64(nb), holes)
		if err := f.writeJournal(ctx, id, oldLower, []jrec{{blk: nb, sealed: old}}); err != nil {
			return err
		}
		spans, before := []span{{nb, nb}}, [][]byte{old}
		if _, err := writeFull(ctx, f.lower, sealed, lo); err != nil {
			return f.undo(ctx, err, oldLower, spans, before, holes)
		}
		if err := lowerTo(lo + int64(len(sealed))); err != nil {
			return f.undo(ctx, err, oldLower, spans, before, holes)
		}
	default:
		return f.write(ctx, nil, size, newSize-size, size, true)
	}
	f.setSize(newSize)
	return nil
}

// --- the rest of the file's operations ---

func (f *file) Getattr(ctx context.Context) (layer.Attr, error) {
	a, err := f.lower.Getattr(ctx)
	if err != nil {
		return a, err
	}
	f.fs.Stat(ctx, "", &a)
	return a, nil
}

func (f *file) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	if in.Valid&layer.SetSize != 0 {
		f.st.mu.Lock()
		err := f.truncate(ctx, int64(in.Size))
		f.st.mu.Unlock()
		if err != nil {
			return layer.Attr{}, err
		}
	}
	if rest := *in; rest.Valid&^layer.SetSize != 0 {
		rest.Valid &^= layer.SetSize
		if _, err := f.lower.Setattr(ctx, &rest); err != nil {
			return layer.Attr{}, err
		}
	}
	return f.Getattr(ctx)
}

func (f *file) Flush(ctx context.Context) error { return f.lower.Flush(ctx) }
func (f *file) Fsync(ctx context.Context, datasync bool) error {
	return f.lower.Fsync(ctx, datasync)
}

func (f *file) Release(ctx context.Context) error {
	err := f.lower.Release(ctx)
	f.fs.unref(ctx, f.st)
	return err
}

func (f *file) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	if off < 0 || length <= 0 {
		return syscall.EINVAL
	}
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	size, err := f.size(ctx)
	if err != nil {
		return err
	}
	end := off + length
	switch mode {
	case 0: // reserve, and extend
		if end > size {
			return f.write(ctx, nil, size, end-size, size, false)
		}
		return nil
	case layer.FallocKeepSize:
		return nil
	case layer.FallocPunchHole | layer.FallocKeepSize:
		if end = min(end, size); end > off {
			return f.punch(ctx, off, end, size)
		}
		return nil
	case layer.FallocZeroRange | layer.FallocKeepSize:
		if end = min(end, size); end > off {
			return f.zero(ctx, off, end, size)
		}
		return nil
	case layer.FallocZeroRange:
		if err := f.zero(ctx, off, min(end, size), size); err != nil {
			return err
		}
		if end > size {
			return f.write(ctx, nil, size, end-size, size, false)
		}
		return nil
	}
	return syscall.EOPNOTSUPP
}

// zero writes sealed zeros over [off, end) inside the file, a bounded
// number of blocks at a time (each write keeps the old blocks in memory).
func (f *file) zero(ctx context.Context, off, end, size int64) error {
	step := int64(maxChunk * f.fs.c.bs)
	for ; off < end; off += step {
		if err := f.write(ctx, nil, off, min(step, end-off), size, false); err != nil {
			return err
		}
	}
	return nil
}

// punch makes the whole blocks of [off, end) holes in the lower file (but
// the last block of the file) and writes zeros over the rest.
func (f *file) punch(ctx context.Context, off, end, size int64) error {
	c := f.fs.c
	bs := int64(c.bs)
	final := (size - 1) / bs
	b0, b1 := (off+bs-1)/bs, min(end/bs, final) // holes: b0..b1-1
	if b0 >= b1 {
		return f.zero(ctx, off, end, size)
	}
	id, aead, err := f.loadKey(ctx, nil)
	if err != nil {
		return err
	}
	holes, err := f.learnHoles(ctx, aead, id)
	if err != nil {
		return err
	}
	if holes != holesMaybe {
		// The last block says first that the file may have holes: it
		// is sealed again with that mark (through the journal).
		if err := f.remarkLast(ctx, id, aead, size); err != nil {
			return err
		}
	}
	lo := c.blockOffset(uint64(b0))
	err = f.lower.Allocate(ctx, lo, c.blockOffset(uint64(b1))-lo, layer.FallocPunchHole|layer.FallocKeepSize)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return f.zero(ctx, off, end, size)
	}
	if err != nil {
		return err
	}
	if err := f.zero(ctx, off, b0*bs, size); err != nil {
		return err
	}
	return f.zero(ctx, b1*bs, end, size)
}

// remarkLast seals the last block again with the mark of a file that may
// have holes, and gives the header the version that says so.
func (f *file) remarkLast(ctx context.Context, id []byte, aead cipher.AEAD, size int64) error {
	c := f.fs.c
	bs := int64(c.bs)
	final := (size - 1) / bs
	lo := c.blockOffset(uint64(final))
	oldLower := int64(c.lowerSize(uint64(size)))
	old := make([]byte, oldLower-lo)
	if m, err := readFull(ctx, f.lower, old, lo); err != nil {
		return err
	} else if m != len(old) {
		return corruptf("/"+f.path, "the file is shorter below than its size says")
	}
	bp := getBuf(c.bs)
	defer putBuf(bp)
	plain, err := f.openBlock(ctx, aead, id, (*bp)[:0], old, final, true)
	if err != nil {
		return err
	}
	nonce := make([]byte, c.ns)
	if _, err := io.ReadFull(c.rand, nonce); err != nil {
		return randErr(err)
	}
	sealed := c.seal(aead, nil, nonce, plain, id, uint64(final), markLastSparse)
	if err := f.writeJournal(ctx, id, oldLower, []jrec{{blk: final, sealed: old}}); err != nil {
		return err
	}
	if _, err := writeFull(ctx, f.lower, header(id, sparseVersion), 0); err != nil {
		return err
	}
	if _, err := writeFull(ctx, f.lower, sealed, lo); err != nil {
		return f.undo(ctx, err, oldLower, []span{{final, final}}, [][]byte{old}, holesNone)
	}
	f.st.setHoles(holesMaybe)
	return nil
}

// Lseek finds data and holes: the holes of a file are whole blocks that
// are holes in the lower file (its last block is always data). A block
// that the lower stores as zeros counts as data, as SEEK_DATA allows.
func (f *file) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	f.st.mu.Lock()
	defer f.st.mu.Unlock()
	size, err := f.size(ctx)
	if err != nil {
		return 0, err
	}
	if off < 0 || off >= size {
		return 0, syscall.ENXIO
	}
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return 0, syscall.EINVAL
	}
	id, aead, err := f.loadKey(ctx, nil)
	if err != nil {
		return 0, err
	}
	holes, err := f.learnHoles(ctx, aead, id)
	if err != nil {
		return 0, err
	}
	c := f.fs.c
	bs, cbs := int64(c.bs), int64(c.cbs)
	final := (size - 1) / bs
	if holes != holesMaybe {
		if whence == unix.SEEK_DATA {
			return off, nil
		}
		return size, nil
	}
	// blockAt is the block that holds lower offset lo (or starts after it).
	blockAt := func(lo int64, up bool) int64 {
		lo -= int64(headerSize)
		if lo <= 0 {
			return 0
		}
		if up {
			return (lo + cbs - 1) / cbs
		}
		return lo / cbs
	}
	// stored reports whether block b is stored as zeros (a hole whose
	// lower pages are partly allocated: its neighbours share them).
	bp := getBuf(c.cbs)
	defer putBuf(bp)
	stored := func(b int64) bool {
		if b >= final {
			return false
		}
		n, err := readFull(ctx, f.lower, *bp, c.blockOffset(uint64(b)))
		return err == nil && c.isHole((*bp)[:n])
	}
	blk := off / bs
	if whence == unix.SEEK_DATA {
		pos := c.blockOffset(uint64(blk))
		for i := 0; ; i++ {
			lo, err := f.lower.Lseek(ctx, pos, unix.SEEK_DATA)
			if err != nil {
				if errors.Is(err, syscall.ENXIO) {
					return final * bs, nil
				}
				return 0, err
			}
			b := max(min(blockAt(lo, false), final), blk)
			if i < 64 && stored(b) {
				pos = c.blockOffset(uint64(b + 1))
				continue
			}
			return max(off, b*bs), nil
		}
	}
	if stored(blk) {
		return off, nil
	}
	pos := c.blockOffset(uint64(blk))
	for {
		h, err := f.lower.Lseek(ctx, pos, unix.SEEK_HOLE)
		if err != nil {
			if errors.Is(err, syscall.ENXIO) {
				return size, nil
			}
			return 0, err
		}
		b := max(blockAt(h, true), blk)
		if b > blk+1 && stored(b-1) {
			return (b - 1) * bs, nil
		}
		if b >= final {
			return size, nil
		}
		d, err := f.lower.Lseek(ctx, h, unix.SEEK_DATA)
		if err != nil {
			return 0, err // the last block is data: there is some
		}
		if c.blockOffset(uint64(b))+cbs <= d {
			return max(off, b*bs), nil
		}
		pos = d
	}
}

// CopyFileRange copies through the plaintext.
func (f *file) CopyFileRange(ctx context.Context, offIn int64, dst layer.File, offOut int64, n int64, flags uint32) (int64, error) {
	d, ok := dst.(*file)
	if !ok {
		return 0, syscall.EXDEV
	}
	bp := getBuf(128 << 10)
	defer putBuf(bp)
	var done int64
	for done < n {
		chunk := (*bp)[:min(int64(len(*bp)), n-done)]
		r, err := f.ReadAt(ctx, chunk, offIn+done)
		if r > 0 {
			if _, werr := d.WriteAt(ctx, chunk[:r], offOut+done); werr != nil {
				return done, werr
			}
			done += int64(r)
		}
		if err == io.EOF || r == 0 {
			break
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

func (f *file) Getlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32) (layer.Lock, error) {
	return f.lower.Getlk(ctx, owner, lk, flags)
}

func (f *file) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32, wait bool) error {
	return f.lower.Setlk(ctx, owner, lk, flags, wait)
}

// Caps: keep-cache, as the layer assumes it is the only writer of its
// lower directory (docs/crypt.md), so the kernel's cached plaintext stays
// right; never passthrough (the lower bytes are ciphertext).
func (f *file) Caps() layer.Caps { return layer.CapKeepCache }

// TouchAtime: the lower file's atime is the file's.
func (f *file) TouchAtime(ctx context.Context) bool { return layer.TouchAtime(ctx, f.lower) }

// PassthroughFd: the lower bytes are ciphertext.
func (f *file) PassthroughFd() (int, bool) { return -1, false }

// ReopenFile opens the file's object again from its lower file
// (layer.FileReopener: a file removed while open, opened by handle); the new
// file shares the object's state, as a second open does.
func (f *file) ReopenFile(ctx context.Context, flags int) (layer.File, error) {
	lf, err := layer.ReopenFile(ctx, f.lower, lowerFlags(flags))
	if err != nil {
		return nil, err
	}
	a, err := lf.Getattr(ctx)
	if err == nil && a.IsRegular() && f.fs.pendingJournal(a.ID()) {
		err = syscall.ESTALE // recovered at the first open, which had its name: not expected
	}
	if err != nil {
		lf.Release(ctx)
		return nil, err
	}
	return f.fs.newFile(ctx, f.path, "", lf, &a, flags)
}
