package replica

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Stats count what a resync did.
type Stats struct {
	Copied  int64 // objects copied (files, links, nodes, directories made)
	Removed int64 // objects removed from the target
	Renamed int64 // objects renamed on the target (a directory with all in it)
	Bytes   int64 // bytes of file data copied
	Checked int64 // objects compared
	// Diverged says which replicas were found changed outside cairn (one
	// line each), before the resync compared them in full.
	Diverged []string
}

// Progress is told how many objects were compared, out of how many (a full
// resync counts them first; otherwise total is 0).
type Progress func(done, total int64)

// Resync is ResyncStats for cairn resync (layer.Resyncer): what it did, in
// one line.
func (fs *FS) Resync(ctx context.Context, full bool, progress func(done, total int64)) (string, error) {
	st, err := fs.ResyncStats(ctx, full, progress)
	pre := ""
	for _, m := range st.Diverged {
		pre += "replica: " + m + "\n"
	}
	return pre + fmt.Sprintf("replica: %d objects compared, %d copied (%d bytes), %d renamed, %d removed; replicas degraded now: %s",
		st.Checked, st.Copied, st.Bytes, st.Renamed, st.Removed, fs.degradedText()), err
}

func (fs *FS) degradedText() string {
	var s []string
	for i := range fs.r {
		if !fs.Healthy(i) {
			s = append(s, fmt.Sprint(i+1))
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// ResyncStats brings the degraded replicas back: it copies to each, from the
// first healthy replica, what the dirty log marks as changed (every object
// with full), verified by size, modification time and, for marked files
// (every file with full), a hash of the contents, and clears the marks as
// it goes, so that a resync that stops (a crash) resumes where it stopped.
// It locks the replicas, so it refuses a mounted stack. With full it also
// makes replicas that are not of one set (a first mount of different
// trees) copies of the first replica.
func (fs *FS) ResyncStats(ctx context.Context, full bool, progress Progress) (Stats, error) {
	ctx = layer.AsSelf(ctx)
	var st Stats
	if err := fs.lock(ctx); err != nil {
		return st, err
	}
	err := fs.load(ctx, false)
	var de *DivergedError
	if fs.o.Verify && err == nil {
		// Changes made outside cairn since the last clean unmount: the
		// replicas found changed are degraded and compared in full.
		c, _, err := fs.prepare(ctx)
		if err != nil {
			return st, err
		}
		st.Diverged = fs.verify(ctx, c, false)
	}
	if errors.As(err, &de) && full {
		err = nil
		fs.degraded.Store(0)
	}
	if err != nil {
		return st, err
	}
	// The seals go before anything changes (a resync that stops leaves
	// none).
	fs.mu.Lock()
	err = fs.saveState(ctx)
	fs.mu.Unlock()
	if err != nil {
		return st, err
	}
	targets := fs.degraded.Load()
	src := fs.primary()
	if full {
		targets = (1<<len(fs.r) - 1) &^ (1 << src)
		// Until each is done, it is degraded: the state written meanwhile
		// must not call it in step.
		fs.degraded.Store(targets)
	}
	var total int64
	if (full || fs.state.Diverged&targets != 0) && progress != nil {
		total = count(ctx, fs.r[src], "")
	}
	for k := range fs.r {
		if k == src || targets&(1<<k) == 0 {
			continue
		}
		r := &resyncer{fs: fs, src: src, k: k, full: full || fs.state.Diverged&(1<<k) != 0, st: &st, links: map[layer.ID]string{}, progress: progress, total: total, from: map[string]bool{}}
		if err := r.moves(ctx); err != nil {
			return st, fmt.Errorf("replica: resync of replica %d from replica %d: %w", k+1, src+1, err)
		}
		if err := r.dir(ctx, ""); err != nil {
			return st, fmt.Errorf("replica: resync of replica %d from replica %d: %w", k+1, src+1, err)
		}
		fs.mu.Lock()
		fs.degraded.Store(fs.degraded.Load() &^ (1 << k))
		fs.state.Diverged &^= 1 << k
		if fs.state.Set == "" {
			fs.state = state{Set: newSetID(), N: len(fs.r)}
		}
		err := fs.saveState(ctx)
		fs.mu.Unlock()
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

func count(ctx context.Context, l layer.FS, p string) int64 {
	ents, err := l.ReadDir(ctx, p, false)
	if err != nil {
		return 0
	}
	n := int64(0)
	for _, e := range ents {
		if hidden(layer.Join(p, e.Name)) {
			continue
		}
		n++
		if e.Mode&unix.S_IFMT == unix.S_IFDIR {
			n += count(ctx, l, layer.Join(p, e.Name))
		}
	}
	return n
}

type resyncer struct {
	fs       *FS
	src, k   int
	full     bool
	st       *Stats
	links    map[layer.ID]string // files of several links copied, by source identity
	progress Progress
	total    int64
	from     map[string]bool // paths with a from mark for the target (moves)
}

func (r *resyncer) S() layer.FS { return r.fs.r[r.src] }
func (r *resyncer) T() layer.FS { return r.fs.r[r.k] }

// unmark clears the target's bit of path's mark on the replicas that are
// not degraded.
func (r *resyncer) unmark(ctx context.Context, path string) error {
	for i := range r.fs.r {
		if i == r.k || !r.fs.Healthy(i) {
			continue
		}
		if r.from[path] {
			if err := r.fs.meta[i].Remove(ctx, path, fromKey(r.k)); err != nil && !errors.Is(err, layer.ENOATTR) {
				return err
			}
		}
		if m := r.fs.getMark(ctx, i, path); m&(1<<r.k) != 0 {
			if err := r.fs.setMark(ctx, i, path, m&^(1<<r.k)); err != nil {
				return err
			}
		}
	}
	return nil
}

// move is a rename the target missed: the object at from on the target is
// the source's at to.
type move struct {
	from, to string
	tmp      string // where it waits on the target
}

func depth(p string) int {
	if p == "" {
		return 0
	}
	return strings.Count(p, "/") + 1
}

// moves renames on the target what was renamed while it was away (the
// from marks, dirty.go), before the walk compares and copies: the objects
// are found in the marked directories of the source; each is moved on the
// target from its old path to a temporary name in the root (the deepest
// first, so that a renamed directory's renamed entries leave it first),
// then from there to its new path (the shallowest first, so that a renamed
// entry of a renamed directory finds it in place; a missing parent, a
// directory made meanwhile, is made). What is at the new path on the
// target is removed first: it is not the source's object there. The walk
// then verifies each as a changed object. An old path that is not there,
// or holds another type, leaves the object to be copied; a temporary name
// left by a crash is removed by the walk.
func (r *resyncer) moves(ctx context.Context) error {
	var ms []*move
	var walk func(p string) error
	walk = func(p string) error {
		ents, err := names(ctx, r.S(), p)
		if err != nil {
			return err
		}
		for name, typ := range ents {
			cp := layer.Join(p, name)
			if v, err := r.fs.meta[r.src].Get(ctx, cp, fromKey(r.k)); err == nil {
				r.from[cp] = true
				if o := string(v); o != newObj && o != cp {
					ms = append(ms, &move{from: o, to: cp})
				}
			}
			if typ == unix.S_IFDIR && r.fs.getMark(ctx, r.src, cp)&(1<<r.k) != 0 {
				if err := walk(cp); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if r.fs.getMark(ctx, r.src, "")&(1<<r.k) == 0 {
		return nil
	}
	if err := walk(""); err != nil {
		return err
	}
	T := r.T()
	slices.SortFunc(ms, func(a, b *move) int { return depth(b.from) - depth(a.from) })
	for n, m := range ms {
		sa, err1 := r.S().Getattr(ctx, m.to)
		ta, err2 := T.Getattr(ctx, m.from)
		if err1 != nil || err2 != nil || sa.Mode&unix.S_IFMT != ta.Mode&unix.S_IFMT {
			continue
		}
		tmp := fmt.Sprintf("%smv.%d", tmpPrefix, n)
		removeAll(ctx, T, tmp)
		if err := T.Rename(ctx, m.from, tmp, 0); err != nil {
			return err
		}
		m.tmp = tmp
	}
	slices.SortFunc(ms, func(a, b *move) int { return depth(a.to) - depth(b.to) })
	for _, m := range ms {
		if m.tmp == "" {
			continue
		}
		if err := r.mkdirs(ctx, parent(m.to)); err != nil {
			return err
		}
		if _, err := T.Getattr(ctx, m.to); err == nil {
			if err := removeAll(ctx, T, m.to); err != nil {
				return err
			}
			r.st.Removed++
		}
		if err := T.Rename(ctx, m.tmp, m.to, 0); err != nil {
			return err
		}
		r.st.Renamed++
	}
	return nil
}

// mkdirs makes directory p and those above it on the target where they
// are missing (or of another type), as the source's (the walk then makes
// their attributes the source's).
func (r *resyncer) mkdirs(ctx context.Context, p string) error {
	ta, err := r.T().Getattr(ctx, p)
	if err == nil && ta.IsDir() {
		return nil
	}
	if err == nil {
		if err := removeAll(ctx, r.T(), p); err != nil {
			return err
		}
		r.st.Removed++
	}
	if err := r.mkdirs(ctx, parent(p)); err != nil {
		return err
	}
	sa, err := r.S().Getattr(ctx, p)
	if err != nil {
		return err
	}
	if _, err := r.T().Mkdir(ctx, p, sa.Mode&0o7777); err != nil {
		return err
	}
	r.st.Copied++
	return nil
}

func names(ctx context.Context, l layer.FS, p string) (map[string]uint32, error) {
	ents, err := l.ReadDir(ctx, p, false)
	if err != nil {
		return nil, err
	}
	m := map[string]uint32{}
	for _, e := range ents {
		if !hidden(layer.Join(p, e.Name)) { // each replica's own
			m[e.Name] = e.Mode & unix.S_IFMT
		}
	}
	return m, nil
}

// dir brings directory p of the target up to date with the source's: the
// entries, then what is marked below (everything with full), then its own
// attributes; then its mark is cleared.
func (r *resyncer) dir(ctx context.Context, p string) error {
	S, T := r.S(), r.T()
	se, err := names(ctx, S, p)
	if err != nil {
		return err
	}
	te, err := names(ctx, T, p)
	if err != nil {
		return err
	}
	for name := range te {
		if _, ok := se[name]; !ok || isTmp(name) {
			if err := removeAll(ctx, T, layer.Join(p, name)); err != nil {
				return err
			}
			r.st.Removed++
		}
	}
	sorted := make([]string, 0, len(se))
	for name := range se {
		sorted = append(sorted, name)
	}
	slices.Sort(sorted)
	for _, name := range sorted {
		if isTmp(name) {
			continue
		}
		if err := r.entry(ctx, layer.Join(p, name)); err != nil {
			return err
		}
	}
	sa, err := S.Getattr(ctx, p)
	if err != nil {
		return err
	}
	ta, err := T.Getattr(ctx, p)
	if err != nil {
		return err
	}
	if err := r.meta(ctx, p, &sa, &ta); err != nil {
		return err
	}
	return r.unmark(ctx, p)
}

func isTmp(name string) bool {
	return len(name) >= len(tmpPrefix) && name[:len(tmpPrefix)] == tmpPrefix
}

// entry brings one entry up to date.
func (r *resyncer) entry(ctx context.Context, p string) error {
	S, T := r.S(), r.T()
	if err := ctx.Err(); err != nil {
		return err // interrupted: the marks left say what remains
	}
	r.st.Checked++
	if r.progress != nil {
		r.progress(r.st.Checked, r.total)
	}
	sa, err := S.Getattr(ctx, p)
	if err != nil {
		return err
	}
	marked := r.full || r.fs.getMark(ctx, r.src, p)&(1<<r.k) != 0
	ta, terr := T.Getattr(ctx, p)
	if terr == nil && ta.Mode&unix.S_IFMT != sa.Mode&unix.S_IFMT {
		if err := removeAll(ctx, T, p); err != nil {
			return err
		}
		r.st.Removed++
		terr = syscall.ENOENT
	}
	switch {
	case terr != nil:
		if err := r.copy(ctx, p, &sa); err != nil {
			return err
		}
	case sa.IsDir():
		if marked {
			if err := r.dir(ctx, p); err != nil {
				return err
			}
		} else if err := r.meta(ctx, p, &sa, &ta); err != nil {
			return err
		}
	default:
		same, err := r.same(ctx, p, &sa, &ta, marked)
		if err != nil {
			return err
		}
		if !same {
			if err := removeAll(ctx, T, p); err != nil {
				return err
			}
			if err := r.copy(ctx, p, &sa); err != nil {
				return err
			}
		} else if err := r.meta(ctx, p, &sa, &ta); err != nil {
			return err
		}
	}
	return r.unmark(ctx, p)
}

// same compares a non-directory on both: size, link target or device; and,
// when hash is set (the object is marked, or the resync is full), a regular
// file's contents, unless the modification times differ too (then it
// differs). An object that is not marked did not change while the target
// was away: its size is checked, not its contents (times differ by
// nanoseconds between replicas that each wrote a file; resync makes them
// equal when it copies).
func (r *resyncer) same(ctx context.Context, p string, sa, ta *layer.Attr, hash bool) (bool, error) {
	if sa.Size != ta.Size || sa.Rdev != ta.Rdev {
		return false, nil
	}
	switch {
	case sa.IsSymlink():
		a, err := r.S().Readlink(ctx, p)
		if err != nil {
			return false, err
		}
		b, err := r.T().Readlink(ctx, p)
		return err == nil && a == b, nil
	case sa.IsRegular() && hash:
		a, err := hashOf(ctx, r.S(), p)
		if err != nil {
			return false, err
		}
		b, err := hashOf(ctx, r.T(), p)
		return err == nil && bytes.Equal(a, b), nil
	}
	return true, nil
}

func hashOf(ctx context.Context, l layer.FS, p string) ([]byte, error) {
	f, err := l.Open(ctx, p, unix.O_RDONLY|layer.ONoatime)
	if err != nil {
		f, err = l.Open(ctx, p, unix.O_RDONLY)
	}
	if err != nil {
		return nil, err
	}
	defer f.Release(ctx)
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, err := f.ReadAt(ctx, buf, off)
		h.Write(buf[:n])
		off += int64(n)
		if err == io.EOF || n == 0 && err == nil {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	return h.Sum(nil), nil
}

// copy makes p on the target a copy of the source's (a directory with all
// below it). A file is written under a temporary name and renamed into
// place, so that a crash leaves no half file under p.
func (r *resyncer) copy(ctx context.Context, p string, sa *layer.Attr) error {
	S, T := r.S(), r.T()
	r.st.Copied++
	if debugCopy != nil {
		debugCopy(r.k, p)
	}
	switch {
	case sa.IsDir():
		if _, err := T.Mkdir(ctx, p, sa.Mode&0o7777); err != nil {
			return err
		}
		return r.dir(ctx, p)
	case sa.IsRegular():
		if sa.Nlink > 1 {
			if first, ok := r.links[sa.ID()]; ok {
				if _, err := T.Link(ctx, first, p); err == nil {
					return nil
				}
			}
		}
		d, name := layer.Split(p)
		tmp := layer.Join(d, tmpPrefix+name)
		T.Unlink(ctx, tmp)
		if err := copyData(ctx, S, T, p, tmp, sa, r.st); err != nil {
			T.Unlink(ctx, tmp)
			return err
		}
		ta, err := T.Getattr(ctx, tmp)
		if err != nil {
			return err
		}
		if err := r.meta(ctx, tmp, sa, &ta); err != nil {
			return err
		}
		if err := T.Rename(ctx, tmp, p, 0); err != nil {
			return err
		}
		if sa.Nlink > 1 {
			r.links[sa.ID()] = p
		}
		return nil
	case sa.IsSymlink():
		t, err := S.Readlink(ctx, p)
		if err != nil {
			return err
		}
		if _, err := T.Symlink(ctx, t, p); err != nil {
			return err
		}
	default:
		if _, err := T.Mknod(ctx, p, sa.Mode, sa.Rdev); err != nil {
			return err
		}
	}
	ta, err := T.Getattr(ctx, p)
	if err != nil {
		return err
	}
	return r.meta(ctx, p, sa, &ta)
}

func copyData(ctx context.Context, S, T layer.FS, p, tmp string, sa *layer.Attr, st *Stats) error {
	in, err := S.Open(ctx, p, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer in.Release(ctx)
	out, _, err := T.Create(ctx, tmp, unix.O_WRONLY|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, rerr := in.ReadAt(ctx, buf, off)
		if n > 0 {
			if _, err := out.WriteAt(ctx, buf[:n], off); err != nil {
				out.Release(ctx)
				return err
			}
			off += int64(n)
			st.Bytes += int64(n)
		}
		if rerr == io.EOF || n == 0 && rerr == nil {
			break
		}
		if rerr != nil {
			out.Release(ctx)
			return rerr
		}
	}
	if _, err := out.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: sa.Size}); err != nil {
		out.Release(ctx)
		return err
	}
	if err := out.Fsync(ctx, false); err != nil {
		out.Release(ctx)
		return err
	}
	return out.Release(ctx)
}

// meta makes the target object's owner, mode, extended attributes (but
// the layer's own) and times the source's.
func (r *resyncer) meta(ctx context.Context, p string, sa, ta *layer.Attr) error {
	T := r.T()
	sp := p
	if d, name := layer.Split(p); isTmp(name) {
		sp = layer.Join(d, name[len(tmpPrefix):])
	}
	if sa.Uid != ta.Uid || sa.Gid != ta.Gid {
		if _, err := T.Setattr(ctx, p, &layer.SetAttr{Valid: layer.SetUid | layer.SetGid, Uid: sa.Uid, Gid: sa.Gid}); err != nil && !errors.Is(err, syscall.EPERM) {
			return err
		}
	}
	if !sa.IsSymlink() && sa.Mode&0o7777 != ta.Mode&0o7777 {
		if _, err := T.Setattr(ctx, p, &layer.SetAttr{Valid: layer.SetMode, Mode: sa.Mode & 0o7777}); err != nil {
			return err
		}
	}
	if err := r.xattrs(ctx, sp, p); err != nil {
		return err
	}
	if sa.Mtime != ta.Mtime || sa.Atime != ta.Atime {
		if _, err := T.Setattr(ctx, p, &layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime, Atime: sa.Atime, Mtime: sa.Mtime}); err != nil &&
			!(sa.IsSymlink() && errors.Is(err, syscall.EPERM)) {
			return err
		}
	}
	return nil
}

func (r *resyncer) xattrs(ctx context.Context, sp, tp string) error {
	S, T := r.S(), r.T()
	sn, err := listXattr(ctx, S, sp)
	if err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
		return err
	}
	tn, _ := listXattr(ctx, T, tp)
	own := r.fs.meta[0].Owns
	for _, n := range tn {
		if !own(n) && !slices.Contains(sn, n) {
			if err := T.Removexattr(ctx, tp, n); err != nil && !errors.Is(err, layer.ENOATTR) {
				return err
			}
		}
	}
	for _, n := range sn {
		if own(n) {
			continue
		}
		sv, err := getXattr(ctx, S, sp, n)
		if err != nil {
			return err
		}
		if tv, err := getXattr(ctx, T, tp, n); err == nil && bytes.Equal(sv, tv) {
			continue
		}
		if err := T.Setxattr(ctx, tp, n, sv, 0); err != nil {
			return err
		}
	}
	return nil
}

func getXattr(ctx context.Context, l layer.FS, p, name string) ([]byte, error) {
	for {
		n, err := l.Getxattr(ctx, p, name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = l.Getxattr(ctx, p, name, buf)
		if err == syscall.ERANGE {
			continue
		}
		return buf[:n], err
	}
}

// removeAll removes p from l, with all below it.
func removeAll(ctx context.Context, l layer.FS, p string) error {
	a, err := l.Getattr(ctx, p)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	if !a.IsDir() {
		return l.Unlink(ctx, p)
	}
	ents, err := l.ReadDir(ctx, p, false)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := removeAll(ctx, l, layer.Join(p, e.Name)); err != nil {
			return err
		}
	}
	return l.Rmdir(ctx, p)
}

// compareTrees compares every replica with replica src (type, size, mode,
// owner, link targets, contents) and gives up to max differences.
func (fs *FS) compareTrees(ctx context.Context, src, max int) []string {
	var diffs []string
	var walk func(j int, p string)
	walk = func(j int, p string) {
		if len(diffs) >= max {
			return
		}
		se, err1 := names(ctx, fs.r[src], p)
		te, err2 := names(ctx, fs.r[j], p)
		if err1 != nil || err2 != nil {
			diffs = append(diffs, fmt.Sprintf("/%s: cannot be listed (%v, %v)", p, err1, err2))
			return
		}
		all := map[string]bool{}
		for n := range se {
			all[n] = true
		}
		for n := range te {
			all[n] = true
		}
		sorted := make([]string, 0, len(all))
		for n := range all {
			sorted = append(sorted, n)
		}
		slices.Sort(sorted)
		for _, n := range sorted {
			if len(diffs) >= max {
				return
			}
			cp := layer.Join(p, n)
			_, ins := se[n]
			_, int := te[n]
			switch {
			case !ins:
				diffs = append(diffs, fmt.Sprintf("/%s: only on replica %d", cp, j+1))
				continue
			case !int:
				diffs = append(diffs, fmt.Sprintf("/%s: missing on replica %d", cp, j+1))
				continue
			}
			sa, err1 := fs.r[src].Getattr(ctx, cp)
			ta, err2 := fs.r[j].Getattr(ctx, cp)
			if err1 != nil || err2 != nil {
				diffs = append(diffs, fmt.Sprintf("/%s: %v, %v", cp, err1, err2))
				continue
			}
			if sa.Mode != ta.Mode || sa.Uid != ta.Uid || sa.Gid != ta.Gid || !sa.IsDir() && sa.Size != ta.Size {
				diffs = append(diffs, fmt.Sprintf("/%s: mode %o, owner %d:%d, size %d on replica %d; mode %o, owner %d:%d, size %d on replica %d",
					cp, sa.Mode, sa.Uid, sa.Gid, sa.Size, src+1, ta.Mode, ta.Uid, ta.Gid, ta.Size, j+1))
				continue
			}
			if sa.IsDir() {
				walk(j, cp)
			} else if sa.Rdev != ta.Rdev || !sameContent(ctx, fs.r[src], fs.r[j], cp, &sa) {
				diffs = append(diffs, fmt.Sprintf("/%s: the contents differ on replica %d", cp, j+1))
			}
		}
	}
	for j := range fs.r {
		if j != src {
			walk(j, "")
		}
	}
	return diffs
}

// sameContent compares the contents (or link targets) of p on two lowers.
func sameContent(ctx context.Context, a, b layer.FS, p string, at *layer.Attr) bool {
	switch {
	case at.IsSymlink():
		x, err1 := a.Readlink(ctx, p)
		y, err2 := b.Readlink(ctx, p)
		return err1 == nil && err2 == nil && x == y
	case at.IsRegular():
		x, err1 := hashOf(ctx, a, p)
		y, err2 := hashOf(ctx, b, p)
		return err1 == nil && err2 == nil && bytes.Equal(x, y)
	}
	return true
}

var debugCopy func(k int, p string)
