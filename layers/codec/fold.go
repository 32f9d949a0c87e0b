package codec

import (
	"context"
	"time"

	"cairnfs.dev/cairn/layer"
)

// Folding at rest. Fast tails make an append cheap: the new bytes go to
// the log unencoded (a delta record), until their chunk fills; a write in
// the middle of a chunk the log holds is a delta too (see deltaable). A
// file that is appended to or written in the middle and then left alone
// (a log, a file written in several opens) would keep them unencoded for
// good. So once a file with deltas
// has had no handle open for FoldDelay, its chunks with deltas are encoded
// again whole and the file compacted, in the background: the deltas and
// the records they amended give their space back. Its times are kept (the
// fold is not a change of the file; its ctime moves, as a chattr's would).
// A file evicted from the idle states before its fold is folded at once,
// in the background, and let go of after. At most two folds run at a
// time; an unmount waits for those under way and makes those that are due.

// hasDeltas reports whether a chunk carries deltas; s.mu is held.
func (s *state) hasDeltas() bool {
	for _, ops := range s.chunks {
		if chunkHasDelta(ops) {
			return true
		}
	}
	return false
}

// foldLater schedules st's fold; fs.mu is held.
func (fs *Engine) foldLater(st *state) {
	if fs.foldDelay < 0 || fs.closed || fs.timers[st] != nil {
		return
	}
	fs.folding.Add(1)
	fire := func() {
		fs.mu.Lock()
		t := fs.timers[st]
		if t == nil {
			fs.mu.Unlock()
			fs.folding.Done()
			return // stopped meanwhile
		}
		// (After Close began too: Close waits for this fold before it
		// lets go of the idle files.)
		if !st.idle || st.removed {
			delete(fs.timers, st)
			fs.mu.Unlock()
			fs.folding.Done()
			return // in use again: folded at its next close
		}
		if wait := fs.foldDelay - time.Since(st.idleAt); wait > 0 && !fs.closed {
			// Opened and closed again since the timer was set: the
			// fold is due FoldDelay after the last close.
			t.Reset(wait)
			fs.mu.Unlock()
			return
		}
		delete(fs.timers, st)
		defer fs.folding.Done()
		fs.unidle(st)
		st.refs++
		fs.mu.Unlock()
		ctx := layer.AsSelf(context.Background())
		fs.foldState(ctx, st)
		fs.put(ctx, st)
	}
	fs.timers[st] = time.AfterFunc(fs.foldDelay, fire)
}

// maxEvictedFolds bounds the states let go of that wait for their fold,
// each with its lower file open: past it, a file let go of keeps its fast
// tails until its next close.
const maxEvictedFolds = 16

// foldEvicted folds st, taken off the idle states, and lets go of its
// lower file.
func (fs *Engine) foldEvicted(st *state) {
	defer fs.folding.Done()
	ctx := layer.AsSelf(context.Background())
	fs.foldState(ctx, st)
	st.lower.Release(ctx)
	fs.mu.Lock()
	close(fs.evicting[st.ino])
	delete(fs.evicting, st.ino)
	fs.mu.Unlock()
}

func (fs *Engine) foldState(ctx context.Context, st *state) {
	fs.foldSem <- struct{}{}
	defer func() { <-fs.foldSem }()
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.fold(ctx); err != nil {
		fs.log().Warn("codec: cannot fold the file's fast tails (it stays readable as it is)", "path", st.path, "err", err)
		return
	}
	if r := fs.report.Load(); r != nil {
		(*r)(st.ino) // its blocks changed
	}
}

// fold encodes again each chunk that carries deltas, compacts the log and
// puts the file's times back; s.mu is held.
func (s *state) fold(ctx context.Context) error {
	if s.ro || s.broken != nil || s.chunks == nil || !s.hasDeltas() {
		return nil
	}
	a, err := s.lower.Getattr(ctx)
	if err != nil {
		return err
	}
	var cs []int64
	for _, c := range s.order() {
		if chunkHasDelta(s.chunks[c]) {
			cs = append(cs, c)
		}
	}
	// Writes in the middle leave deltas on any number of chunks: they are
	// decoded and encoded a few at a time (as many as may be dirty), not
	// all in memory at once.
	opened := false
	for len(cs) > 0 {
		n := min(len(cs), s.maxDirty())
		for _, c := range cs[:n] {
			b, err := s.content(ctx, c)
			if err != nil {
				return err
			}
			delete(s.cache, c)
			s.dirty[c] = &dirty{buf: b, loaded: true, whole: true, orig: len(b)}
		}
		if err := s.persist(ctx, cs[:n]); err != nil {
			return err
		}
		cs = cs[n:]
		if len(cs) > 0 && s.openedAgain() {
			// The opener waits for s.mu: the rest is folded after
			// its next close (a fold of a big file written all over
			// takes a chunk's encoding per chunk), and so is the
			// compaction.
			opened = true
			break
		}
	}
	// A small file (a log under 1 MiB) is compacted as soon as most of it
	// is dead, which the fold just made it; a larger one as usual.
	if !opened && (s.shouldCompact() || s.logEnd < s.fs.compactMin && s.logEnd-headerSize-s.live > s.live) {
		if err := s.compact(ctx); err != nil {
			return err
		}
	}
	if err := s.sync(ctx, false, false); err != nil {
		return err
	}
	_, err = s.lower.Setattr(ctx, &layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime, Atime: a.Atime, Mtime: a.Mtime})
	return err
}

// openedAgain says whether a handle has opened the file since its fold
// began (a fold after FoldDelay holds one reference of its own).
func (s *state) openedAgain() bool {
	s.fs.mu.Lock()
	defer s.fs.mu.Unlock()
	return s.refs > 1
}

func chunkHasDelta(ops []op) bool {
	for _, o := range ops {
		if o.kind == opDelta {
			return true
		}
	}
	return false
}
