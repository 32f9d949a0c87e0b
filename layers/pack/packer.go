package pack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Packing. A directory where a file was closed, created or renamed into is
// dirty; Delay after, it is listed, and every regular file there with one
// link, a size from 1 to MaxSize, no handle open through the layer and no
// change for Delay is packed, in one batch: the records appended to the
// directory's pack, the pack made durable (one fdatasync per batch; the
// batches of several directories run at once), then each file's ref set
// and the file truncated to 0 with its times put back. A crash at any
// point leaves every file readable with its bytes (docs/pack.md, "Crash
// safety").

// workers bounds the directories packed at once.
const workers = 8

// loop runs the passes until Close.
func (fs *FS) loop() {
	defer close(fs.done)
	tick := min(max(fs.o.Delay/4, 10*time.Millisecond), time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-fs.quit:
			return
		case <-t.C:
			fs.pass(false)
		}
	}
}

// pass packs the directories that are due (all, if final), and compacts
// those with garbage.
func (fs *FS) pass(final bool) {
	fs.passMu.Lock() // one at a time: a pass waits for the one under way
	defer fs.passMu.Unlock()
	now := time.Now()
	fs.mu.Lock()
	var due []string
	for _, dir := range sortedKeys(fs.dirty) {
		if final || !fs.dirty[dir].After(now) {
			due = append(due, dir)
			delete(fs.dirty, dir)
		}
	}
	var compact []string
	for _, dir := range sortedKeys(fs.garbage) {
		if fs.garbage[dir] >= fs.o.CompactMin || final && fs.garbage[dir] > 0 {
			compact = append(compact, dir)
			delete(fs.garbage, dir)
		}
	}
	fs.mu.Unlock()
	if fs.off.Load() {
		due = nil
	}
	jobs := make(chan func())
	var wg sync.WaitGroup
	for range min(workers, len(due)+len(compact)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				j()
			}
		}()
	}
	ctx := layer.AsSelf(context.Background())
	for _, dir := range due {
		jobs <- func() {
			err := fs.packDir(ctx, dir, final)
			if errors.Is(err, syscall.EROFS) {
				fs.turnOff("the lower is read-only")
			} else if err != nil && !errors.Is(err, syscall.ENOENT) {
				fs.log.Warn("pack: cannot pack the small files of a directory (they stay as they are)", "dir", dir, "err", err)
			}
		}
	}
	for _, dir := range compact {
		jobs <- func() {
			_, need, err := fs.compactDir(ctx, dir, false)
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				fs.log.Warn("pack: cannot compact a directory's packs", "dir", dir, "err", err)
			}
			if need > 0 {
				// Looked at again once that many more bytes are dead.
				fs.mu.Lock()
				fs.garbage[dir] += fs.o.CompactMin - need
				fs.mu.Unlock()
			}
		}
	}
	close(jobs)
	wg.Wait()
}

// hasCapability reports whether path carries a file capability.
func (fs *FS) hasCapability(ctx context.Context, path string) bool {
	_, err := fs.Lower.Getxattr(ctx, path, "security.capability", nil)
	return err == nil
}

// candidate is a file of a batch.
type candidate struct {
	name string
	a    layer.Attr
	data []byte
	r    ref
}

// packDir packs dir's small files left alone (all closed ones, if final).
func (fs *FS) packDir(ctx context.Context, dir string, final bool) error {
	fs.renameMu.RLock()
	defer fs.renameMu.RUnlock()
	d := fs.lockDir(dir)
	defer fs.unlockDir(d)
	ents, err := fs.Lower.ReadDir(ctx, dir, true)
	if err != nil {
		return err
	}
	now := time.Now()
	var cands []*candidate
	var cur uint64
	var curSize int64 = -1
	var later time.Time
	for _, e := range ents {
		if n, ok := packNumber(e.Name); ok {
			if e.Attr != nil && (curSize < 0 || n > cur) {
				cur, curSize = n, int64(e.Attr.Size)
			}
			continue
		}
		a := e.Attr
		if a == nil || reservedName(e.Name) || !a.IsRegular() || a.Nlink != 1 || a.Size == 0 || int64(a.Size) > fs.o.MaxSize {
			continue
		}
		// The truncation (and an unpack's write) would take a file's
		// set-id bits (from a daemon that is not root) and its file
		// capability away.
		if a.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 || fs.hasCapability(ctx, layer.Join(dir, e.Name)) {
			continue
		}
		at := time.Unix(a.Ctime.Unix())
		if n := fs.node(a.ID()); n != nil {
			n.mu.Lock()
			pinned := n.pinned > 0
			n.mu.Unlock()
			if pinned {
				n.skipped.Store(true) // its release makes the directory dirty again
				continue
			}
			if u := time.Unix(0, n.lastUse.Load()); u.After(at) {
				at = u
			}
		}
		if at = at.Add(fs.o.Delay); !final && at.After(now) {
			if later.IsZero() || at.After(later) {
				later = at
			}
			continue
		}
		cands = append(cands, &candidate{name: e.Name, a: *a})
	}
	if !later.IsZero() {
		fs.mu.Lock()
		if t, ok := fs.dirty[dir]; !ok || t.Before(later) {
			fs.dirty[dir] = later
		}
		fs.mu.Unlock()
	}
	// Read them; a file that carries a ref (an unpack a crash cut) is
	// made whole first.
	var batch []*candidate
	for _, c := range cands {
		p := layer.Join(dir, c.name)
		if r, ok, err := fs.getRef(ctx, p); err != nil {
			continue
		} else if ok {
			if err := fs.resolve(ctx, p, &c.a, r); err != nil {
				continue
			}
			if c.a, err = fs.Lower.Getattr(ctx, p); err != nil {
				continue
			}
		}
		b, err := readSmall(ctx, fs.Lower, p, int64(c.a.Size))
		if err != nil {
			continue
		}
		c.data = b
		batch = append(batch, c)
	}
	if len(batch) == 0 {
		return nil
	}
	// Append the records, durably.
	sctx := layer.AsSelf(ctx)
	created := false
	if curSize < int64(len(packMagic)) {
		if curSize >= 0 {
			cur++ // a pack cut short at its creation: start another
		}
		pf, _, err := fs.Lower.Create(sctx, layer.Join(dir, packName(cur)), unix.O_WRONLY|unix.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := pf.WriteAt(sctx, packMagic, 0); err != nil {
			pf.Release(sctx)
			return err
		}
		pf.Release(sctx)
		curSize, created = int64(len(packMagic)), true
	}
	if !fs.canPack(sctx, layer.Join(dir, packName(cur))) {
		if created {
			fs.Lower.Unlink(sctx, layer.Join(dir, packName(cur)))
		}
		return nil
	}
	var buf []byte
	for _, c := range batch {
		off := curSize + int64(len(buf)) + recordHdr
		buf = append(buf, record(c.data, c.a.Ino)...)
		c.r = ref{pack: cur, off: off, n: int64(len(c.data)), crc: crcOf(c.data)}
	}
	pf, err := fs.Lower.Open(sctx, layer.Join(dir, packName(cur)), unix.O_WRONLY)
	if err != nil {
		return err
	}
	k, err := pf.WriteAt(sctx, buf, curSize)
	if err == nil && k != len(buf) {
		err = syscall.EIO
	}
	if err == nil {
		err = pf.Fsync(sctx, true)
	}
	pf.Release(sctx)
	if err != nil {
		return err
	}
	if created {
		if err := fs.Lower.SyncDir(sctx, dir); err != nil {
			return err
		}
	}
	// Point each file at its record, then empty it.
	for _, c := range batch {
		if err := fs.packOne(sctx, dir, c, final); err != nil {
			if errors.Is(err, errStop) {
				return nil
			}
			fs.log.Warn("pack: cannot pack a file (it stays as it is)", "path", layer.Join(dir, c.name), "err", err)
		}
	}
	return nil
}

var errStop = errors.New("packing turned off")

// canPack checks, once, on the pack at path, that the lower keeps the
// layer's xattr, and that its files can be opened again from their
// descriptors and give one (layer.FileReopener, PassthroughFd), which
// unpacking through a file open through the layer needs (local's files
// have them). If not, it turns packing off.
func (fs *FS) canPack(ctx context.Context, path string) bool {
	fs.probe.Do(func() {
		err := fs.Lower.Setxattr(ctx, path, XattrName, ref{off: 24, n: 1}.encode(), 0)
		if err == nil {
			err = fs.Lower.Removexattr(ctx, path, XattrName)
		}
		if err != nil {
			fs.turnOff(fmt.Sprintf("the lower file system keeps no %s xattr (%v)", XattrName, err))
			return
		}
		f, err := fs.Lower.Open(ctx, path, unix.O_RDONLY)
		if err == nil {
			var g layer.File
			if g, err = layer.ReopenFile(ctx, f, unix.O_RDONLY); err == nil {
				if !layer.LendFd(g, func(int) {}) {
					err = errors.New("its files give no descriptor")
				}
				g.Release(ctx)
			}
			f.Release(ctx)
		}
		if err != nil {
			fs.turnOff(fmt.Sprintf("the lower's files cannot be opened again by descriptor, which unpacking an open file needs (%v)", err))
		}
	})
	return !fs.off.Load()
}

// packOne sets c's ref and empties it; the directory's lock is held.
func (fs *FS) packOne(ctx context.Context, dir string, c *candidate, final bool) error {
	p := layer.Join(dir, c.name)
	// A file open through the layer: its reads and writes wait, and
	// read its bytes from memory after (see node).
	n := fs.node(c.a.ID())
	if n != nil {
		n.io.Lock()
		defer n.io.Unlock()
		n.mu.Lock()
		defer n.mu.Unlock()
		if n.pinned > 0 || n.packed || time.Since(time.Unix(0, n.lastUse.Load())) < fs.o.Delay && !final {
			return nil
		}
	}
	// The file may have changed since it was read (through a file open
	// through the layer before the lock above, or by another process
	// below): then it is left for another pass.
	a, err := fs.Lower.Getattr(ctx, p)
	if err != nil {
		return err
	}
	if a.ID() != c.a.ID() || a.Size != c.a.Size || a.Mtime != c.a.Mtime || a.Ctime != c.a.Ctime || a.Nlink != 1 {
		return nil
	}
	if err := fs.Lower.Setxattr(ctx, p, XattrName, c.r.encode(), 0); err != nil {
		if err == syscall.ENOTSUP || err == syscall.EOPNOTSUPP {
			fs.turnOff(fmt.Sprintf("the lower file system keeps no %s xattr (%v)", XattrName, err))
			return errStop
		}
		return err
	}
	b, err := fs.Lower.Setattr(ctx, p, &layer.SetAttr{Valid: layer.SetSize | layer.SetAtime | layer.SetMtime, Atime: a.Atime, Mtime: a.Mtime})
	if err != nil {
		// Still its own bytes with a ref that says them: readable.
		fs.Lower.Removexattr(ctx, p, XattrName)
		return err
	}
	if n != nil {
		n.packed, n.data, n.dir = true, c.data, dir
	}
	fs.changed(a.ID())
	if b.Blocks != 0 {
		fs.turnOff(fmt.Sprintf("an emptied file with its %s xattr still takes %d blocks: the file system keeps the xattr in a block of its own", XattrName, b.Blocks))
		return errStop
	}
	return nil
}

// readSmall reads the whole lower file at path, of size n.
func readSmall(ctx context.Context, lower layer.FS, path string, n int64) ([]byte, error) {
	f, err := layer.OpenNoAtime(ctx, lower, path, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, err
	}
	defer f.Release(ctx)
	b := make([]byte, n+1)
	k, err := f.ReadAt(ctx, b, 0)
	if int64(k) != n {
		return nil, fmt.Errorf("read %d bytes of %d (%v)", k, n, err)
	}
	return b[:n], nil
}

// dirPacks is what a listing of a directory says of its packs.
type dirPacks struct {
	sizes map[uint64]int64 // pack sizes by number
	live  map[uint64]int64 // bytes referenced (records included)
	refs  map[string]ref   // the packed files, by name
	bad   []string         // packed files whose ref is malformed
	max   uint64
}

// scanDir lists dir's packs and packed files.
func (fs *FS) scanDir(ctx context.Context, dir string) (*dirPacks, error) {
	ents, err := fs.Lower.ReadDir(ctx, dir, true)
	if err != nil {
		return nil, err
	}
	s := &dirPacks{sizes: map[uint64]int64{}, live: map[uint64]int64{}, refs: map[string]ref{}}
	for _, e := range ents {
		if n, ok := packNumber(e.Name); ok {
			if e.Attr != nil {
				s.sizes[n] = int64(e.Attr.Size)
			}
			s.max = max(s.max, n)
			continue
		}
		if e.Attr == nil || !e.Attr.IsRegular() || e.Attr.Size != 0 || reservedName(e.Name) {
			continue
		}
		r, ok, err := fs.getRef(ctx, layer.Join(dir, e.Name))
		if err == errBadRef {
			s.bad = append(s.bad, e.Name)
			continue
		}
		if err != nil || !ok {
			continue
		}
		s.refs[e.Name] = r
		s.live[r.pack] += r.n + recordHdr
	}
	return s, nil
}

// compactDir compacts dir's packs if their dead bytes are more than the
// live ones and than CompactMin (any dead bytes, if force), and removes
// packs no file refers to. It says what it did, or how many more bytes
// must be dead before it would.
func (fs *FS) compactDir(ctx context.Context, dir string, force bool) (what string, need int64, err error) {
	fs.renameMu.RLock()
	defer fs.renameMu.RUnlock()
	d := fs.lockDir(dir)
	defer fs.unlockDir(d)
	s, err := fs.scanDir(ctx, dir)
	if err != nil {
		return "", 0, err
	}
	var total, live int64
	for n, size := range s.sizes {
		total += size - int64(len(packMagic))
		live += s.live[n]
	}
	dead := total - live
	sctx := layer.AsSelf(ctx)
	if len(s.refs) == 0 && len(s.bad) == 0 {
		// No file refers to any: remove them all.
		for n := range s.sizes {
			if err := fs.Lower.Unlink(sctx, layer.Join(dir, packName(n))); err != nil && err != syscall.ENOENT {
				return "", 0, err
			}
		}
		if len(s.sizes) == 0 {
			return "", 0, nil
		}
		return fmt.Sprintf("removed %d unreferenced pack(s)", len(s.sizes)), 0, nil
	}
	if dead <= 0 || !force && (dead <= live || dead < fs.o.CompactMin) {
		// Each byte that dies more is one dead more and one live less.
		return "", max((live-dead)/2+1, fs.o.CompactMin-dead, 1), nil
	}
	// Copy the live records into a new pack.
	next := s.max + 1
	var buf []byte
	buf = append(buf, packMagic...)
	repoint := map[string]ref{}
	for _, name := range sortedKeys(s.refs) {
		r := s.refs[name]
		data, err := fs.readRecord(sctx, dir, r)
		if err != nil {
			// Damaged: its record stays where it is (fsck reports it).
			continue
		}
		a, err := fs.Lower.Getattr(sctx, layer.Join(dir, name))
		if err != nil {
			continue
		}
		off := int64(len(buf)) + recordHdr
		buf = append(buf, record(data, a.Ino)...)
		repoint[name] = ref{pack: next, off: off, n: r.n, crc: r.crc}
	}
	np := layer.Join(dir, packName(next))
	pf, _, err := fs.Lower.Create(sctx, np, unix.O_WRONLY|unix.O_EXCL, 0o600)
	if err != nil {
		return "", 0, err
	}
	k, err := pf.WriteAt(sctx, buf, 0)
	if err == nil && k != len(buf) {
		err = syscall.EIO
	}
	if err == nil {
		err = pf.Fsync(sctx, true)
	}
	pf.Release(sctx)
	if err == nil {
		err = fs.Lower.SyncDir(sctx, dir)
	}
	if err != nil {
		fs.Lower.Unlink(sctx, np)
		return "", 0, err
	}
	keep := map[uint64]bool{next: true}
	for name, r := range repoint {
		if err := fs.Lower.Setxattr(sctx, layer.Join(dir, name), XattrName, r.encode(), layer.XattrReplace); err != nil {
			keep[s.refs[name].pack] = true
		}
	}
	for name, r := range s.refs {
		if _, ok := repoint[name]; !ok {
			keep[r.pack] = true // damaged, or gone meanwhile
		}
	}
	removed := 0
	for n := range s.sizes {
		if !keep[n] && len(s.bad) == 0 {
			if err := fs.Lower.Unlink(sctx, layer.Join(dir, packName(n))); err == nil {
				removed++
			}
		}
	}
	// Open packed files keep their bytes in memory: nothing to move.
	return fmt.Sprintf("compacted %d dead bytes: %d live record(s) moved to %s, %d pack(s) removed", dead, len(repoint), packName(next), removed), 0, nil
}
