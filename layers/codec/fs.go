package codec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// Options configure a codec layer.
type Options struct {
	Level     int   // codec level (gzip, zstd, lz4)
	ChunkSize int64 // a power of two from 4 KiB to 1 MiB (default DefaultChunkSize)
	FastTails bool  // keep small appends and writes into stored chunks unencoded (deltas), within limits
	// CompactMin is the dead space a file may hold before compaction is
	// considered (default 1 MiB); compaction also needs dead > live.
	CompactMin int64
	// FoldDelay is how long a closed file with deltas stays as it is
	// before they are folded into encoded chunks and the file compacted
	// (default 2 s; negative: never). See Engine.fold.
	FoldDelay time.Duration
	Logger    *slog.Logger
	salt      uint32 // tests: a fixed salt for known-answer files
}

// DefaultChunkSize is the chunk size of new files, for codecs that do not
// say otherwise (see docs/codec-format.md for the measurements behind it).
const DefaultChunkSize = 64 << 10

// Engine is the Fast Indexing engine with one codec: a layer.Transform
// that stores each file it is given as a log of encoded chunks in the file
// of the same path below.
type Engine struct {
	Lower      layer.FS
	kind       *Kind
	codec      Codec
	shift      uint8
	fastTails  bool
	compactMin int64
	foldDelay  time.Duration
	salt       uint32
	logger     *slog.Logger
	// shared: the lower is shared with other machines (a claim with
	// layer.SharedClaim, cairn mount -shared): a state is checked against
	// its lower file when the file is opened or stat-ed (dropStale).
	shared bool
	// noLocks: the lower refused a writer lock (lockWriter), said once.
	noLocks atomic.Bool

	mu     sync.Mutex
	states map[layer.ID]*state // by lower identity (device, branch, inode)
	// idle are states without handles, kept loaded (the most recent last)
	// so that opening a file again costs no index load and no decoding.
	idle []*state
	// folds are the folds under way or due (see fold): timers by state,
	// and the running ones, which Close waits for.
	timers  map[*state]*time.Timer
	folding sync.WaitGroup
	foldSem chan struct{}
	// evicting are the folds of states let go of, which keep their
	// lower file open until done (at most maxEvictedFolds), by file: each
	// channel is closed when its fold is done. An open of such a file
	// waits for it (acquire): a state loaded beside the folding one would
	// append records at the same log end.
	evicting map[layer.ID]chan struct{}
	closed   bool
	// report is told of the files folded (layer.ChangeReporter).
	report atomic.Pointer[func(layer.ID)]

	// servePlain: files that the engine did not write (no magic: see
	// isPlain) are served as they are (a codec layer over existing data;
	// not a chain's link, whose record says the file is encoded).
	servePlain bool
	// plains are the plain handles open (and operations under way on
	// plain files) by lower identity: a plain file becomes the engine's
	// (truncated to 0, then written encoded) only when none is, so that
	// no handle reads or writes raw bytes of a file that is encoded now.
	plains map[layer.ID]*plainSet
	// convSeq is odd while a plain file is being made the engine's; an
	// open that found a file plain counts it only if convSeq did not
	// change meanwhile. pmu makes those changes one at a time.
	convSeq uint64
	pmu     sync.Mutex
	pcond   *sync.Cond // see plainCond
}

var _ layer.Transform = (*Engine)(nil)

// FS is a size-changing layer: the engine applied to every file.
//
// It keeps the writeback cache (layer.FSWriteback, the lower's): the
// kernel's WRITEs, later and larger, go through any of the object's files
// open for writing, which share the object's state; the fold at rest runs
// after the last release, and the kernel writes its pages back before it
// releases a file (a mapping keeps its file open); the fold keeps the
// times, and the kernel keeps the size the stack presents.
type FS struct {
	layer.Transformed
	e *Engine

	rmu sync.Mutex
	// release lets go of the lock on the lower directory (see Claim).
	release func()
}

// maxIdle is the number of closed files whose state is kept.
const maxIdle = 32

// New stacks the codec called name ("copy", "gzip", ...) over lower.
func New(lower layer.FS, name string, o Options) (*FS, error) {
	e, err := NewEngine(lower, name, o)
	if err != nil {
		return nil, err
	}
	e.servePlain = true
	return &FS{Transformed: layer.Transformed{Base: layer.Base{Lower: lower}, T: e}, e: e}, nil
}

// NewEngine makes the engine of the codec called name over lower, to apply
// to the files it is given (a link of a chain).
func NewEngine(lower layer.FS, name string, o Options) (*Engine, error) {
	var k *Kind
	kindsMu.Lock()
	for _, x := range kinds {
		if x.Name == name {
			k = x
		}
	}
	kindsMu.Unlock()
	if k == nil {
		return nil, fmt.Errorf("codec: unknown codec %q", name)
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = k.chunk()
	}
	if err := checkChunk(o.ChunkSize); err != nil {
		return nil, fmt.Errorf("chunk_size %w", err)
	}
	if err := k.checkLevel(o.Level); err != nil {
		return nil, fmt.Errorf("level %w", err)
	}
	c, err := k.New(o.Level)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if o.CompactMin == 0 {
		o.CompactMin = 1 << 20
	}
	if o.FoldDelay == 0 {
		o.FoldDelay = 2 * time.Second
	}
	return &Engine{Lower: lower, kind: k, codec: c, shift: uint8(bits.TrailingZeros64(uint64(o.ChunkSize))),
		fastTails: o.FastTails, compactMin: o.CompactMin, foldDelay: o.FoldDelay, salt: o.salt, logger: o.Logger,
		states: map[layer.ID]*state{}, timers: map[*state]*time.Timer{}, evicting: map[layer.ID]chan struct{}{}, foldSem: make(chan struct{}, 2), plains: map[layer.ID]*plainSet{}}, nil
}

// checkChunk and checkLevel are the options' checks, for New and for
// cairn check (registry.Option.Check) alike.
func checkChunk(n int64) error {
	if n < 1<<minShift || n > 1<<maxShift || n&(n-1) != 0 {
		return fmt.Errorf("must be a power of two from 4KiB to 1MiB, found %d", n)
	}
	return nil
}

func (k *Kind) checkLevel(l int) error {
	if k.HasLevel && (l < k.MinLevel || l > k.MaxLevel) {
		return fmt.Errorf("must be from %d to %d for %s, found %d", k.MinLevel, k.MaxLevel, k.Name, l)
	}
	return nil
}

func (k *Kind) chunk() int64 {
	if k.DefaultChunk != 0 {
		return k.DefaultChunk
	}
	return DefaultChunkSize
}

// Register adds a codec and its layer type (type = NAME in a spec).
func Register(k *Kind) {
	addKind(k)
	opts := []registry.Option{
		{Name: "chunk_size", Kind: registry.Size, Default: k.chunk(),
			Help:  "size of the independently encoded chunks of new files: a power of two from 4KiB to 1MiB",
			Check: func(v any) error { n, _ := v.(int64); return checkChunk(n) }},
		{Name: "fast_tails", Kind: registry.Bool, Default: true,
			Help: "keep small appends, and small writes into chunks already stored, unencoded (delta records) until their chunk fills or carries a chunk's worth of them, or until the file has been closed for fold_delay"},
		{Name: "fold_delay", Kind: registry.Duration, Default: "2s",
			Help: "how long a closed file's fast tails and other deltas stay unencoded before they are folded (encoded, the file compacted); 0: never",
			Check: func(v any) error {
				if d, _ := v.(time.Duration); d < 0 {
					return fmt.Errorf("must not be negative")
				}
				return nil
			}},
	}
	if k.HasLevel {
		opts = append(opts, registry.Option{Name: "level", Kind: registry.Int, Default: int64(k.DefaultLevel),
			Help:  fmt.Sprintf("compression level, %d to %d", k.MinLevel, k.MaxLevel),
			Check: func(v any) error { n, _ := v.(int64); return k.checkLevel(int(n)) }})
	}
	name := k.Name
	registry.Register(registry.Type{
		Name: name, Summary: k.Summary, MinLowers: 1, MaxLowers: 1, Options: opts,
		Changes: layer.ChangesData | layer.ChangesAttrs,
		Lacks:   layer.FSTmpfile,
		New: func(l []layer.FS, v registry.Values) (layer.FS, error) {
			fold := v.Duration("fold_delay")
			if fold == 0 {
				fold = -1 // never
			}
			return New(l[0], name, Options{Level: int(v.Int("level")), ChunkSize: v.Int("chunk_size"), FastTails: v.Bool("fast_tails"), FoldDelay: fold})
		},
	})
}

// Codec returns the layer's codec name.
func (fs *FS) Codec() string { return fs.e.kind.Name }

// ---- shared states -------------------------------------------------------

// acquire returns the shared state of path's file, loading it if no handle
// has it open. lf is a lower handle of path, opened read-write if possible;
// it is kept or released.
func (fs *Engine) acquire(ctx context.Context, path string, lf layer.File, ro bool) (*state, layer.File, error) {
	id, a, err := identity(ctx, lf)
	if err != nil {
		lf.Release(ctx)
		return nil, nil, err
	}
	if a != nil {
		fs.dropStale(ctx, id, a)
	}
	if want, ok := ctx.Value(expectID{}).(layer.ID); ok && id != want {
		// path names another file than the caller's attributes did (a
		// rename in between): loading it here could give it a state in
		// an engine that is not its own (a chain's other link).
		lf.Release(ctx)
		return nil, nil, syscall.ESTALE
	}
	fs.mu.Lock()
	for fs.evicting[id] != nil {
		done := fs.evicting[id]
		fs.mu.Unlock()
		<-done
		fs.mu.Lock()
	}
	if st := fs.states[id]; st != nil {
		st.refs++
		fs.unidle(st)
		fs.mu.Unlock()
		st.mu.Lock()
		failed, stro := st.chunks == nil, st.ro
		st.mu.Unlock()
		if failed || stro && !ro {
			lf.Release(ctx)
			fs.put(ctx, st)
			if failed {
				return nil, nil, errors.New("codec: " + path + ": the index could not be loaded")
			}
			return nil, nil, syscall.EACCES
		}
		return st, lf, nil
	}
	st := &state{fs: fs, ino: id, refs: 1, path: path, lower: lf, ro: ro}
	st.mu.Lock()
	fs.states[id] = st
	fs.mu.Unlock()
	err = st.load(ctx)
	if err == nil && st.lost != "" {
		err = fmt.Errorf("codec: %s: %s (cairn fsck --repair --force drops what they may have changed)", path, st.lost)
	}
	if err == nil && st.hdrStale && !st.ro && st.logEnd != 0 {
		// After a crash: record what was replayed, so that stat is cheap.
		// Only a saving: a lower that takes no writes (a full disk, which
		// may be why the header is stale) does not keep the file from
		// being read.
		if serr := st.sync(ctx, false, false); serr != nil {
			fs.log().Warn("codec: cannot record the replayed log", "path", path, "err", serr)
		}
	}
	if err != nil {
		st.chunks = nil
		st.mu.Unlock()
		fs.put(ctx, st)
		return nil, nil, err
	}
	st.restamp(ctx)
	st.mu.Unlock()
	return st, nil, nil
}

// identity is the identity of the regular file lf (EINVAL for another
// kind). A file of another codec engine (the next link of a chain) hands
// down the identity its state is keyed by, which it took from its own
// lower file: through n links, an open stats the stored file once, not n
// times (each through every link below).
// Its attributes come too, when it was stat-ed (nil for a chain's link).
func identity(ctx context.Context, lf layer.File) (layer.ID, *layer.Attr, error) {
	if f, ok := lf.(*File); ok {
		return f.st.ino, nil, nil
	}
	a, err := lf.Getattr(ctx)
	if err != nil {
		return layer.ID{}, nil, err
	}
	if !a.IsRegular() {
		return layer.ID{}, nil, syscall.EINVAL
	}
	return a.ID(), &a, nil
}

// dropStale forgets the state of id if its lower file changed since the
// engine last wrote or read it whole (a is the file's attributes now):
// another client of a shared lower wrote it after this one closed it, and
// the index in memory would read its old chunks. A state with data not yet
// written is kept (two writers at once: not supported, docs/distributed.md).
// A state still referenced (the kernel releases a closed file's handle
// after close returns) lives on apart, released by its last put; the next
// acquire loads the file again. Only for a shared lower.
func (fs *Engine) dropStale(ctx context.Context, id layer.ID, a *layer.Attr) {
	if !fs.shared {
		return
	}
	fs.mu.Lock()
	st := fs.states[id]
	fs.mu.Unlock()
	if st == nil {
		return
	}
	st.mu.Lock()
	stale := st.stampOK && st.stamp != stampOf(a) && len(st.dirty) == 0
	st.mu.Unlock()
	if !stale {
		return
	}
	fs.mu.Lock()
	if fs.states[id] != st {
		fs.mu.Unlock()
		return
	}
	idle := st.idle
	fs.unidle(st)
	st.removed = true
	delete(fs.states, id)
	fs.mu.Unlock()
	if idle {
		st.lower.Release(ctx)
	}
}

// put drops one reference; the last one writes what is in memory and
// releases the lower file.
func (fs *Engine) put(ctx context.Context, st *state) error {
	fs.mu.Lock()
	st.refs--
	last, stale := st.refs == 0, st.removed
	fs.mu.Unlock()
	if !last {
		return nil
	}
	var err error
	fold := false
	st.mu.Lock()
	// A stale state (dropStale) writes nothing: its index is not the
	// file's any more. On a shared lower, a state that close wrote out
	// (Flush: stampOK) is not written again either: another client may
	// have opened the file since close returned, and a compaction or a
	// checkpoint now would change the lower under it.
	if st.chunks != nil && stale && len(st.dirty) > 0 {
		fs.log().Warn("codec: another machine changed the file while it was open here: what was written to it here since may be lost (two writers of one file are not supported)", "path", st.path)
	}
	if st.chunks != nil {
		if !stale && !(fs.shared && st.stampOK) {
			err = st.sync(ctx, false, true)
			if err == nil {
				st.restamp(ctx)
			}
		}
		// No fold on a shared lower: it would change the file in the
		// background, under another client that may have it open.
		fold = err == nil && !stale && !fs.shared && !st.ro && st.hasDeltas()
		// An idle file keeps only its last chunk decoded (an append's).
		last := (st.size - 1) / st.cs
		for c := range st.cache {
			if c != last {
				delete(st.cache, c)
			}
		}
	}
	st.mu.Unlock()
	fs.mu.Lock()
	if st.refs == 0 && st.removed {
		// Dropped as stale while referenced (dropStale).
		fs.mu.Unlock()
		if e := st.lower.Release(ctx); err == nil {
			err = e
		}
		return err
	}
	if st.refs == 0 && !st.removed {
		// On a shared lower a closed file keeps nothing open below: a
		// descriptor kept open for writing is, to a network file system,
		// a writer that other clients wait on (CephFS: the file's caps
		// stay mixed, and 16.2's ceph-fuse can hang another client's read
		// of it for good, docs/distributed.md). The next open loads it
		// again, as it does after another machine's change.
		if err == nil && st.chunks != nil && !fs.shared {
			st.idle, st.idleAt = true, time.Now()
			fs.idle = append(fs.idle, st)
			if fold {
				fs.foldLater(st)
			}
			var evict []*state
			for len(fs.idle) > maxIdle {
				old := fs.idle[0]
				fs.idle = fs.idle[1:]
				old.idle, old.removed = false, true
				delete(fs.states, old.ino)
				evict = append(evict, old)
			}
			var release []*state
			for _, old := range evict {
				if t := fs.timers[old]; t != nil && t.Stop() {
					delete(fs.timers, old)
					if len(fs.evicting) < maxEvictedFolds {
						// Due for a fold: it is done now, in the
						// background, and the file let go of after.
						fs.evicting[old.ino] = make(chan struct{})
						go fs.foldEvicted(old) // takes the timer's count in fs.folding
						continue
					}
					fs.folding.Done() // too many already: left for its next close
				}
				release = append(release, old)
			}
			fs.mu.Unlock()
			for _, old := range release {
				old.lower.Release(ctx)
			}
			return nil
		}
		st.removed = true
		delete(fs.states, st.ino)
		fs.mu.Unlock()
		if e := st.lower.Release(ctx); err == nil {
			err = e
		}
		return err
	}
	fs.mu.Unlock()
	return err
}

// unidle takes st off the idle list; fs.mu is held.
func (fs *Engine) unidle(st *state) {
	if !st.idle {
		return
	}
	st.idle = false
	for i, x := range fs.idle {
		if x == st {
			fs.idle = append(fs.idle[:i], fs.idle[i+1:]...)
			break
		}
	}
}

// Forget forgets the idle state of inode ino (its last name is gone: the
// lower file must not be kept open).
func (fs *Engine) Forget(ctx context.Context, ino layer.ID) {
	fs.mu.Lock()
	st := fs.states[ino]
	if st == nil || !st.idle {
		fs.mu.Unlock()
		return
	}
	fs.unidle(st)
	st.removed = true
	delete(fs.states, ino)
	fs.mu.Unlock()
	st.lower.Release(ctx)
}

// Close releases the files kept open for closed handles, once the folds
// under way are done and those that were due are made.
func (fs *Engine) Close() error {
	fs.mu.Lock()
	fs.closed = true
	var due []*state
	for st, t := range fs.timers {
		if t.Stop() {
			fs.folding.Done()
			if st.idle && !st.removed {
				due = append(due, st)
			}
		}
		delete(fs.timers, st)
	}
	fs.mu.Unlock()
	fs.folding.Wait()
	ctx := layer.AsSelf(context.Background())
	for _, st := range due {
		fs.foldState(ctx, st)
	}
	fs.mu.Lock()
	idle := fs.idle
	fs.idle = nil
	for _, st := range idle {
		st.idle, st.removed = false, true
		delete(fs.states, st.ino)
	}
	fs.mu.Unlock()
	for _, st := range idle {
		st.lower.Release(context.Background())
	}
	return nil
}

// ReportChanges: a fold at rest changes a file's blocks, some seconds
// after its last close (layer.ChangeReporter).
func (fs *FS) ReportChanges(changed func(layer.ID)) { fs.e.report.Store(&changed) }

// Close closes the engine and lets go of the claim on the lower.
func (fs *FS) Close() error {
	err := fs.e.Close()
	fs.rmu.Lock()
	release := fs.release
	fs.release = nil
	fs.rmu.Unlock()
	if release != nil {
		release()
	}
	return err
}

// openLower opens path's lower file read-write when it can.
func (fs *Engine) openLower(ctx context.Context, path string, flags int) (layer.File, bool, error) {
	lf, err := fs.Lower.Open(ctx, path, unix.O_RDWR|flags&unix.O_NOFOLLOW)
	if err == nil {
		return lf, false, nil
	}
	if flags&unix.O_ACCMODE != unix.O_RDONLY || (err != syscall.EACCES && err != syscall.EROFS && err != syscall.EPERM && err != syscall.ETXTBSY) {
		return nil, false, err
	}
	lf, err = fs.Lower.Open(ctx, path, unix.O_RDONLY|flags&unix.O_NOFOLLOW)
	return lf, true, err
}

// openState opens path's state for an operation by path (truncate, stat of
// a file left by a crash).
func (fs *Engine) openState(ctx context.Context, path string, flags int) (*state, error) {
	st, lf, err := fs.openHandle(ctx, path, flags)
	if lf != nil {
		lf.Release(ctx)
	}
	return st, err
}

// openHandle opens path's state; the lower file it returns, if any, is a
// handle of its own for the caller.
func (fs *Engine) openHandle(ctx context.Context, path string, flags int) (*state, layer.File, error) {
	lf, ro, err := fs.openLower(ctx, path, flags)
	if err != nil {
		return nil, nil, err
	}
	return fs.acquire(ctx, path, lf, ro)
}

// ---- path operations -----------------------------------------------------

// Stat gives the logical size of the file whose lower attributes are a,
// without decoding data: from an open state, or from the header.
func (fs *Engine) Stat(ctx context.Context, path string, a *layer.Attr) error {
	if !a.IsRegular() {
		return nil
	}
	fs.dropStale(ctx, a.ID(), a)
	fs.mu.Lock()
	st := fs.states[a.ID()]
	fs.mu.Unlock()
	if st != nil {
		st.mu.Lock()
		a.Size = uint64(st.size)
		st.mu.Unlock()
		return nil
	}
	if a.Size == 0 {
		return nil
	}
	lf, err := layer.OpenNoAtime(ctx, fs.Lower, path, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	area := make([]byte, plainProbe)
	n, err := lf.ReadAt(ctx, area, 0)
	lf.Release(ctx)
	if err != nil && err != io.EOF {
		return err
	}
	if fs.servePlain && isPlainBytes(area[:n]) {
		return nil // a plain file: its size is its own
	}
	if sl, ok := bestSlot(area[:n]); ok && sl.logEnd == int64(a.Size) {
		a.Size = uint64(sl.size)
		return nil
	}
	// The header does not describe the file (a crash): replay its log, if
	// path still names the file of a.
	st, err = fs.openState(context.WithValue(ctx, expectID{}, a.ID()), path, unix.O_RDONLY)
	if err != nil {
		if _, errno := err.(syscall.Errno); errno {
			return err
		}
		// Not a file of this layer, or damaged beyond its log: show it
		// (empty) so that it can be inspected or removed; reads fail.
		fs.log().Warn("codec: cannot read the file's index", "path", path, "err", err)
		a.Size = 0
		return nil
	}
	st.mu.Lock()
	a.Size = uint64(st.size)
	st.mu.Unlock()
	if err := fs.put(ctx, st); err != nil {
		// The size is known; what put could not write (a full disk) is
		// not stat's business.
		fs.log().Warn("codec: cannot write out the file's state", "path", path, "err", err)
	}
	return nil
}

// Truncate sets the logical size of path's file.
func (fs *Engine) Truncate(ctx context.Context, path, name string, size int64) error {
	if fs.servePlain {
		for try := 0; ; try++ {
			lf, _, err := fs.openLower(ctx, path, unix.O_WRONLY)
			if err != nil {
				return err
			}
			id, plain, retry, err := fs.plainOf(ctx, lf)
			if err != nil || (retry && try < 100) {
				lf.Release(ctx)
				if err != nil {
					return err
				}
				continue
			}
			if !plain {
				lf.Release(ctx)
				break
			}
			// A plain file truncated to 0 becomes the engine's (unless
			// it is open); to another size, it stays plain.
			converted := false
			if size == 0 {
				if converted, err = fs.toCodec(ctx, lf, path, id); converted {
					return nil // lf is the engine's now
				}
			}
			if err == nil {
				_, err = lf.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)})
			}
			fs.unplain(id, nil)
			lf.Release(ctx)
			return err
		}
	}
	st, err := fs.openState(ctx, path, unix.O_WRONLY)
	if err != nil {
		return err
	}
	st.mu.Lock()
	took := !st.wlocked
	if err = st.lockWriter(); err == nil {
		err = st.truncate(ctx, size)
	}
	if took && st.wlocked {
		// Written out before the writer lock goes, as a close does.
		if err == nil {
			if err = st.sync(ctx, false, true); err == nil {
				st.restamp(ctx)
			}
		}
		st.unlockWriter()
	}
	st.mu.Unlock()
	if e := fs.put(ctx, st); err == nil {
		err = e
	}
	return err
}

// setTimes are the changes of times that a later write to the lower file
// would undo.
const setTimes = layer.SetAtime | layer.SetMtime | layer.SetAtimeNow | layer.SetMtimeNow

// Settle writes out what the open (or idle) state of the stored file id
// has pending, so that a change of its times or capability is not undone
// by a later write of the engine. A chain settles its links top first (layers/chains), each
// writing what the one above left in it: so a settle does not flush the
// lower after each write (writeLower), which would write every link below
// once for each link above.
func (fs *Engine) Settle(ctx context.Context, id layer.ID) error {
	ctx = context.WithValue(ctx, settling{}, true)
	fs.mu.Lock()
	st := fs.states[id]
	fs.mu.Unlock()
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.sync(ctx, false, true)
}

// settling marks the context of a settle (Settle).
type settling struct{}

// expectID is the identity (layer.ID) that the file an operation by path
// opens must have (Stat).
type expectID struct{}

// lowerFlags are the flags the engine keeps for its own lower handle.
const handleFlags = unix.O_APPEND | unix.O_SYNC | layer.ODsync | unix.O_ACCMODE

func (fs *Engine) Open(ctx context.Context, path, name string, flags int) (layer.File, error) {
	trunc := flags&unix.O_TRUNC != 0 && flags&unix.O_ACCMODE != unix.O_RDONLY
	var st *state
	var lk layer.File
	var err error
	for try := 0; ; try++ {
		lf, ro, err := fs.openLower(ctx, path, flags)
		if err != nil {
			return nil, err
		}
		if fs.servePlain {
			id, plain, retry, err := fs.plainOf(ctx, lf)
			if err != nil {
				lf.Release(ctx)
				return nil, err
			}
			if retry && try < 100 {
				lf.Release(ctx)
				continue
			}
			if plain && trunc {
				// Rewritten from its first byte: it becomes the
				// engine's, unless others have it open.
				converted, err := fs.toCodec(ctx, lf, path, id)
				if err != nil {
					fs.unplain(id, nil)
					lf.Release(ctx)
					return nil, err
				}
				if converted {
					continue // open it as the engine's
				}
			}
			if plain {
				lf.Release(ctx)
				f, retry, err := fs.openPlain(ctx, path, flags, id)
				if retry && try < 100 {
					continue
				}
				return f, err
			}
		}
		st, lk, err = fs.acquire(ctx, path, lf, ro)
		if err != nil {
			return nil, err
		}
		break
	}
	f := &File{fs: fs, st: st, flags: flags & handleFlags, path: path, lk: lk}
	if err := f.openWriter(); err != nil {
		f.Release(ctx)
		return nil, err
	}
	if trunc {
		st.mu.Lock()
		err = st.truncate(ctx, 0)
		st.mu.Unlock()
		if err != nil {
			f.Release(ctx)
			return nil, err
		}
	}
	return f, nil
}

func (fs *Engine) Create(ctx context.Context, path, name string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	lf, a, err := fs.Lower.Create(ctx, path, unix.O_RDWR|flags&(unix.O_EXCL|unix.O_NOFOLLOW), mode)
	if err != nil {
		return nil, a, err
	}
	if fs.servePlain && a.Size > 0 {
		// The file was there (no O_EXCL): it may be plain.
		lf.Release(ctx)
		f, err := fs.Open(ctx, path, name, flags&^(unix.O_CREAT|unix.O_EXCL))
		if err != nil {
			return nil, layer.Attr{}, err
		}
		if a, err = f.Getattr(ctx); err != nil {
			f.Release(ctx)
			return nil, layer.Attr{}, err
		}
		return f, a, nil
	}
	st, lk, err := fs.acquire(ctx, path, lf, false)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	f := &File{fs: fs, st: st, flags: flags & handleFlags, path: path, lk: lk}
	if err := f.openWriter(); err != nil {
		f.Release(ctx)
		return nil, layer.Attr{}, err
	}
	st.mu.Lock()
	if flags&unix.O_TRUNC != 0 {
		err = st.truncate(ctx, 0)
	}
	a.Size = uint64(st.size)
	st.mu.Unlock()
	if err != nil {
		f.Release(ctx)
		return nil, layer.Attr{}, err
	}
	return f, a, nil
}

// ---- one writer per file on a shared lower ---------------------------------

// Two clients of a shared lower that write one file at once would each
// append records at the log end they know, over each other's
// (docs/distributed.md). So on a shared lower a file open for writing
// holds an exclusive flock on its lower file, which every client of the
// file system sees (GlusterFS and CephFS pass flock to their servers), and
// another client's open for writing is refused with EBUSY while it is held.
// It is let go of at each close (Flush) once everything is written, so that
// another machine may open the file for writing as soon as close(2)
// returns here, and taken again by a later write through a handle still
// open here (which then fails with EBUSY if another client writes now).
// Readers take no lock: they see the file as of their open (close-to-open).

// openWriter takes the writer lock for a new handle open for writing.
func (f *File) openWriter() error {
	if !f.fs.shared || f.flags&unix.O_ACCMODE == unix.O_RDONLY {
		return nil
	}
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.lockWriter(); err != nil {
		return err
	}
	s.writers++
	f.writer = true
	return nil
}

// lockWriter takes the writer lock, if the lower is shared and this state
// does not hold it; s.mu is held. EBUSY: another client holds it.
func (s *state) lockWriter() error {
	if !s.fs.shared || s.wlocked {
		return nil
	}
	var err error
	if !layer.LendFd(s.lower, func(fd int) { err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) }) {
		return nil // no descriptor below (a chain's link): nothing to lock
	}
	switch {
	case err == unix.EWOULDBLOCK:
		s.fs.log().Warn("codec: another client writes this file; refused (one writer per file on a shared lower: docs/distributed.md)", "path", s.path)
		return syscall.EBUSY
	case err != nil:
		// A lower without locks: served, as before the lock existed.
		if !s.fs.noLocks.Swap(true) {
			s.fs.log().Warn("codec: the lower takes no locks: two clients writing one file are not detected", "path", s.path, "err", err)
		}
		return nil
	}
	s.wlocked = true
	return nil
}

// unlockWriter lets go of the writer lock; s.mu is held.
func (s *state) unlockWriter() {
	if !s.wlocked {
		return
	}
	layer.LendFd(s.lower, func(fd int) { unix.Flock(fd, unix.LOCK_UN) })
	s.wlocked = false
}
