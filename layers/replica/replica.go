// Package replica is Lb2fs revived: one directory tree mirrored over N
// lower stacks. Every change goes to every healthy replica, and the
// application has its answer when all of them have answered; reads go to
// one replica chosen by a policy, and a read-only file is served by one
// replica's file (kernel passthrough where that file allows it). A replica
// that fails (EIO, ENXIO, ENODEV, ESTALE, ENOTCONN, or no answer within the
// timeout) is marked degraded with one log line, gets no more traffic, and
// the operation is retried on another: the application sees no error while
// one healthy replica remains. While a replica is degraded, the objects
// that change are marked on the healthy ones (side data, layer.Meta: the
// dirty log), and `cairn resync` copies only what is marked (resync.go).
//
// Identity: lookups and listings are answered by the first healthy replica
// (the primary), so that an object shows one inode number whichever
// replica serves its data; a read-only file opened on another replica
// shows the primary's identity. Data (open files, readlink, xattrs) is
// what the policy balances. See docs/replica.md.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
)

// Policy chooses the replica that serves a read.
type Policy int

const (
	RoundRobin       Policy = iota // each in turn
	LeastOutstanding               // the one with the fewest requests in flight
	First                          // the first healthy one; the others only as fallback
	Random                         // any, at random
)

// PolicyNames are the policies' names, in the order of their values.
var PolicyNames = []string{"round-robin", "least-outstanding", "first", "random"}

// ParsePolicy reads a policy's name.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range PolicyNames {
		if s == n {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown read policy %q (known: %s)", s, strings.Join(PolicyNames, ", "))
}

// Options configure a replica layer.
type Options struct {
	Policy Policy
	// Timeout is how long a replica may take to answer one operation
	// before it is taken as failed (0: no limit).
	Timeout time.Duration
	// NoPassthrough keeps read-only files from the kernel, so that their
	// reads fail over too (with passthrough the kernel reads the replica's
	// file itself, and an error of that replica reaches the application).
	NoPassthrough bool
	// ResyncAtMount brings degraded replicas back in Claim.
	ResyncAtMount bool
	// BalanceSize: read-only files smaller than this are read from the
	// primary, which answered their lookup; the policy balances the
	// larger ones (0: every file).
	BalanceSize int64
	// Verify: at mount (Claim), look for changes made to the replicas
	// outside cairn since their last clean unmount (seal.go).
	Verify bool
}

// DefaultBalanceSize is BalanceSize unless the spec says otherwise: see
// docs/replica.md ("Reads of small files") for the measurements.
const DefaultBalanceSize = 64 << 10

// maxReplicas bounds the replicas of one layer: the dirty log keeps a bit
// per replica.
const maxReplicas = 32

// tmpPrefix names resync's temporary files (left out of listings).
const tmpPrefix = ".cairn-replica-tmp."

// LockName is the file at the root of each replica whose lock the claim
// takes, which other clients of a network file system see (dirty.go,
// lock). The layer hides it (one, all, and the checks of the names that
// changes make), and resync and the checks of the trees leave it alone.
const LockName = ".cairn-replica.lock"

// hidden says whether path is the claim's lock file.
func hidden(path string) bool { return path == LockName }

// FS is a replica layer.
type FS struct {
	layer.NotImplemented
	r    []layer.FS
	meta []*layer.Meta
	o    Options
	log  *slog.Logger

	degraded    atomic.Uint32 // bit i: replica i is degraded
	outstanding []atomic.Int64
	rr          atomic.Uint64

	mu        sync.Mutex
	state     state             // as last written
	marked    map[string]uint32 // dirty marks known to be set, by path
	files     map[*file]struct{}
	epoch     atomic.Uint64 // bumped when a replica is degraded
	opens     map[layer.ID]*opens
	ptw       map[string]ptwMark // paths under write-intent (opens.go)
	ptwN      int                // files passed through to write
	idMu      [64]sync.Mutex     // opens of one object, one at a time
	unlock    func()             // releases Claim's locks
	watch     []watch            // calls in flight by replica, for the watchdog
	rootAt    atomic.Int64       // when the replicas' directories were last checked (checkRoots)
	rootEvery time.Duration      // at most this often
	stop      chan struct{}      // stops the watchdog

	// The check for changes made outside cairn (seal.go).
	seals      []*seal            // by replica, as load found them
	first      bool               // load found no state: a first mount
	unverified atomic.Uint32      // bit i: replica i not checked yet (no reads)
	cancel     context.CancelFunc // stops the check
	checking   sync.WaitGroup     // the check under way
}

// New builds a replica layer over lowers. It checks nothing on the
// replicas but that they are distinct directories: Claim (cairn mount)
// checks that they hold one replica set.
func New(lowers []layer.FS, o Options) (*FS, error) {
	if len(lowers) < 2 {
		return nil, errors.New("replica: give at least two replicas")
	}
	if len(lowers) > maxReplicas {
		return nil, fmt.Errorf("replica: at most %d replicas", maxReplicas)
	}
	seen := map[layer.ID]int{}
	for i, l := range lowers {
		a, err := l.Getattr(layer.AsSelf(context.Background()), "")
		if err != nil {
			return nil, fmt.Errorf("replica: replica %d: %w", i+1, err)
		}
		if j, dup := seen[a.ID()]; dup {
			return nil, fmt.Errorf("replica: replicas %d and %d are the same directory", j+1, i+1)
		}
		seen[a.ID()] = i
	}
	fs := &FS{r: lowers, o: o, log: slog.Default(), outstanding: make([]atomic.Int64, len(lowers)),
		marked: map[string]uint32{}, files: map[*file]struct{}{}, opens: map[layer.ID]*opens{}, ptw: map[string]ptwMark{},
		rootEvery: rootCheckEvery}
	for _, l := range lowers {
		fs.meta = append(fs.meta, layer.NewMeta(l, "replica"))
	}
	fs.watch = make([]watch, len(lowers))
	for i := range fs.watch {
		fs.watch[i].calls = map[*flight]struct{}{}
	}
	if o.Timeout > 0 {
		fs.stop = make(chan struct{})
		go fs.watchdog(fs.stop)
	}
	return fs, nil
}

var _ layer.FS = (*FS)(nil)

func (fs *FS) Lowers() []layer.FS     { return fs.r }
func (fs *FS) Changes() layer.Changes { return layer.ChangesPlacement }

// Close seals the replicas (seal.go) and releases the locks Claim took.
func (fs *FS) Close() error {
	fs.mu.Lock()
	cancel := fs.cancel
	fs.cancel = nil
	fs.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	fs.checking.Wait()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.sealAll(context.Background())
	if fs.stop != nil {
		close(fs.stop)
		fs.stop = nil
	}
	if fs.unlock != nil {
		fs.unlock()
		fs.unlock = nil
	}
	return nil
}

// FSCaps: what every replica can do, without O_TMPFILE (an unnamed file
// on each replica could not be named as one). The writeback cache
// (layer.FSWriteback) is kept: a WRITE goes to every replica whichever of
// the object's files the kernel sends it through, as a write(2) does; the
// kernel writes its pages back and sends its mtime (SETATTR) before the
// FLUSH of a close, after which the replicas' times are aligned as
// without it; a replica's error reaches fsync and close as it would
// write(2). (The kernel sends several WRITEs of a file at once, as
// threads writing one file do: replicas that fill up may run out of space
// at different WRITEs, and the one that refused is degraded as diverged,
// where one write(2) at a time fails on both alike.)
func (fs *FS) FSCaps() layer.FSCaps {
	c := layer.FSAll
	for _, l := range fs.r {
		c &= layer.FSCapsOf(l)
	}
	return c &^ layer.FSTmpfile
}

// ---- health ----------------------------------------------------------------

// Healthy reports whether replica i gets traffic.
func (fs *FS) Healthy(i int) bool { return fs.degraded.Load()&(1<<i) == 0 }

// Degraded is the set of degraded replicas (bit i: replica i).
func (fs *FS) Degraded() uint32 { return fs.degraded.Load() }

func (fs *FS) healthy() []int {
	var h []int
	for i := range fs.r {
		if fs.Healthy(i) {
			h = append(h, i)
		}
	}
	return h
}

// primary is the first healthy replica: it answers lookups and listings.
func (fs *FS) primary() int {
	for i := range fs.r {
		if fs.Healthy(i) {
			return i
		}
	}
	return 0
}

// errTimeout is a replica that did not answer in time.
var errTimeout = fmt.Errorf("no answer within the timeout: %w", syscall.ETIMEDOUT)

// failure reports whether err says that the replica itself is failing
// (rather than answering about the object).
func failure(err error) bool {
	if err == nil {
		return false
	}
	switch layer.Errno(err) {
	case syscall.EIO, syscall.ENXIO, syscall.ENODEV, syscall.ESTALE, syscall.ENOTCONN, syscall.ETIMEDOUT:
		return true
	}
	return false
}

// full reports a replica out of space: it has diverged from one that took
// the change.
func full(err error) bool {
	e := layer.Errno(err)
	return e == syscall.ENOSPC || e == syscall.EDQUOT
}

// degrade marks replica i degraded, unless it is the last healthy one;
// it reports whether it did (or the replica was already degraded).
// An empty op says that no operation failed (checkRoots).
func (fs *FS) degrade(i int, op, path string, err error) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	d := fs.degraded.Load()
	if d&(1<<i) != 0 {
		return true
	}
	if len(fs.r)-popcount(d) <= 1 {
		return false
	}
	fs.degraded.Store(d | 1<<i)
	fs.epoch.Add(1)
	clear(fs.marked)
	if op == "" {
		fs.log.Error("replica: a replica is degraded: it gets no more traffic until 'cairn resync'",
			"replica", i+1, "dir", layer.LowerDir(fs.r[i]), "err", err)
	} else {
		fs.log.Error("replica: a replica fails and is degraded: it gets no more traffic until 'cairn resync'",
			"replica", i+1, "dir", layer.LowerDir(fs.r[i]), "op", op, "path", path, "err", err)
	}
	fs.saveState(context.Background())
	return true
}

func popcount(x uint32) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// do runs fn for replica i, counting it in flight, and gives up on it
// after the timeout: fn then finishes on its own, and drop (if not nil) is
// given what it made, which no one else will see. It costs a goroutine per
// call: changes, which run on every replica at once anyway, use it (see
// all); reads use inline.
func do[T any](fs *FS, i int, fn func() (T, error), drop func(T)) (T, error) {
	fs.outstanding[i].Add(1)
	if fs.o.Timeout <= 0 {
		defer fs.outstanding[i].Add(-1)
		return fn()
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer fs.outstanding[i].Add(-1)
		v, err := fn()
		done <- result{v, err}
	}()
	t := time.NewTimer(fs.o.Timeout)
	defer t.Stop()
	select {
	case r := <-done:
		return r.v, r.err
	case <-t.C:
		go func() {
			if r := <-done; r.err == nil && drop != nil {
				drop(r.v)
			}
		}()
		var zero T
		return zero, errTimeout
	}
}

// inline runs fn for replica i in the caller's goroutine, counting it in
// flight where the watchdog sees it: a call that takes longer than the
// timeout has its replica degraded, so that no new request goes there, and
// the call's own error (when the lower answers at last) fails over. A read
// stuck in a lower that never answers stays stuck (as on that lower); the
// goroutine handoff that would let it go costs more than a lookup.
func inline[T any](fs *FS, i int, op, path string, fn func() (T, error)) (T, error) {
	fs.outstanding[i].Add(1)
	defer fs.outstanding[i].Add(-1)
	if fs.o.Timeout <= 0 {
		return fn()
	}
	fl := &flight{op: op, path: path, start: time.Now()}
	w := &fs.watch[i]
	w.mu.Lock()
	w.calls[fl] = struct{}{}
	w.mu.Unlock()
	v, err := fn()
	w.mu.Lock()
	delete(w.calls, fl)
	w.mu.Unlock()
	if err == nil && fl.late.Load() {
		// It answered after its replica was taken as failed: the answer
		// stands (the replica is degraded all the same).
		return v, nil
	}
	return v, err
}

// flight is a call in flight on a replica, for the watchdog.
type flight struct {
	op, path string
	start    time.Time
	late     atomic.Bool
}

type watch struct {
	mu    sync.Mutex
	calls map[*flight]struct{}
}

// watchdog degrades a replica with a call in flight for longer than the
// timeout.
func (fs *FS) watchdog(stop chan struct{}) {
	tick := time.NewTicker(min(max(fs.o.Timeout/4, 10*time.Millisecond), time.Second))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			for i := range fs.watch {
				w := &fs.watch[i]
				var stuck *flight
				w.mu.Lock()
				for fl := range w.calls {
					if now.Sub(fl.start) > fs.o.Timeout {
						fl.late.Store(true)
						stuck = fl
					}
				}
				w.mu.Unlock()
				if stuck != nil && fs.Healthy(i) {
					fs.degrade(i, stuck.op, stuck.path, errTimeout)
				}
			}
		}
	}
}

// rootCheckEvery bounds how often changes check that each replica's
// directory is still at its path (FS.rootEvery; tests set 0).
const rootCheckEvery = 100 * time.Millisecond

// checkRoots degrades a replica whose directory was renamed (or removed,
// or replaced) behind the mount: the daemon's descriptor still reaches it,
// so its changes would go on into a directory that is no longer the
// replica's. Changes call it; it costs one stat per replica at most every
// rootCheckEvery (layer.RootMoved), none in between, and reads none (what
// they read is the same wherever the directory went).
func (fs *FS) checkRoots() {
	now := time.Now().UnixNano()
	last := fs.rootAt.Load()
	if now-last < int64(fs.rootEvery) || !fs.rootAt.CompareAndSwap(last, now) {
		return
	}
	for _, i := range fs.healthy() {
		if err := layer.RootMoved(fs.r[i]); err != nil {
			fs.degrade(i, "", "", fmt.Errorf("its directory was moved or removed while mounted (%w): put it back, then run 'cairn resync SPEC'", err))
		}
	}
}

// call is do for an operation that gives only an error.
func (fs *FS) call(i int, fn func() error) error {
	_, err := do(fs, i, func() (struct{}, error) { return struct{}{}, fn() }, nil)
	return err
}

// pick chooses the replica for a read, by the policy, among the healthy
// replicas checked for changes made outside cairn (the primary while none
// is).
func (fs *FS) pick() int {
	h := fs.healthy()
	if u := fs.unverified.Load(); u != 0 {
		h = slices.DeleteFunc(h, func(i int) bool { return u&(1<<i) != 0 })
		if len(h) == 0 {
			return fs.primary()
		}
	}
	if len(h) == 0 {
		return 0
	}
	switch fs.o.Policy {
	case RoundRobin:
		return h[fs.rr.Add(1)%uint64(len(h))]
	case LeastOutstanding:
		best := h[0]
		for _, i := range h[1:] {
			if fs.outstanding[i].Load() < fs.outstanding[best].Load() {
				best = i
			}
		}
		return best
	case Random:
		return h[rand.IntN(len(h))]
	}
	return h[0]
}

// one runs a read on replica i, and on failure on the next healthy one,
// until one answers or none is left but a failing one. It gives the
// replica that answered.
func one[T any](fs *FS, i int, op, path string, fn func(i int) (T, error)) (T, int, error) {
	if hidden(path) {
		var zero T
		return zero, i, syscall.ENOENT
	}
	for {
		v, err := inline(fs, i, op, path, func() (T, error) { return fn(i) })
		if !failure(err) || !fs.degrade(i, op, path, err) {
			return v, i, err
		}
		i = fs.pick()
	}
}

// all runs a change on every healthy replica at once, and gives each
// one's value (by replica). The result is the first healthy replica's that
// answered (lead); replicas that fail, or answer otherwise than it
// (divergence), are degraded.
func all[T any](fs *FS, op, path string, fn func(i int) (T, error), drop func(T)) (vals []T, lead int, err error) {
	fs.checkRoots()
	h := fs.healthy()
	vals = make([]T, len(fs.r))
	if hidden(path) {
		return vals, h[0], syscall.ENOENT
	}
	errs := make([]error, len(h))
	if len(h) == 1 {
		vals[h[0]], errs[0] = inline(fs, h[0], op, path, func() (T, error) { return fn(h[0]) })
	} else {
		type result struct {
			k   int
			v   T
			err error
		}
		ch := make(chan result, len(h))
		for k, i := range h {
			fs.outstanding[i].Add(1)
			go func() {
				defer fs.outstanding[i].Add(-1)
				v, err := fn(i)
				ch <- result{k, v, err}
			}()
		}
		var expire <-chan time.Time
		if fs.o.Timeout > 0 {
			t := time.NewTimer(fs.o.Timeout)
			defer t.Stop()
			expire = t.C
		}
		answered := make([]bool, len(h))
	wait:
		for n := 0; n < len(h); n++ {
			select {
			case r := <-ch:
				vals[h[r.k]], errs[r.k], answered[r.k] = r.v, r.err, true
			case <-expire:
				late := 0
				for k := range h {
					if !answered[k] {
						errs[k] = errTimeout
						late++
					}
				}
				// What the late ones make, when they answer, no one sees.
				go func() {
					for range late {
						if r := <-ch; r.err == nil && drop != nil {
							drop(r.v)
						}
					}
				}()
				break wait
			}
		}
	}
	// The lead: the first replica that took the change; failing that, the
	// first that did not fail. A full replica (ENOSPC, EDQUOT) beside
	// one that took the change has diverged and is degraded, wherever it
	// stands in the order (the first replica full used to fail the change
	// and degrade the replicas that had room); when every one is full,
	// the application gets ENOSPC.
	l := -1
	for k, e := range errs {
		if !failure(e) && (l < 0 || full(errs[l]) && !full(e)) {
			l = k
		}
	}
	if l < 0 {
		// Every replica failed: degrade all but one, whose error stands.
		for k, e := range errs {
			if !fs.degrade(h[k], op, path, e) {
				return vals, h[k], e
			}
		}
		return vals, h[0], errs[0]
	}
	for k, e := range errs {
		switch {
		case k == l:
		case failure(e):
			fs.degrade(h[k], op, path, e)
		case layer.Errno(e) != layer.Errno(errs[l]):
			fs.degrade(h[k], op, path, fmt.Errorf("diverged: replica %d says %v, replica %d says %v", h[l]+1, errs[l], h[k]+1, e))
		}
	}
	return vals, h[l], errs[l]
}

// tag marks attributes from replica i.
func (fs *FS) tag(a *layer.Attr, i int) { layer.TagBranch(a, i, len(fs.r)) }

// ---- lookups and reads ------------------------------------------------------

func (fs *FS) Getattr(ctx context.Context, path string) (layer.Attr, error) {
	a, i, err := one(fs, fs.primary(), "getattr", path, func(i int) (layer.Attr, error) { return fs.r[i].Getattr(ctx, path) })
	fs.tag(&a, i)
	if pt := fs.writing(path); err == nil && pt >= 0 && pt != i {
		// The kernel writes replica pt's file alone (opens.go): its size
		// and times are the file's; the identity stays the primary's.
		if w, err := inline(fs, pt, "getattr", path, func() (layer.Attr, error) { return fs.r[pt].Getattr(ctx, path) }); err == nil {
			w.Dev, w.Branch, w.Ino, w.Gen = a.Dev, a.Branch, a.Ino, a.Gen
			a = w
		}
	}
	return a, err
}

func (fs *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	d, err := fs.OpenDir(ctx, path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return layer.ReadDirAll(ctx, d, plus)
}

// OpenDir streams the primary's listing, tagged with its branch, without
// resync's temporary names.
func (fs *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	d, src, err := one(fs, fs.primary(), "readdir", path, func(i int) (layer.Dir, error) { return layer.OpenDir(ctx, fs.r[i], path) })
	if err != nil {
		return nil, err
	}
	return layer.MapDir(d, func(_ context.Context, e *layer.DirEntry) (bool, error) {
		if e.Attr != nil {
			fs.tag(e.Attr, src)
		}
		return !strings.HasPrefix(e.Name, tmpPrefix) && !hidden(layer.Join(path, e.Name)), nil
	}), nil
}

func (fs *FS) Readlink(ctx context.Context, path string) (string, error) {
	s, _, err := one(fs, fs.pick(), "readlink", path, func(i int) (string, error) { return fs.r[i].Readlink(ctx, path) })
	return s, err
}

func (fs *FS) own(name string) bool { return fs.meta[0].Owns(name) }

func (fs *FS) Getxattr(ctx context.Context, path, name string, dest []byte) (int, error) {
	if fs.own(name) {
		return 0, layer.ENOATTR
	}
	// Into a buffer of its own: a replica that answers too late must not
	// write into dest.
	buf := make([]byte, len(dest))
	n, _, err := one(fs, fs.pick(), "getxattr", path, func(i int) (int, error) { return fs.r[i].Getxattr(ctx, path, name, buf) })
	copy(dest, buf[:max(0, min(n, len(buf)))])
	return n, err
}

// Listxattr leaves the layer's own side data out.
func (fs *FS) Listxattr(ctx context.Context, path string, dest []byte) (int, error) {
	names, _, err := one(fs, fs.pick(), "listxattr", path, func(i int) ([]string, error) { return listXattr(ctx, fs.r[i], path) })
	if err != nil {
		return 0, err
	}
	var out []byte
	for _, nm := range names {
		if !fs.own(nm) {
			out = append(append(out, nm...), 0)
		}
	}
	if len(dest) == 0 {
		return len(out), nil
	}
	if len(dest) < len(out) {
		return 0, syscall.ERANGE
	}
	return copy(dest, out), nil
}

func listXattr(ctx context.Context, l layer.FS, path string) ([]string, error) {
	for {
		n, err := l.Listxattr(ctx, path, nil)
		if err != nil || n == 0 {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = l.Listxattr(ctx, path, buf)
		if err == syscall.ERANGE {
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, nm := range strings.Split(string(buf[:n]), "\x00") {
			if nm != "" {
				names = append(names, nm)
			}
		}
		return names, nil
	}
}

// Statfs is the healthy replica with the least space available: what can
// still be written to all.
func (fs *FS) Statfs(ctx context.Context, path string) (layer.Statfs, error) {
	h := fs.healthy()
	sts := make([]layer.Statfs, len(h))
	errs := fanout.Each(len(h), true, func(k int) (err error) {
		sts[k], err = do(fs, h[k], func() (layer.Statfs, error) { return fs.r[h[k]].Statfs(ctx, path) }, nil)
		return
	})
	best := -1
	for k, st := range sts {
		if errs[k] == nil && (best < 0 || st.Bavail*uint64(st.Bsize) < sts[best].Bavail*uint64(sts[best].Bsize)) {
			best = k
		}
	}
	if best < 0 {
		return layer.Statfs{}, errs[0]
	}
	return sts[best], nil
}

func (fs *FS) GetFlags(ctx context.Context, path string) (uint32, error) {
	f, _, err := one(fs, fs.primary(), "getflags", path, func(i int) (uint32, error) { return fs.r[i].GetFlags(ctx, path) })
	return f, err
}

// ---- changes ---------------------------------------------------------------

// change runs a change on every healthy replica, gives the lead's
// attributes (tagged), and marks paths dirty if a replica is degraded.
func (fs *FS) change(ctx context.Context, op, path string, fn func(i int) (layer.Attr, error), dirty ...string) (layer.Attr, error) {
	as, lead, err := all(fs, op, path, fn, nil)
	if err == nil {
		fs.markDirty(ctx, dirty...)
	}
	a := as[lead]
	fs.tag(&a, lead)
	return a, err
}

func (fs *FS) Setattr(ctx context.Context, path string, in *layer.SetAttr) (layer.Attr, error) {
	return fs.change(ctx, "setattr", path, func(i int) (layer.Attr, error) { return fs.r[i].Setattr(ctx, path, in) }, path)
}

func (fs *FS) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	if hidden(path) {
		return layer.Attr{}, syscall.EPERM
	}
	a, err := fs.change(ctx, "mkdir", path, func(i int) (layer.Attr, error) { return fs.r[i].Mkdir(ctx, path, mode) }, path)
	if err == nil {
		fs.made(ctx, path)
	}
	return a, err
}

func (fs *FS) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (layer.Attr, error) {
	if hidden(path) {
		return layer.Attr{}, syscall.EPERM
	}
	return fs.change(ctx, "mknod", path, func(i int) (layer.Attr, error) { return fs.r[i].Mknod(ctx, path, mode, rdev) }, path)
}

func (fs *FS) Symlink(ctx context.Context, target, path string) (layer.Attr, error) {
	if hidden(path) {
		return layer.Attr{}, syscall.EPERM
	}
	return fs.change(ctx, "symlink", path, func(i int) (layer.Attr, error) { return fs.r[i].Symlink(ctx, target, path) }, path)
}

func (fs *FS) Link(ctx context.Context, oldpath, newpath string) (layer.Attr, error) {
	switch {
	case hidden(oldpath):
		return layer.Attr{}, syscall.ENOENT
	case hidden(newpath):
		return layer.Attr{}, syscall.EPERM
	}
	return fs.change(ctx, "link", newpath, func(i int) (layer.Attr, error) { return fs.r[i].Link(ctx, oldpath, newpath) }, newpath)
}

func (fs *FS) unchanged(ctx context.Context, op, path string, fn func(i int) error, dirty ...string) error {
	_, err := fs.change(ctx, op, path, func(i int) (layer.Attr, error) { return layer.Attr{}, fn(i) }, dirty...)
	return err
}

func parent(path string) string { d, _ := layer.Split(path); return d }

func (fs *FS) Unlink(ctx context.Context, path string) error {
	fs.forgetMarks(path)
	return fs.unchanged(ctx, "unlink", path, func(i int) error { return fs.r[i].Unlink(ctx, path) }, parent(path))
}

func (fs *FS) Rmdir(ctx context.Context, path string) error {
	fs.forgetMarks(path)
	return fs.unchanged(ctx, "rmdir", path, func(i int) error { return fs.r[i].Rmdir(ctx, path) }, parent(path))
}

func (fs *FS) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	switch {
	case hidden(oldpath):
		return syscall.ENOENT
	case hidden(newpath):
		return syscall.EPERM
	}
	fs.forgetMarks(oldpath)
	fs.forgetMarks(newpath)
	dirty := []string{parent(oldpath), newpath}
	exchange := flags&layer.RenameExchange != 0
	if exchange {
		dirty = append(dirty, oldpath)
	}
	// Where the objects are on the degraded replicas (the dirty log's
	// renames, dirty.go).
	from, back := fs.origins(ctx, oldpath), map[int]string(nil)
	if exchange {
		back = fs.origins(ctx, newpath)
	}
	err := fs.unchanged(ctx, "rename", oldpath, func(i int) error { return fs.r[i].Rename(ctx, oldpath, newpath, flags) }, dirty...)
	if err == nil {
		fs.setFrom(layer.AsSelf(ctx), newpath, from)
		fs.setFrom(layer.AsSelf(ctx), oldpath, back)
		fs.renamed(oldpath, newpath, exchange)
	}
	return err
}

func (fs *FS) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	if fs.own(name) {
		return syscall.EPERM
	}
	return fs.unchanged(ctx, "setxattr", path, func(i int) error { return fs.r[i].Setxattr(ctx, path, name, value, flags) }, path)
}

func (fs *FS) Removexattr(ctx context.Context, path, name string) error {
	if fs.own(name) {
		return syscall.EPERM
	}
	return fs.unchanged(ctx, "removexattr", path, func(i int) error { return fs.r[i].Removexattr(ctx, path, name) }, path)
}

func (fs *FS) SyncDir(ctx context.Context, path string) error {
	return fs.unchanged(ctx, "syncdir", path, func(i int) error { return fs.r[i].SyncDir(ctx, path) })
}

func (fs *FS) SetFlags(ctx context.Context, path string, flags uint32) error {
	return fs.unchanged(ctx, "setflags", path, func(i int) error { return fs.r[i].SetFlags(ctx, path, flags) }, path)
}

// Tmpfile: an unnamed file on each replica cannot be named as one later.
func (fs *FS) Tmpfile(context.Context, string, int, uint32) (layer.File, layer.Attr, error) {
	return nil, layer.Attr{}, syscall.EOPNOTSUPP
}

// ---- open files --------------------------------------------------------------

func writes(flags int) bool {
	return flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0
}

func release(f layer.File) { f.Release(context.Background()) }

func (fs *FS) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	f := &file{fs: fs, flags: flags &^ (unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC), lf: make([]layer.File, len(fs.r))}
	if !writes(flags) {
		return fs.openRead(ctx, f, path, flags)
	}
	a, err := fs.Getattr(ctx, path)
	if err != nil {
		return nil, err
	}
	f.id = a.ID()
	unlock := fs.lockID(f.id)
	defer unlock()
	pt := fs.writeOpen(f.id)
	if pt >= 0 {
		// Write-intent, before anything is written (see opens.go).
		if err := fs.intend(ctx, pt, path); err != nil {
			return nil, err
		}
	}
	lfs, _, err := all(fs, "open", path, func(i int) (layer.File, error) { return fs.r[i].Open(ctx, path, flags) }, release)
	f.lf = lfs
	if err != nil {
		f.releaseAll(ctx)
		fs.intended(ctx)
		return nil, err
	}
	f.settle(ctx)
	if flags&unix.O_TRUNC != 0 {
		fs.markDirty(ctx, path)
	}
	if pt >= 0 {
		if f.lf[pt] == nil || f.lf[pt].Caps()&layer.CapPassthrough == 0 {
			f.releaseAll(ctx)
			fs.intended(ctx)
			return nil, syscall.ETXTBSY
		}
		f.rd, f.pt, f.ptw = pt, true, true
		if pt != fs.primary() {
			f.show = &f.id
		}
	}
	fs.opened(f)
	return fs.track(f, path), nil
}

// openRead opens a file to read: one replica's file, whose identity shown
// is the primary's. It is opened on the primary first, which gives the
// identity and size by its descriptor (no lookup by path): a file smaller
// than BalanceSize is read there; a larger one where the policy says, the
// primary's file then serving only to touch its atime (without reading
// data) when the read elsewhere would have changed it, and kept open.
func (fs *FS) openRead(ctx context.Context, f *file, path string, flags int) (layer.File, error) {
	open := func(i int) (layer.File, error) { return fs.r[i].Open(ctx, path, flags) }
	lf, p, err := one(fs, fs.primary(), "open", path, open)
	if err != nil {
		return nil, err
	}
	a, err := inline(fs, p, "fgetattr", path, func() (layer.Attr, error) { return lf.Getattr(ctx) })
	if err != nil {
		lf.Release(ctx)
		return nil, err
	}
	fs.tag(&a, p)
	f.id = a.ID()
	unlock := fs.lockID(f.id)
	defer unlock()
	want, pt, err := fs.readOpen(f.id)
	if err != nil {
		lf.Release(ctx)
		return nil, err
	}
	if want < 0 {
		want = p
		if int64(a.Size) >= fs.o.BalanceSize {
			want = fs.pick()
		}
	}
	i := p
	if want != p {
		other, j, err := one(fs, want, "open", path, open)
		if err != nil {
			lf.Release(ctx)
			return nil, err
		}
		if j != p {
			if staleAtime(&a) {
				layer.TouchAtime(ctx, lf)
			}
			// The primary's file stays open, unread: the number shown
			// is its inode's, which an unlink would otherwise free for
			// a new file of the primary while this one is open (the
			// kernel then took the new file's node for this file's,
			// and failed this file's reads with EIO).
			f.hold, f.holdAt = lf, p
			lf, i = other, j
			f.show = &f.id
		} else {
			other.Release(ctx)
		}
	}
	f.lf[i], f.rd = lf, i
	f.pt = pt && i == want && lf.Caps()&layer.CapPassthrough != 0
	fs.opened(f)
	return fs.track(f, path), nil
}

// staleAtime says whether a read would change a's atime under relatime
// (the default): it is not after the last change, or a day old.
func staleAtime(a *layer.Attr) bool {
	after := func(x, y layer.Time) bool { return x.Sec > y.Sec || x.Sec == y.Sec && x.Nsec > y.Nsec }
	return !after(a.Atime, a.Mtime) || !after(a.Atime, a.Ctime) || time.Now().Unix()-a.Atime.Sec >= 24*3600
}

// created is what Create gives on one replica.
type created struct {
	f layer.File
	a layer.Attr
}

func (fs *FS) Create(ctx context.Context, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	if hidden(path) {
		return nil, layer.Attr{}, syscall.EPERM
	}
	f := &file{fs: fs, flags: flags &^ (unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC), lf: make([]layer.File, len(fs.r))}
	cs, lead, err := all(fs, "create", path, func(i int) (c created, err error) {
		c.f, c.a, err = fs.r[i].Create(ctx, path, flags, mode)
		return
	}, func(c created) { release(c.f) })
	for i, c := range cs {
		f.lf[i] = c.f
	}
	if err != nil {
		f.releaseAll(ctx)
		return nil, layer.Attr{}, err
	}
	fs.markDirty(ctx, path)
	a := cs[lead].a
	fs.tag(&a, lead)
	f.settle(ctx)
	f.id = a.ID()
	fs.opened(f)
	return fs.track(f, path), a, nil
}

// LinkFile: replica files are never unnamed (no Tmpfile).
func (fs *FS) LinkFile(context.Context, layer.File, string) (layer.Attr, error) {
	return layer.Attr{}, syscall.EOPNOTSUPP
}

func (fs *FS) track(f *file, path string) *file {
	f.path.Store(&path)
	f.epoch = ^uint64(0) // not marked dirty yet
	fs.mu.Lock()
	fs.files[f] = struct{}{}
	fs.mu.Unlock()
	return f
}

// renamed moves the paths of open files from old to new.
func (fs *FS) renamed(old, new string, exchange bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for f := range fs.files {
		p := *f.path.Load()
		if rest, ok := under(p, old); ok {
			np := new + rest
			f.path.Store(&np)
		} else if rest, ok := under(p, new); ok && exchange {
			np := old + rest
			f.path.Store(&np)
		}
	}
}

func under(p, dir string) (string, bool) {
	if p == dir || dir == "" {
		return strings.TrimPrefix(p, dir), true
	}
	if strings.HasPrefix(p, dir+"/") {
		return p[len(dir):], true
	}
	return "", false
}
