package shard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"cairnfs.dev/cairn/layer"
)

// Progress is where a resharding is.
type Progress struct {
	From, To Layout
	Source   int // the source bucket being drained (of From's count)
	Sources  int
	Moved    int // entries moved so far by this run
	Total    int // entries to move, as counted at the start (flat: exact; growth: estimated)
}

func (p Progress) String() string {
	return fmt.Sprintf("%s -> %s: bucket %d/%d, %d/%d entries moved", p.From, p.To, p.Source, p.Sources, p.Moved, p.Total)
}

// Job is a resharding run in this process.
type Job struct {
	mu   sync.Mutex
	p    Progress
	err  error
	done bool

	auto    bool               // a growth the daemon started (grow.go): a rename stops it
	cancel  context.CancelFunc // stops it at its next batch
	stopped chan struct{}      // closed when it has returned
}

func (j *Job) running() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return !j.done
}

// Status is the job's progress line.
func (j *Job) Status() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch {
	case j.auto && errors.Is(j.err, context.Canceled):
		return "stopped: " + j.p.String() + " (the directory was renamed or removed, or the daemon stopped; the next name made in it resumes the growth)"
	case j.err != nil:
		return "failed: " + j.err.Error()
	case j.done:
		return "done: " + j.p.To.String()
	}
	return "running: " + j.p.String()
}

// batch is how many entries move under one write lock; window is how
// many names of a source are read at once, to move in key order.
const (
	batch  = 256
	window = 1 << 16
)

// Reshard converts directory path to layout to, a bucket of the old
// layout at a time, while the directory stays in use: entries move with
// one lower rename each (never copied), a batch at a time under the
// directory's write lock, and the record says where the move stands, so a
// run that stops (a crash, a full disk) is resumed by running it again;
// meanwhile every operation finds each name in its new place or its old
// one. A flat directory may become any layout; a hash layout may grow to
// more buckets (extendible hashing with one global depth: each bucket of
// 2^k splits into 2^(k'-k) of 2^k', the keys, and so the listing order,
// unchanged).
//
// A hash layout of 0 buckets is as many as the directory's entries need
// (at most max_bucket a bucket on average; never fewer than it has).
func (fs *FS) Reshard(ctx context.Context, path string, to Layout, progress func(Progress)) error {
	return fs.run(ctx, path, to, nil, progress)
}

// errSkipped: a growth did not start, its directory being renamed or
// gone since.
var errSkipped = errors.New("skipped")

// run is Reshard; auto, when not nil, is the record of the directory that
// the daemon grows by itself (grow.go), which a rename stops (see busy).
func (fs *FS) run(ctx context.Context, path string, to Layout, auto *dirState, progress func(Progress)) error {
	if to.Scheme == Hash && to.Buckets == 0 {
		// sized in reshard
	} else if err := to.Check(); err != nil || to.Scheme == Flat {
		return fmt.Errorf("shard: reshard %s: layout %s: %v", path, to, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	j := &Job{auto: auto != nil, cancel: cancel, stopped: make(chan struct{})}
	fs.mu.Lock()
	if auto != nil {
		if fs.closed || fs.dirs[path] != auto {
			fs.mu.Unlock()
			return errSkipped
		}
		for p := range fs.renaming {
			if p == path || strings.HasPrefix(path, p+"/") || p == "" {
				fs.mu.Unlock()
				return errSkipped
			}
		}
	}
	for p, o := range fs.jobs {
		if o.running() && (p == path || strings.HasPrefix(p, path+"/") || strings.HasPrefix(path, p+"/") || p == "" || path == "") {
			fs.mu.Unlock()
			return fmt.Errorf("shard: reshard %s: %s is being resharded already: %w", path, "/"+p, syscall.EBUSY)
		}
	}
	fs.jobs[path] = j
	fs.mu.Unlock()
	err := fs.reshard(ctx, path, to, j, progress)
	j.mu.Lock()
	j.err, j.done = err, true
	j.mu.Unlock()
	close(j.stopped)
	if j.auto && (err == nil || errors.Is(err, context.Canceled)) {
		// Growths are many over a daemon's life: keep those that failed.
		fs.mu.Lock()
		if fs.jobs[path] == j {
			delete(fs.jobs, path)
		}
		fs.mu.Unlock()
	}
	return err
}

// lock takes the directory's write lock without making readers wait
// behind it (see dirState).
func lock(ds *dirState) {
	for !ds.mu.TryLock() {
		time.Sleep(100 * time.Microsecond)
	}
}

func (fs *FS) reshard(ctx context.Context, path string, to Layout, j *Job, progress func(Progress)) error {
	self := layer.AsSelf(ctx)
	lp, err := fs.lowerDir(ctx, path)
	if err != nil {
		return fmt.Errorf("shard: reshard %s: %w", path, err)
	}
	a, err := fs.lower.Getattr(self, lp)
	if err != nil {
		return fmt.Errorf("shard: reshard %s: %w", path, err)
	}
	if !a.IsDir() {
		return fmt.Errorf("shard: reshard %s: not a directory: %w", path, syscall.ENOTDIR)
	}
	ds, err := fs.state(ctx, path, lp)
	if err != nil {
		return err
	}
	if to.Buckets == 0 {
		if to, err = fs.sized(ctx, lp, ds, to); err != nil {
			return fmt.Errorf("shard: reshard %s: %w", path, err)
		}
	}
	lock(ds)
	var st State
	switch {
	case ds.get() == nil:
		st = State{V: 1, Cur: to, From: &Layout{Scheme: Flat}}
	case ds.get().From != nil:
		st = *ds.get()
		if st.Cur != to {
			ds.mu.Unlock()
			return fmt.Errorf("shard: reshard %s: a resharding from %s to %s is under way: finish it first (run again with that layout)", path, st.From, st.Cur)
		}
	case ds.get().Cur == to:
		ds.mu.Unlock()
		j.mu.Lock()
		j.p = Progress{From: to, To: to}
		j.mu.Unlock()
		if progress != nil {
			progress(j.p)
		}
		return nil
	default:
		if err := canMove(ds.get().Cur, to); err != nil {
			ds.mu.Unlock()
			return fmt.Errorf("shard: reshard %s: %v", path, err)
		}
		from := ds.get().Cur
		st = State{V: 1, Cur: to, From: &from}
	}
	ds.mu.Unlock()

	// Count, and look for names that would be taken for buckets.
	total := 0
	var clash []string
	count := func(dir, skip string) error {
		return fs.list(ctx, dir, func(name string) bool {
			if strings.HasPrefix(name, to.Prefix) && skip == "" {
				clash = append(clash, name)
			}
			if skip == "" || !strings.HasPrefix(name, skip) {
				total++
			}
			return true
		})
	}
	if st.From.Scheme == Flat {
		skip := ""
		if ds.get() != nil { // resumed: the buckets are ours
			skip = to.Prefix
		}
		if err := count(lp, skip); err != nil {
			return fmt.Errorf("shard: reshard %s: %w", path, err)
		}
		if len(clash) > 0 {
			if len(clash) > 5 {
				clash = append(clash[:5], "...")
			}
			return fmt.Errorf("shard: reshard %s: the directory holds names that begin with the bucket prefix %q (%s): rename them first, or choose another prefix (option prefix); nothing was changed",
				path, to.Prefix, strings.Join(clash, ", "))
		}
	} else if j.auto && ds.counted.Load() {
		total = int(ds.entries.Load()) // an estimate, read already: no listing
	} else {
		for s := st.Next; s < st.From.Buckets; s++ {
			count(join(lp, st.From.BucketName(s)), "\x00")
		}
	}
	// The record goes first: from now on names are looked for in both
	// places.
	lock(ds)
	if old := ds.get(); old == nil || old.Cur != st.Cur || (old.From == nil) != (st.From == nil) || old.Next != st.Next {
		if err := fs.meta.Set(ctx, lp, "layout", st.Encode()); err != nil {
			ds.mu.Unlock()
			return fmt.Errorf("shard: reshard %s: cannot record the layout (%w): nothing was changed", path, err)
		}
		c := st
		ds.st.Store(&c)
	}
	ds.mu.Unlock()

	p := Progress{From: *st.From, To: to, Sources: st.From.count(), Total: total}
	report := func() {
		j.mu.Lock()
		j.p = p
		j.mu.Unlock()
		if progress != nil {
			progress(p)
		}
	}
	for s := st.Next; s < st.From.count(); s++ {
		p.Source = s
		report()
		src, skip := lp, to.Prefix
		if st.From.Scheme != Flat {
			src, skip = join(lp, st.From.BucketName(s)), ""
		}
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			var names []string
			err := fs.list(ctx, src, func(name string) bool {
				if skip == "" || !strings.HasPrefix(name, skip) {
					names = append(names, name)
				}
				return len(names) < window
			})
			if errors.Is(err, syscall.ENOENT) && src != lp {
				break
			}
			if err != nil {
				return fmt.Errorf("shard: reshard %s: reading %s: %w", path, src, err)
			}
			if len(names) == 0 {
				break
			}
			// The lower lists in its own hash order (ext4's htree), and a
			// directory filled in that order splits its blocks half full:
			// the new buckets would be half as big again as needed, and
			// cost as much more to read cold. Key order is not the
			// lower's.
			sort.Slice(names, func(i, j int) bool { return to.Key(names[i]) < to.Key(names[j]) })
			for len(names) > 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
				k := min(batch, len(names))
				n, err := fs.move(ctx, ds, lp, src, names[:k])
				names = names[k:]
				p.Moved += n
				report()
				if err != nil {
					return fmt.Errorf("shard: reshard %s: stopped at bucket %d of %d (%d entries moved; every entry is in its old place or its new one, and the record says which to look in): %w; run again to resume",
						path, s, st.From.count(), p.Moved, err)
				}
			}
		}
		lock(ds)
		if src != lp {
			fs.lower.Rmdir(self, src)
			ds.nlinkMu.Lock()
			ds.nlink = -1 // counted the buckets
			ds.nlinkMu.Unlock()
		}
		c := *ds.get()
		c.Next = s + 1
		if s+1 == st.From.count() {
			c.From, c.Next = nil, 0
		}
		ds.st.Store(&c)
		err := fs.meta.Set(ctx, lp, "layout", c.Encode())
		ds.mu.Unlock()
		if err != nil {
			// Resuming from the older record only reads a drained bucket again.
			return fmt.Errorf("shard: reshard %s: cannot record progress: %w; run again to resume", path, err)
		}
	}
	ds.nlinkMu.Lock()
	ds.nlink = -1
	ds.nlinkMu.Unlock()
	p.Source = p.Sources
	report()
	return nil
}

// moveName renames from to to, which must not exist (EEXIST). A lower
// that takes no renameat2 flags (GlusterFS's client says EINVAL) gets a
// look and a plain rename: no one else makes names in a directory whose
// write lock a resharding holds, in a lower the layer has claimed.
func (fs *FS) moveName(ctx context.Context, from, to string) error {
	if !fs.noRenameFlags.Load() {
		err := fs.lower.Rename(ctx, from, to, layer.RenameNoreplace)
		if !errors.Is(err, syscall.EINVAL) {
			return err
		}
		fs.noRenameFlags.Store(true)
	}
	if _, err := fs.lower.Getattr(ctx, to); err == nil {
		return syscall.EEXIST
	} else if !errors.Is(err, syscall.ENOENT) {
		return err
	}
	return fs.lower.Rename(ctx, from, to, 0)
}

// move moves names from lower directory src to their buckets, under ds's
// write lock.
func (fs *FS) move(ctx context.Context, ds *dirState, lp, src string, names []string) (int, error) {
	self := layer.AsSelf(ctx)
	lock(ds)
	defer ds.mu.Unlock()
	cur := ds.get().Cur
	moved := 0
	for _, name := range names {
		b := join(lp, cur.BucketName(cur.Bucket(name)))
		err := fs.moveName(self, join(src, name), join(b, name))
		if errors.Is(err, syscall.ENOENT) {
			err = fs.mkbucket(ctx, ds, lp, b)
			ds.nlinkMu.Lock()
			ds.nlink = -1 // counted the buckets
			ds.nlinkMu.Unlock()
			if err == nil {
				err = fs.moveName(self, join(src, name), join(b, name))
			}
		}
		if errors.Is(err, syscall.ENOENT) {
			continue // gone meanwhile (behind the layer)
		}
		if errors.Is(err, syscall.EEXIST) {
			return moved, fmt.Errorf("%s is in both %s and %s: keep one (in the lower) and run again", name, src, b)
		}
		if err != nil {
			return moved, err
		}
		moved++
	}
	return moved, nil
}

// list calls fn with the names of lower directory dir until it says stop
// (but the claim's lock file, which stays where it is).
func (fs *FS) list(ctx context.Context, dir string, fn func(string) bool) error {
	d, err := layer.OpenDir(layer.AsSelf(ctx), fs.lower, dir)
	if err != nil {
		return err
	}
	defer d.Close()
	for {
		e, _, err := d.Next(ctx, false)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if dir == "" && e.Name == LockName {
			continue
		}
		if !fn(e.Name) {
			return nil
		}
	}
}

// lowerDir is directory path's lower path.
func (fs *FS) lowerDir(ctx context.Context, path string) (string, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return "", err
	}
	r.done()
	return r.lower, nil
}

// The control names, through the mount: setting controlPrefix+"reshard" on
// a directory starts its resharding in the daemon (the value: a layout,
// "hash 1024", "digits 1000", or empty for the rule's); reading
// controlPrefix+"progress" follows it, and controlPrefix+"layout" is the
// directory's record.
const controlPrefix = "user.cairn-shard."

func (fs *FS) setControl(ctx context.Context, path, name string, value []byte) error {
	if name != controlPrefix+"reshard" {
		return syscall.EPERM
	}
	if c := layer.CallerOf(ctx); c != nil && c.Uid != 0 {
		return syscall.EPERM
	}
	to, err := fs.layoutFor(path, string(value))
	if err != nil {
		return syscall.EINVAL
	}
	done := make(chan error, 1)
	go func() {
		err := fs.Reshard(context.Background(), path, to, nil)
		done <- err
	}()
	// A refusal that comes at once (a clash, a busy directory) is the
	// answer; otherwise it runs on.
	select {
	case err := <-done:
		if err != nil {
			return syscall.EINVAL
		}
	case <-time.After(50 * time.Millisecond):
	}
	return nil
}

func (fs *FS) getControl(ctx context.Context, path, name string, dest []byte) (int, error) {
	var v string
	switch name {
	case controlPrefix + "progress":
		fs.mu.Lock()
		j := fs.jobs[path]
		fs.mu.Unlock()
		if j == nil {
			return 0, layer.ENOATTR
		}
		v = j.Status()
	case controlPrefix + "layout":
		lp, err := fs.lowerDir(ctx, path)
		if err != nil {
			return 0, err
		}
		ds, err := fs.state(ctx, path, lp)
		if err != nil {
			return 0, err
		}
		ds.mu.RLock()
		if st := ds.get(); st == nil {
			v = Flat
		} else {
			v = string(st.Encode())
		}
		ds.mu.RUnlock()
	default:
		return 0, layer.ENOATTR
	}
	if len(dest) == 0 {
		return len(v), nil
	}
	if len(dest) < len(v) {
		return 0, syscall.ERANGE
	}
	return copy(dest, v), nil
}

// layoutFor is the layout s names ("hash 1024", "digits 1000"), or with s
// empty the one the rules give path (or the default): for a growing hash
// layout, hash with 0 buckets (as many as the entries need, see Reshard).
func (fs *FS) layoutFor(path, s string) (Layout, error) {
	t, grow, ok := fs.policy(path)
	if !ok {
		t, grow = start(fs.cfg.Default, fs.cfg.MaxBucket)
	}
	if grow > 0 {
		t.Buckets = 0
	}
	if s = strings.TrimSpace(s); s != "" {
		var n int
		var scheme string
		if _, err := fmt.Sscanf(s, "%s %d", &scheme, &n); err != nil {
			return Layout{}, fmt.Errorf("layout %q: want SCHEME BUCKETS (hash 1024, digits 1000)", s)
		}
		t.Scheme, t.Buckets = scheme, n
	}
	if t.Scheme == Hash && t.Buckets == 0 {
		return t, nil
	}
	return t, t.Check()
}

// LayoutFor is layoutFor for the command.
func (fs *FS) LayoutFor(path, s string) (Layout, error) { return fs.layoutFor(path, s) }

// Stack finds the shard layer in a stack.
func Stack(top layer.FS) *FS {
	var s *FS
	layer.Walk(top, func(l layer.FS) {
		if x, ok := l.(*FS); ok && s == nil {
			s = x
		}
	})
	return s
}
