package crypt

import (
	"context"
	"crypto/cipher"
	"errors"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"cairn/layer"
)

// fileState is shared by all open files of one lower inode (hard links and
// renames keep it): the lock that orders reads and writes, the file's ID and
// key, and its size while it is open.
type fileState struct {
	mu   sync.RWMutex // readers: ReadAt; writers: everything that changes the file
	refs int          // guarded by FS.mu
	ino  layer.ID

	hmu  sync.Mutex // guards id and aead (set by readers too)
	id   []byte     // nil: not known yet (or the file is empty)
	aead cipher.AEAD

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
	s.hmu.Unlock()
}

func (fs *FS) state(ino layer.ID) *fileState {
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

func (fs *FS) unref(s *fileState) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if s.refs--; s.refs == 0 {
		delete(fs.files, s.ino)
	}
}

// file is an open regular file of the crypt layer.
type file struct {
	fs     *FS
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
	flags &^= unix.O_APPEND | unix.O_TRUNC | unix.O_DIRECT | unix.O_CREAT | unix.O_EXCL
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
	return fs.openLower(ctx, path, lp, flags)
}

func (fs *FS) openLower(ctx context.Context, path, lp string, flags int) (*file, error) {
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
	return fs.newFile(ctx, path, lf, &a, flags)
}

func (fs *FS) newFile(ctx context.Context, path string, lf layer.File, a *layer.Attr, flags int) (*file, error) {
	if a.IsRegular() {
		if _, ok := fs.c.plainSize(a.Size); !ok {
			lf.Release(ctx)
			return nil, corruptf("/"+path, "the file's size (%d bytes below) is not that of a whole number of blocks: truncated", a.Size)
		}
	}
	f := &file{fs: fs, lower: lf, st: fs.state(a.ID()), path: path, append: flags&unix.O_APPEND != 0}
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
	f, err := fs.newFile(ctx, path, lf, &a, flags)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	fs.fixAttr(&a)
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
	id, err := parseHeader(h)
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
			unix.Fadvise(fd, 0, 0, unix.FADV_SEQUENTIAL)
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
		out, err := c.open(aead, pn.dst, pn.sealed, id, uint64(blk), pn.last)
		if err != nil {
			return f.blockError(blk, pn.last)
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

// readBlock returns the plaintext of block blk (the caller holds st.mu).
func (f *file) readBlock(ctx context.Context, dst []byte, id []byte, aead cipher.AEAD, blk int64, last bool) ([]byte, error) {
	c := f.fs.c
	bp := getBuf(c.cbs)
	defer putBuf(bp)
	n, err := readFull(ctx, f.lower, *bp, c.blockOffset(uint64(blk)))
	if err != nil {
		return nil, err
	}
	out, err := c.open(aead, dst[:0], (*bp)[:n], id, uint64(blk), last)
	if err != nil {
		return nil, f.blockError(blk, last)
	}
	return out, nil
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
	if err := f.write(ctx, p, off, int64(len(p)), size); err != nil {
		return 0, err
	}
	return len(p), nil
}

// maxChunk is the most blocks sealed for one lower write.
const maxChunk = 256

// write writes n bytes of p (zeros if p is nil) at off into a file of size
// bytes; the caller holds st.mu for writing.
func (f *file) write(ctx context.Context, p []byte, off, n, size int64) error {
	c := f.fs.c
	bs := int64(c.bs)
	end := off + n
	newSize := max(size, end)
	var id []byte
	var aead cipher.AEAD
	fresh := size == 0
	if fresh {
		// An empty file gets a new ID (and key) on its first write.
		id = make([]byte, fileIDSize)
		if _, err := io.ReadFull(c.rand, id); err != nil {
			return err
		}
		aead = c.fileAEAD(id)
		f.st.setKey(id, aead)
	} else {
		var err error
		if id, aead, err = f.loadKey(ctx, nil); err != nil {
			if err == io.EOF {
				return corruptf("/"+f.path, "the file lost its header")
			}
			return err
		}
	}
	fb := min(off, size) / bs
	oldFinal := int64(-1)
	if size > 0 {
		oldFinal = (size - 1) / bs
		if newSize > size {
			fb = min(fb, oldFinal) // its last mark goes
		}
	}
	lb, newFinal := (end-1)/bs, (newSize-1)/bs
	var scratch []*[]byte // partial blocks: at most two per chunk
	defer func() {
		for _, b := range scratch {
			putBuf(b)
		}
	}()
	plains := make([][]byte, 0, min(lb-fb+1, maxChunk))
	for cb := fb; cb <= lb; cb += maxChunk {
		ce := min(cb+maxChunk-1, lb)
		nblk := int(ce - cb + 1)
		// The plaintext of each block: a slice of p for whole blocks,
		// zeros for gaps, and a scratch block (old content, zeros and
		// part of p) for the partial ones, which are the first and the
		// last of the range.
		plains = plains[:0]
		k := 0
		for blk := cb; blk <= ce; blk++ {
			bstart := blk * bs
			blen := min(bs, newSize-bstart)
			ws, we := max(off, bstart)-bstart, min(end, bstart+blen)-bstart
			switch {
			case ws == 0 && we == blen && p != nil:
				plains = append(plains, p[bstart-off:bstart-off+blen])
			case bstart >= size && (p == nil || we <= ws):
				plains = append(plains, zeroBlock[:blen])
			default:
				if k == len(scratch) {
					scratch = append(scratch, getBuf(c.bs))
				}
				plain := (*scratch[k])[:blen]
				k++
				if bstart < size {
					old, err := f.readBlock(ctx, plain, id, aead, blk, blk == oldFinal)
					if err != nil {
						return err
					}
					clear(plain[len(old):])
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
			out = append(out, header(id)...)
			wo = 0
		}
		nonces := make([]byte, nblk*c.ns)
		if _, err := io.ReadFull(c.rand, nonces); err != nil {
			putBuf(op)
			return err
		}
		// Every block but the file's last has the same sealed size, so
		// each has a fixed place in out.
		base := len(out)
		parallel(nblk, func(i int) error {
			at := base + i*c.cbs
			c.seal(aead, out[at:at], nonces[i*c.ns:(i+1)*c.ns], plains[i], id, uint64(cb)+uint64(i), cb+int64(i) == newFinal)
			return nil
		})
		out = out[:base+(nblk-1)*c.cbs+c.overhead()+len(plains[nblk-1])]
		err := writeFull(ctx, f.lower, out, wo)
		putBuf(op)
		if err != nil {
			f.st.sized = false
			return err
		}
	}
	f.setSize(newSize)
	return nil
}

// zeroBlock is the plaintext of a block of zeros.
var zeroBlock = make([]byte, 1<<20)

func writeFull(ctx context.Context, f layer.File, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := f.WriteAt(ctx, p, off)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// truncate sets the plaintext size; the caller holds st.mu for writing.
func (f *file) truncate(ctx context.Context, newSize int64) error {
	c := f.fs.c
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
		bs := int64(c.bs)
		nb := (newSize - 1) / bs
		bp := getBuf(c.bs)
		defer putBuf(bp)
		old, err := f.readBlock(ctx, *bp, id, aead, nb, nb == (size-1)/bs)
		if err != nil {
			return err
		}
		nonce := make([]byte, c.ns)
		if _, err := io.ReadFull(c.rand, nonce); err != nil {
			return err
		}
		sealed := c.seal(aead, nil, nonce, old[:newSize-nb*bs], id, uint64(nb), true)
		f.st.sized = false
		if err := lowerTo(c.blockOffset(uint64(nb))); err != nil {
			return err
		}
		if err := writeFull(ctx, f.lower, sealed, c.blockOffset(uint64(nb))); err != nil {
			return err
		}
	default:
		return f.write(ctx, nil, size, newSize-size, size)
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
	f.fs.fixAttr(&a)
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
	f.fs.unref(f.st)
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
			return f.write(ctx, nil, size, end-size, size)
		}
		return nil
	case unix.FALLOC_FL_KEEP_SIZE:
		return nil
	case unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE, unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE:
		// No holes below: zeros are written, sealed like any data.
		if end = min(end, size); end > off {
			return f.write(ctx, nil, off, end-off, size)
		}
		return nil
	case unix.FALLOC_FL_ZERO_RANGE:
		return f.write(ctx, nil, off, length, size)
	}
	return syscall.EOPNOTSUPP
}

// Lseek: the layer keeps no holes, so all of a file is data.
func (f *file) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	f.st.mu.Lock()
	size, err := f.size(ctx)
	f.st.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if off < 0 || off >= size {
		return 0, syscall.ENXIO
	}
	switch whence {
	case unix.SEEK_DATA:
		return off, nil
	case unix.SEEK_HOLE:
		return size, nil
	}
	return 0, syscall.EINVAL
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

// KeepCache: the layer assumes it is the only writer of its lower
// directory (docs/crypt.md), so the kernel's cached plaintext stays right.
func (f *file) KeepCache() bool { return true }

// PassthroughFd: the lower bytes are ciphertext.
func (f *file) PassthroughFd() (int, bool) { return -1, false }
