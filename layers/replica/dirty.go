package replica

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"cairnfs.dev/cairn/layer"
)

// The dirty log. While a replica is degraded, every object that changes
// is marked on the healthy replicas, and so is every directory above it:
// side data "dirty" (layer.Meta), a bit set of the replicas that missed a
// change of the object or, for a directory, of its entries or of something
// below it. Being side data, a mark moves with its object's renames and
// goes with its last unlink; a removal marks the directory it was made in.
// Resync walks only marked directories, from the root, and clears each mark
// once its object (a directory: all below it) is brought up to date, so an
// interrupted resync resumes where it stopped. The marks are the compact
// path set of the issue: one small attribute per changed object and per
// directory above one.

const keyDirty = "dirty"

// getMark reads the dirty bits of path on replica i (0: none).
func (fs *FS) getMark(ctx context.Context, i int, path string) uint32 {
	v, err := fs.meta[i].Get(ctx, path, keyDirty)
	if err != nil || len(v) != 4 {
		return 0
	}
	return binary.LittleEndian.Uint32(v)
}

func (fs *FS) setMark(ctx context.Context, i int, path string, bits uint32) error {
	if bits == 0 {
		err := fs.meta[i].Remove(ctx, path, keyDirty)
		if errors.Is(err, layer.ENOATTR) {
			err = nil
		}
		return err
	}
	return fs.meta[i].Set(ctx, path, keyDirty, binary.LittleEndian.AppendUint32(nil, bits))
}

// markDirty marks paths, and every directory above them, on the healthy
// replicas for the degraded ones.
func (fs *FS) markDirty(ctx context.Context, paths ...string) {
	d := fs.degraded.Load()
	if d == 0 || len(paths) == 0 {
		return
	}
	for _, p := range paths {
		for {
			fs.mark(ctx, p, d)
			if p == "" {
				break
			}
			p = parent(p)
		}
	}
}

func (fs *FS) mark(ctx context.Context, path string, d uint32) {
	fs.mu.Lock()
	have := fs.marked[path]
	fs.mu.Unlock()
	if have&d == d {
		return
	}
	for _, i := range fs.healthy() {
		if err := fs.setMark(ctx, i, path, fs.getMark(ctx, i, path)|d); err != nil && path != "" {
			// A symbolic link as non-root has no user.* attributes: its
			// directory's mark covers it (resync compares every entry of
			// a marked directory by type, size and times).
			continue
		}
	}
	fs.mu.Lock()
	if len(fs.marked) > 1<<16 {
		clear(fs.marked)
	}
	fs.marked[path] = have | d
	fs.mu.Unlock()
}

// Renames. While replica k is degraded, an object renamed (a directory
// with everything in it) gets side data "from<k+1>" on the healthy
// replicas: its path on replica k, that is, where it was when k was
// degraded. An object's first rename sets it, and later ones keep it (the
// mark moves with the object); an object below a renamed directory has it
// by that directory's mark and its own path below it; a directory made
// while k is away is marked newObj (it has no copy on k). Resync renames
// the object on k from that path to its new one before it walks the tree,
// then verifies it as a changed object (a marked file by size and hash),
// so a renamed directory of many files costs no copy (resync.go, moves).

// newObj is the from mark of a directory made while the replica was away.
const newObj = "\x00"

func fromKey(k int) string { return fmt.Sprintf("from%d", k+1) }

// origin is where path's object is on degraded replica k, as the from
// marks on replica i say: its own mark, or its nearest marked ancestor's
// with the rest of the path (newObj if that is a new directory), or path
// itself.
func (fs *FS) origin(ctx context.Context, i, k int, path string) string {
	rest := ""
	for p := path; ; p = parent(p) {
		if v, err := fs.meta[i].Get(ctx, p, fromKey(k)); err == nil {
			if string(v) == newObj {
				return newObj
			}
			return layer.Join(string(v), rest)
		}
		if p == "" {
			return path
		}
		_, name := layer.Split(p)
		if rest == "" {
			rest = name
		} else {
			rest = name + "/" + rest
		}
	}
}

// setFrom records, on the healthy replicas, where path's object is on the
// degraded replicas (by replica).
func (fs *FS) setFrom(ctx context.Context, path string, from map[int]string) {
	for k, o := range from {
		for _, i := range fs.healthy() {
			fs.meta[i].Set(ctx, path, fromKey(k), []byte(o)) // an error: resync copies it
		}
	}
}

// origins are the paths of path's object on each degraded replica (nil
// when none is degraded).
func (fs *FS) origins(ctx context.Context, path string) map[int]string {
	d := fs.degraded.Load()
	if d == 0 {
		return nil
	}
	ctx = layer.AsSelf(ctx)
	p := fs.primary()
	m := map[int]string{}
	for k := range fs.r {
		if d&(1<<k) != 0 {
			m[k] = fs.origin(ctx, p, k, path)
		}
	}
	return m
}

// made marks a directory made while replicas are degraded as new to them.
func (fs *FS) made(ctx context.Context, path string) {
	d := fs.degraded.Load()
	if d == 0 {
		return
	}
	m := map[int]string{}
	for k := range fs.r {
		if d&(1<<k) != 0 {
			m[k] = newObj
		}
	}
	fs.setFrom(layer.AsSelf(ctx), path, m)
}

// forgetMarks drops what is known of the marks at and below path, whose
// objects are about to move or go.
func (fs *FS) forgetMarks(path string) {
	if fs.degraded.Load() == 0 {
		return
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for p := range fs.marked {
		if _, ok := under(p, path); ok && p != "" {
			delete(fs.marked, p)
		}
	}
}

// ---- the replica set's state --------------------------------------------------

// state is kept at the root of every replica (side data "state"): the set
// it belongs to, a generation bumped at each change of state, the replicas
// degraded at that generation, and those of them found changed outside
// cairn (resync compares them in full). A replica unmounted cleanly has its
// own seal in it (seal.go); fs.state never has one, so every write of the
// state during a mount or a resync removes the seals.
type state struct {
	Set      string `json:"set"`
	N        int    `json:"n"`
	Gen      uint64 `json:"gen"`
	Degraded uint32 `json:"degraded"`
	Diverged uint32 `json:"diverged,omitempty"`
	Seal     *seal  `json:"seal,omitempty"`
}

const keyState = "state"

func (fs *FS) readState(ctx context.Context, i int) (state, error) {
	v, err := fs.meta[i].Get(ctx, "", keyState)
	if err != nil {
		return state{}, err
	}
	var s state
	if err := json.Unmarshal(v, &s); err != nil {
		return state{}, fmt.Errorf("replica %d: its state mark is damaged: %v", i+1, err)
	}
	return s, nil
}

// saveState writes the state, with the current degraded set, to every
// healthy replica (fs.mu held).
func (fs *FS) saveState(ctx context.Context) error {
	if fs.state.Set == "" {
		return nil // not claimed (in-process use without Claim)
	}
	fs.state.Gen++
	fs.state.Degraded = fs.degraded.Load()
	v, _ := json.Marshal(fs.state)
	var errs []error
	for i := range fs.r {
		if fs.Healthy(i) {
			if err := fs.meta[i].Set(ctx, "", keyState, v); err != nil {
				errs = append(errs, fmt.Errorf("replica %d: %w", i+1, err))
			}
		}
	}
	return errors.Join(errs...)
}

func newSetID() string {
	id := make([]byte, 8)
	rand.Read(id)
	return hex.EncodeToString(id)
}

// DivergedError says that the replicas do not hold one replica set.
type DivergedError struct{ Msg string }

func (e *DivergedError) Error() string { return e.Msg }

// Claim checks, before the stack is served (cairn mount), that the
// replicas are one replica set, and locks them against a second process.
//   - No replica has a state: a first mount. The trees are compared (type,
//     size, mode, owner, symbolic link targets, contents); different trees
//     are refused (cairn resync --full makes them equal).
//   - Some have another set's state, or none: refused likewise.
//   - A replica whose generation is behind the newest, or that the newest
//     state says is degraded, starts degraded (reported, with the command
//     that brings it back).
func (fs *FS) Claim(ctx context.Context) error {
	if err := fs.lock(ctx); err != nil {
		return err
	}
	if err := fs.load(ctx, true); err != nil {
		return err
	}
	var c *check
	if fs.o.Verify {
		var noSeal []int
		var err error
		if c, noSeal, err = fs.prepare(ctx); err != nil {
			return err
		}
		for _, i := range noSeal {
			if !fs.first {
				fs.log.Warn("replica: a replica has no seal (its last mount or resync did not end cleanly: a crash, kill -9): changes made to it outside cairn meanwhile cannot be told from cairn's own and are not looked for; 'cairn resync --full SPEC' compares every replica in full",
					"replica", i+1, "dir", layer.LowerDir(fs.r[i]))
			}
		}
	}
	// The seals go before anything changes: a crash from now on leaves
	// none. (A replica that cannot be written, a read-only lower, keeps
	// its seal, and nothing changes it through cairn either.)
	fs.mu.Lock()
	err := fs.saveState(layer.AsSelf(ctx))
	fs.mu.Unlock()
	if err != nil {
		fs.log.Warn("replica: the replicas' seals could not be removed", "err", err)
	}
	if c != nil {
		fs.begin(ctx, c)
	}
	if fs.o.ResyncAtMount && fs.degraded.Load() != 0 {
		st, err := fs.ResyncStats(ctx, false, nil)
		if err != nil {
			return err
		}
		fs.log.Info("replica: resynchronised at mount", "copied", st.Copied, "removed", st.Removed, "bytes", st.Bytes)
	}
	if c != nil {
		vctx, cancel := context.WithCancel(context.Background())
		fs.mu.Lock()
		fs.cancel = cancel
		fs.mu.Unlock()
		fs.verify(vctx, c, true)
	}
	return nil
}

func (fs *FS) lock(ctx context.Context) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.unlock != nil {
		return nil
	}
	var rel []func()
	for i, l := range fs.r {
		r, err := layer.LockLowerOwn(ctx, l, fmt.Sprintf("replica (replica %d)", i+1), LockName, false)
		if err != nil {
			for _, r := range rel {
				r()
			}
			return err
		}
		rel = append(rel, r)
	}
	fs.unlock = func() {
		for _, r := range rel {
			r()
		}
	}
	return nil
}

// load reads the replicas' states (see Claim); report logs the degraded
// ones.
func (fs *FS) load(ctx context.Context, report bool) error {
	ctx = layer.AsSelf(ctx)
	sts := make([]state, len(fs.r))
	fs.seals = make([]*seal, len(fs.r))
	have := 0
	newest := -1
	for i := range fs.r {
		s, err := fs.readState(ctx, i)
		switch {
		case err == nil:
			sts[i] = s
			fs.seals[i] = s.Seal
			have++
			if newest < 0 || s.Gen > sts[newest].Gen {
				newest = i
			}
		case errors.Is(err, layer.ENOATTR):
		default:
			return fmt.Errorf("replica: reading replica %d's state: %w", i+1, err)
		}
	}
	fs.first = have == 0
	if have == 0 {
		if diffs := fs.compareTrees(ctx, 0, 5); len(diffs) > 0 {
			return &DivergedError{fmt.Sprintf("replica: the replicas differ at their first mount:\n  %s\nrun 'cairn resync --full SPEC' to make every replica a copy of replica 1, then mount again",
				strings.Join(diffs, "\n  "))}
		}
		fs.mu.Lock()
		fs.state = state{Set: newSetID(), N: len(fs.r)}
		err := fs.saveState(ctx)
		fs.mu.Unlock()
		return err
	}
	set := sts[newest]
	var d uint32 = set.Degraded
	for i, s := range sts {
		if s.Set != set.Set {
			return &DivergedError{fmt.Sprintf("replica: replica %d (%s) is not part of this replica set (replica %d's): run 'cairn resync --full SPEC' to make it a copy",
				i+1, layer.LowerDir(fs.r[i]), newest+1)}
		}
		if s.Gen < set.Gen {
			d |= 1 << i
		}
	}
	if popcount(d) >= len(fs.r) {
		return &DivergedError{"replica: every replica is marked degraded: run 'cairn resync --full SPEC'"}
	}
	fs.mu.Lock()
	fs.state = set
	fs.state.Seal = nil
	fs.degraded.Store(d)
	if d != 0 {
		fs.epoch.Add(1)
	}
	fs.mu.Unlock()
	for i := range fs.r {
		if report && d&(1<<i) != 0 && set.Diverged&(1<<i) != 0 {
			fs.log.Error("replica: a replica is degraded (it was changed outside cairn): run 'cairn resync SPEC' to make it a copy of the first healthy replica (it compares it in full)",
				"replica", i+1, "dir", layer.LowerDir(fs.r[i]))
		} else if report && d&(1<<i) != 0 {
			fs.log.Error("replica: a replica is degraded (it missed changes): run 'cairn resync SPEC' to bring it back",
				"replica", i+1, "dir", layer.LowerDir(fs.r[i]))
		}
	}
	return nil
}
