package codec

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Plain files: a codec layer stacked over a directory that already holds
// files serves the files it did not write as they are (docs/codec-format.md,
// "Plain files"). What is the engine's is decided by the magic numbers of
// the format alone, so that damaged data of the engine is never served raw:
// a file is the engine's when it is empty, when its header slot 0 or 1
// starts with "CZF" or the log's first record with "CZR" (whatever the
// version byte after them: a newer format is refused, not served raw), or
// when it is shorter than 3 bytes and a prefix of "CZF" (the header of a
// new file torn by a crash). Every other file is plain.

// plainProbe is how many bytes of a file decide whether it is plain.
const plainProbe = headerSize + 3

// isPlainBytes reports whether b, the first plainProbe bytes of a file (all
// of them if it is shorter), are those of a plain file.
func isPlainBytes(b []byte) bool {
	at := func(off int, m [4]byte) bool { return len(b) >= off+3 && bytes.Equal(b[off:off+3], m[:3]) }
	if at(0, slotMagic) || at(slotSize, slotMagic) || at(headerSize, recMagic) {
		return false
	}
	return !(len(b) < 3 && bytes.HasPrefix(slotMagic[:], b))
}

// IsPlain reports whether the open lower file lf is plain (not the
// engine's).
func IsPlain(ctx context.Context, lf layer.File) (bool, error) {
	b := make([]byte, plainProbe)
	n, err := lf.ReadAt(ctx, b, 0)
	if err != nil && err != io.EOF {
		return false, err
	}
	return isPlainBytes(b[:n]), nil
}

// ConvertPrefix starts the names of the files `cairn convert` writes
// beside the ones it converts: the layer hides them, and the next
// conversion removes those a crash left.
const ConvertPrefix = ".cairn-convert-"

// reservedConvert says whether path is a file of a conversion under way
// (hidden: see Engine.Reserved).
func (fs *Engine) reservedConvert(path string) bool {
	if !fs.servePlain {
		return false
	}
	_, name := layer.Split(path)
	return strings.HasPrefix(name, ConvertPrefix)
}

// plainSet is what is open of one plain file: n counts every handle and
// every operation under way (plainOf), files the handles open for writing
// (served by the layer, so that they can change over: see toCodec).
type plainSet struct {
	n     int
	files map[*plainFile]bool
}

// plainOf tells whether lf, the lower file at a path, is plain; if so it
// is counted in fs.plains until unplain. retry: a plain file was being
// made the engine's meanwhile, open it again.
func (fs *Engine) plainOf(ctx context.Context, lf layer.File) (id layer.ID, plain, retry bool, err error) {
	a, err := lf.Getattr(ctx)
	if err != nil {
		return id, false, false, err
	}
	if !a.IsRegular() {
		return id, false, false, nil // acquire says what is wrong
	}
	if id, _, err = identity(ctx, lf); err != nil {
		return id, false, false, err
	}
	fs.mu.Lock()
	if fs.states[id] != nil {
		fs.mu.Unlock()
		return id, false, false, nil
	}
	if ps := fs.plains[id]; ps != nil {
		ps.n++
		fs.mu.Unlock()
		return id, true, false, nil
	}
	seq := fs.convSeq
	fs.mu.Unlock()
	if seq%2 == 1 {
		fs.pmu.Lock() // wait for the conversion to end
		fs.pmu.Unlock()
		return id, false, true, nil
	}
	if a.Size == 0 {
		return id, false, false, nil
	}
	p, err := IsPlain(ctx, lf)
	if err != nil || !p {
		return id, false, false, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.convSeq != seq || fs.states[id] != nil {
		return id, false, true, nil
	}
	fs.reserve(id)
	return id, true, false, nil
}

// reserve counts one more handle or operation of the plain file id;
// fs.mu is held.
func (fs *Engine) reserve(id layer.ID) {
	ps := fs.plains[id]
	if ps == nil {
		ps = &plainSet{files: map[*plainFile]bool{}}
		fs.plains[id] = ps
	}
	ps.n++
}

// unplain drops one count of plainOf (and f, if not nil, from the
// handles).
func (fs *Engine) unplain(id layer.ID, f *plainFile) {
	fs.mu.Lock()
	if ps := fs.plains[id]; ps != nil {
		delete(ps.files, f)
		if ps.n--; ps.n <= 0 {
			delete(fs.plains, id)
		}
	}
	if fs.pcond != nil {
		fs.pcond.Broadcast()
	}
	fs.mu.Unlock()
}

// plainWait is how long a plain file's rewrite waits for its other
// handles to be released before it gives up and keeps the file plain.
const plainWait = time.Second

// plainCond is signalled when a plain handle goes; fs.mu is held.
func (fs *Engine) plainCond() *sync.Cond {
	if fs.pcond == nil {
		fs.pcond = sync.NewCond(&fs.mu)
	}
	return fs.pcond
}

// toCodec makes the plain file lf (at path; id, counted once by the
// caller) the engine's, when the only handles open are open for writing
// (none is passed through to the kernel, which would read or write the
// lower bytes itself): it truncates it to 0 bytes (the engine's empty
// file) and makes every handle a handle of the engine's file. It waits a
// little for other handles to go (the kernel releases a file after
// close(2) returns: cat f; cp g f). true: done, lf is the engine's and the
// caller's count is dropped; false: nothing changed.
func (fs *Engine) toCodec(ctx context.Context, lf layer.File, path string, id layer.ID) (bool, error) {
	fs.pmu.Lock()
	defer fs.pmu.Unlock()
	fs.mu.Lock()
	ready := func() bool { ps := fs.plains[id]; return ps != nil && ps.n == 1+len(ps.files) }
	if !ready() {
		deadline := time.Now().Add(plainWait)
		t := time.AfterFunc(plainWait, func() {
			fs.mu.Lock()
			fs.plainCond().Broadcast()
			fs.mu.Unlock()
		})
		for !ready() && time.Now().Before(deadline) {
			fs.plainCond().Wait()
		}
		t.Stop()
	}
	if !ready() {
		fs.mu.Unlock()
		return false, nil
	}
	var files []*plainFile
	for f := range fs.plains[id].files {
		files = append(files, f)
	}
	// From here an open finds the file neither plain nor the engine's,
	// and a conversion under way: it waits for it (plainOf).
	delete(fs.plains, id)
	fs.convSeq++
	fs.mu.Unlock()
	replain := func() {
		fs.mu.Lock()
		ps := &plainSet{n: len(files) + 1, files: map[*plainFile]bool{}} // the caller's count too
		for _, f := range files {
			ps.files[f] = true
		}
		fs.plains[id] = ps
		fs.mu.Unlock()
	}
	defer func() {
		fs.mu.Lock()
		fs.convSeq++
		fs.mu.Unlock()
	}()
	// No operation of the handles is under way from here on.
	for _, f := range files {
		f.rw.Lock()
		defer f.rw.Unlock()
	}
	if _, err := lf.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 0}); err != nil {
		replain()
		return false, err
	}
	if len(files) == 0 {
		lf.Release(ctx) // empty: the engine's from the next open
		return true, nil
	}
	st, lk, err := fs.acquire(ctx, path, lf, false)
	if err != nil {
		// The file is empty, its handles plain: what they write makes
		// it a plain file again, which is sound.
		replain()
		fs.log().Warn("codec: cannot make a rewritten plain file the layer's: it stays plain", "path", path, "err", err)
		return false, nil
	}
	if lk != nil {
		lk.Release(ctx)
	}
	for _, f := range files {
		fs.mu.Lock()
		st.refs++
		fs.mu.Unlock()
		// The plain lower file stays this handle's own, for its locks.
		f.cur = &File{fs: fs, st: st, flags: f.flags & handleFlags, path: f.path, lk: f.cur}
		f.conv = true
	}
	fs.put(ctx, st) // acquire's reference
	return true, nil
}

// plainFile is an open plain file: the lower file itself, counted in
// fs.plains. Opened read-only, it is passed through to the kernel where
// the mount allows. Opened for writing, it is served by the layer, so that
// a truncation to 0 (how the kernel asks for open(O_TRUNC)) can make the
// file the engine's (toCodec): from then on it is a handle of the encoded
// file.
type plainFile struct {
	fs    *Engine
	id    layer.ID
	path  string
	flags int

	rw   sync.RWMutex // held for reading by every operation; toCodec takes it to change over
	cur  layer.File   // the plain lower file, or the engine's File once converted
	conv bool         // cur is the engine's
	once sync.Once
}

// openPlain opens path's lower file with the caller's flags as a plain
// file (id, counted by plainOf: the count passes to the file, or is
// dropped on failure). retry: path names another file now.
func (fs *Engine) openPlain(ctx context.Context, path string, flags int, id layer.ID) (layer.File, bool, error) {
	pf, err := fs.Lower.Open(ctx, path, flags&^(unix.O_CREAT|unix.O_EXCL))
	if err != nil {
		fs.unplain(id, nil)
		return nil, false, err
	}
	if got, _, err := identity(ctx, pf); err != nil || got != id {
		pf.Release(ctx)
		fs.unplain(id, nil)
		return nil, err == nil, err
	}
	f := &plainFile{fs: fs, id: id, path: path, flags: flags, cur: pf}
	if f.writable() {
		fs.mu.Lock()
		fs.plains[id].files[f] = true
		fs.mu.Unlock()
	}
	return f, false, nil
}

func (f *plainFile) writable() bool { return f.flags&unix.O_ACCMODE != unix.O_RDONLY }

// Setattr to size 0 makes the file the engine's (see toCodec).
func (f *plainFile) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	if in.Valid&layer.SetSize != 0 && in.Size == 0 && f.writable() {
		f.rw.RLock()
		conv := f.conv
		f.rw.RUnlock()
		if !conv {
			if err := f.encode(ctx); err != nil {
				return layer.Attr{}, err
			}
		}
	}
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.Setattr(ctx, in)
}

// encode tries to make the file the engine's.
func (f *plainFile) encode(ctx context.Context) error {
	fs := f.fs
	lf, err := fs.Lower.Open(ctx, f.path, unix.O_RDWR|unix.O_NOFOLLOW)
	if err != nil {
		return nil // stays plain
	}
	if id, _, err := identity(ctx, lf); err != nil || id != f.id {
		lf.Release(ctx) // renamed since it was opened: stays plain
		return nil
	}
	fs.mu.Lock()
	if fs.plains[f.id] == nil {
		fs.mu.Unlock()
		lf.Release(ctx)
		return nil // converted meanwhile
	}
	fs.reserve(f.id)
	fs.mu.Unlock()
	converted, err := fs.toCodec(ctx, lf, f.path, f.id)
	if !converted {
		fs.unplain(f.id, nil)
		lf.Release(ctx)
	}
	return err
}

func (f *plainFile) Release(ctx context.Context) error {
	var err error
	f.once.Do(func() {
		f.rw.Lock()
		err = f.cur.Release(ctx)
		conv := f.conv
		f.rw.Unlock()
		if !conv {
			f.fs.unplain(f.id, f)
		}
	})
	return err
}

func (f *plainFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.ReadAt(ctx, p, off)
}

func (f *plainFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.WriteAt(ctx, p, off)
}

func (f *plainFile) Getattr(ctx context.Context) (layer.Attr, error) {
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.Getattr(ctx)
}

func (f *plainFile) Flush(ctx context.Context) error {
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.Flush(ctx)
}

func (f *plainFile) Fsync(ctx context.Context, datasync bool) error {
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.Fsync(ctx, datasync)
}

func (f *plainFile) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.Allocate(ctx, off, length, mode)
}

func (f *plainFile) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.Lseek(ctx, off, whence)
}

// CopyFileRange: the kernel copies through read and write.
func (f *plainFile) CopyFileRange(context.Context, int64, layer.File, int64, int64, uint32) (int64, error) {
	return 0, syscall.EXDEV
}

func (f *plainFile) Getlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32) (layer.Lock, error) {
	f.rw.RLock()
	defer f.rw.RUnlock()
	return f.cur.Getlk(ctx, owner, lk, flags)
}

func (f *plainFile) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32, wait bool) error {
	f.rw.RLock()
	c := f.cur
	f.rw.RUnlock()
	return c.Setlk(ctx, owner, lk, flags, wait) // may wait: not under the lock
}

// PassthroughFd and Caps: a read-only plain file is its lower file, and
// may be passed through; one open for writing is served by the layer (see
// plainFile).
func (f *plainFile) PassthroughFd() (int, bool) {
	if f.writable() {
		return -1, false
	}
	return f.cur.PassthroughFd()
}

func (f *plainFile) LendFd(fn func(fd int)) bool {
	return !f.writable() && layer.LendFd(f.cur, fn)
}

func (f *plainFile) Caps() layer.Caps {
	if f.writable() {
		return 0
	}
	return f.cur.Caps()
}
