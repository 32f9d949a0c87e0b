// Package shard is Usenetfs revived: directories that a rule selects keep
// their entries in bucket subdirectories of the lower, chosen by a hash of
// the name (or a number's last digits), so that a lookup, create or unlink
// in a directory of a million entries touches one small lower directory.
// Only a listing visits every bucket, in key order, so that its cookies
// stay valid whatever is created, removed or moved between buckets (see
// docs/shard.md).
//
// Each sharded directory carries its layout as side data (layer.Meta key
// "layout", a State): a directory without one is served flat, as the
// lower has it, until `cairn reshard` converts it, which can run while the
// directory is in use and resumes after a crash from the record. A hash
// directory made through the layer starts with one bucket, and the daemon
// grows it the same way as it fills (grow.go).
package shard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/registry"
)

// Config is what New needs.
type Config struct {
	// Rules select the directories a new or converted directory is sharded
	// in, each with its layout (nil: every directory, with Default).
	Rules registry.Rules
	// Default is the layout where a rule names none.
	Default Layout
	// MaxBucket, when not 0, makes hash directories grow: a new one starts
	// with one bucket (Default.Buckets aside), and the daemon splits the
	// buckets of one whose average bucket holds more entries than this
	// (grow.go). A rule's buckets option fixes its directories' count.
	MaxBucket int
}

// FS is a shard layer over one lower.
//
// It keeps the writeback cache (layer.FSWriteback, its lowers'): a file's
// bytes live in one lower and are read and written only in answer to the
// kernel's requests; resharding is done unmounted.
type FS struct {
	layer.NotImplemented
	lower layer.FS
	meta  *layer.Meta
	cfg   Config

	mu     sync.Mutex
	dirs   map[string]*dirState // by path in this layer; see state
	jobs   map[string]*Job      // resharding runs, by path
	unlock func()

	noRenameFlags atomic.Bool // the lower refused RENAME_NOREPLACE (see moveName)

	// Automatic growth (grow.go): its goroutines, stopped by Close;
	// renaming holds the paths of the renames and removals under way, no
	// growth starts at or below them (see busy).
	bg       sync.WaitGroup
	bgCtx    context.Context
	bgStop   context.CancelFunc
	closed   bool
	renaming map[string]int
}

// dirState is one directory's record, cached. Every operation that
// resolves a name in the directory holds mu for reading (an operation on
// two names may hold it twice); a resharding moves entries holding it for
// writing, a batch at a time, taken with TryLock so that a waiting writer
// never blocks a second read lock.
type dirState struct {
	mu sync.RWMutex
	st atomic.Pointer[State] // nil: flat; replaced, never changed

	nlinkMu sync.Mutex
	nlink   int64 // the subdirectories' links, -1: not known

	// attrMu orders the making of buckets and the changes of what they
	// inherit (mkbucket, passOn).
	attrMu sync.Mutex

	// Growth (grow.go): the average bucket size past which the directory
	// grows (0: never by itself), its entry count (an estimate, kept from
	// the first change on: see grow), and whether a growth runs.
	maxBucket int
	entries   atomic.Int64
	counted   atomic.Bool
	growing   atomic.Bool
	retryAt   atomic.Int64 // unix nanoseconds: no growth before (after a failure)
}

func (ds *dirState) get() *State { return ds.st.Load() }

func (ds *dirState) getOrNil() *State {
	if ds == nil {
		return nil
	}
	return ds.get()
}

const metaName = "shard"

// New stacks a shard layer over lower.
func New(lower layer.FS, cfg Config) (*FS, error) {
	if err := cfg.Default.Check(); err != nil {
		return nil, fmt.Errorf("shard: %v", err)
	}
	fs := &FS{lower: lower, meta: layer.NewMeta(lower, metaName), cfg: cfg,
		dirs: map[string]*dirState{}, jobs: map[string]*Job{}, renaming: map[string]int{}}
	fs.bgCtx, fs.bgStop = context.WithCancel(context.Background())
	return fs, nil
}

func (fs *FS) Lowers() []layer.FS { return []layer.FS{fs.lower} }

// Changes: names are the same, but they live elsewhere below, and listings
// differ from the lower's.
func (fs *FS) Changes() layer.Changes { return layer.ChangesNames | layer.ChangesPlacement }

// LockName is the file at the root of the lower whose lock the claim
// takes, which other clients of a network file system see; the layer
// hides it (resolve, making, listings), and reshardings leave it in
// place (list).
const LockName = ".cairn-shard.lock"

// Claim locks the lower: a resharding outside the daemon would move
// entries under it. Exclusive, even with -shared.
func (fs *FS) Claim(ctx context.Context) error {
	if fs.unlock != nil {
		return nil
	}
	u, err := layer.LockLowerOwn(ctx, fs.lower, "shard", LockName, false)
	if err != nil {
		return err
	}
	fs.unlock = u
	return nil
}

func (fs *FS) Close() error {
	// Growths stop at their next batch; their records say where.
	fs.mu.Lock()
	fs.closed = true
	fs.mu.Unlock()
	fs.bgStop()
	fs.bg.Wait()
	if fs.unlock != nil {
		fs.unlock()
		fs.unlock = nil
	}
	return nil
}

// Target is the layout a rule gives a new directory at path, and whether
// one covers it.
func (fs *FS) Target(path string) (Layout, bool) {
	l, _, ok := fs.policy(path)
	return l, ok
}

// policy is the layout a new directory at path gets, the average bucket
// size past which it grows (0: never by itself), and whether a rule covers
// path.
func (fs *FS) policy(path string) (Layout, int, bool) {
	if fs.cfg.Rules == nil {
		l, grow := start(fs.cfg.Default, fs.cfg.MaxBucket)
		return l, grow, true
	}
	r, ok := fs.cfg.Rules.First(path)
	if !ok {
		return Layout{}, 0, false
	}
	l, grow := rulePolicy(r, fs.cfg.Default, fs.cfg.MaxBucket)
	return l, grow, true
}

// maxBucket is policy's growth threshold for directory path; one no rule
// covers (sharded elsewhere, then renamed) grows as the layer's default.
func (fs *FS) maxBucket(path string) int {
	if _, grow, ok := fs.policy(path); ok {
		return grow
	}
	_, grow := start(fs.cfg.Default, fs.cfg.MaxBucket)
	return grow
}

// rulePolicy is policy under rule r, over the layer's layout d and
// max_bucket grow: a rule's buckets fixes the count, its max_bucket
// replaces the layer's.
func rulePolicy(r registry.Rule, d Layout, grow int) (Layout, int) {
	l := d
	if s, _ := r.Values["scheme"].(string); s != "" && s != l.Scheme {
		l.Scheme = s
		l.Buckets = DefaultBuckets
		if s == Digits {
			l.Buckets = 1000
		}
	}
	if n, ok := r.Values["max_bucket"].(int64); ok {
		grow = int(n)
	}
	if n, _ := r.Values["buckets"].(int64); n != 0 {
		l.Buckets = int(n)
		grow = 0
	}
	return start(l, grow)
}

// start is the layout a new directory gets: one bucket for a growing
// hash layout (it splits as it fills), else l itself.
func start(l Layout, grow int) (Layout, int) {
	if l.Scheme != Hash || grow <= 0 {
		return l, 0
	}
	l.Buckets = 1
	return l, grow
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

func split(p string) (string, string) {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

// state returns directory path's record, read from lower directory lp the
// first time.
func (fs *FS) state(ctx context.Context, path, lp string) (*dirState, error) {
	fs.mu.Lock()
	ds := fs.dirs[path]
	fs.mu.Unlock()
	if ds != nil {
		return ds, nil
	}
	ds = &dirState{nlink: -1, maxBucket: fs.maxBucket(path)}
	b, err := fs.meta.Get(ctx, lp, "layout")
	switch {
	case err == nil:
		st, err := ParseState(b)
		if err != nil {
			return nil, fmt.Errorf("shard: %s: %v", path, err)
		}
		ds.st.Store(&st)
	case errors.Is(err, layer.ENOATTR), errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOTSUP),
		errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		// No record (a symbolic link or device refuses user.* names): flat.
	default:
		return nil, err
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if old := fs.dirs[path]; old != nil {
		return old, nil
	}
	if len(fs.dirs) > 1<<16 {
		for k, v := range fs.dirs {
			if st := v.get(); st == nil || st.From == nil {
				delete(fs.dirs, k)
			}
		}
	}
	fs.dirs[path] = ds
	return ds, nil
}

// forget drops the records of path and every directory below it (after a
// rename or rmdir).
func (fs *FS) forget(path string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for k := range fs.dirs {
		if k == path || strings.HasPrefix(k, path+"/") || path == "" {
			delete(fs.dirs, k)
		}
	}
}

// res is a path resolved to the lower, with the read locks taken on the
// way (release them with done).
type res struct {
	lower  string    // the object's lower path
	dir    string    // its directory's path in this layer
	parent *dirState // its directory's record (nil for the root)
	plow   string    // the directory's lower path
	bucket string    // the lower path of the bucket it is in ("" if none)
	locks  []*dirState
}

func (r *res) done() {
	for i := len(r.locks) - 1; i >= 0; i-- {
		r.locks[i].mu.RUnlock()
	}
	r.locks = nil
}

// resolve finds path's lower path, with every directory on the way
// read-locked until r.done.
func (fs *FS) resolve(ctx context.Context, path string) (*res, error) {
	r := &res{}
	if path == "" {
		return r, nil
	}
	if path == LockName {
		return nil, syscall.ENOENT
	}
	dir, lp := "", ""
	for {
		i := strings.IndexByte(path, '/')
		name := path
		if i >= 0 {
			name = path[:i]
		}
		ds, err := fs.state(ctx, dir, lp)
		if err != nil {
			r.done()
			return nil, err
		}
		ds.mu.RLock()
		r.locks = append(r.locks, ds)
		r.parent, r.plow, r.dir = ds, lp, dir
		r.lower, r.bucket = fs.child(ctx, ds, lp, name)
		if i < 0 {
			return r, nil
		}
		dir, lp, path = join(dir, name), r.lower, path[i+1:]
	}
}

// child is where name is kept in the directory whose lower path is lp,
// and the bucket it is kept in. During a resharding it may be in its new
// bucket or still in its old place: the new one if it exists there or
// nowhere (a create), else the old one.
func (fs *FS) child(ctx context.Context, ds *dirState, lp, name string) (string, string) {
	st := ds.get()
	if st == nil {
		return join(lp, name), ""
	}
	b := join(lp, st.Cur.BucketName(st.Cur.Bucket(name)))
	if st.From == nil {
		return join(b, name), b
	}
	var old, oldb string
	if st.From.Scheme == Flat {
		old = join(lp, name)
	} else {
		s := st.From.Bucket(name)
		if s < st.Next {
			return join(b, name), b
		}
		oldb = join(lp, st.From.BucketName(s))
		old = join(oldb, name)
	}
	ctx = layer.AsSelf(ctx)
	if _, err := fs.lower.Getattr(ctx, join(b, name)); err == nil {
		return join(b, name), b
	}
	if _, err := fs.lower.Getattr(ctx, old); err == nil {
		return old, oldb
	}
	return join(b, name), b
}

// reserved says whether name may not be made in directory dir: names
// that begin with the bucket prefix, in a directory a rule covers (they
// would be taken for buckets when it is sharded).
func (fs *FS) reserved(dir, name string, ds *dirState) error {
	pfx := ""
	if st := ds.getOrNil(); st != nil {
		pfx = st.Cur.Prefix
	} else if t, ok := fs.Target(dir); ok {
		pfx = t.Prefix
	}
	if pfx != "" && strings.HasPrefix(name, pfx) {
		return syscall.EINVAL
	}
	return nil
}

// inBucket runs op, which makes an object in r's place, making the bucket
// first if op finds none.
func (fs *FS) inBucket(ctx context.Context, r *res, op func() error) error {
	err := op()
	if !errors.Is(err, syscall.ENOENT) || r.bucket == "" {
		return err
	}
	err = fs.mkbucket(ctx, r.parent, r.plow, r.bucket)
	r.parent.nlinkMu.Lock()
	r.parent.nlink = -1 // counted the buckets
	r.parent.nlinkMu.Unlock()
	if err != nil {
		return err
	}
	return op()
}

// inherited are the attributes of a sharded directory that decide what
// is made in it and who may make it, which its buckets carry as their
// own: owner, group, mode (set-group-ID included) and the POSIX ACLs,
// access and default. A new object in a bucket then gets from the lower
// the group, set-group-ID bit, ACL and mode it would get in the directory
// itself (see docs/shard.md).
type inherited struct {
	a    layer.Attr
	acls map[string][]byte // by name; nil value: none
}

var aclNames = []string{"system.posix_acl_access", "system.posix_acl_default"}

// inheritance reads what directory lp's buckets inherit from it.
func (fs *FS) inheritance(ctx context.Context, lp string) (inherited, error) {
	ctx = layer.AsSelf(ctx)
	a, err := fs.lower.Getattr(ctx, lp)
	if err != nil {
		return inherited{}, err
	}
	in := inherited{a: a, acls: map[string][]byte{}}
	for _, name := range aclNames {
		buf := make([]byte, 256)
		for {
			n, err := fs.lower.Getxattr(ctx, lp, name, buf)
			if errors.Is(err, syscall.ERANGE) && len(buf) < 1<<16 {
				buf = make([]byte, 4*len(buf))
				continue
			}
			if err == nil {
				in.acls[name] = buf[:n]
			}
			break // none (ENODATA), or none the lower keeps
		}
	}
	return in, nil
}

// inherit gives bucket b what it inherits (errors of a lower without
// ACLs aside).
func (fs *FS) inherit(ctx context.Context, b string, in inherited) error {
	ctx = layer.AsSelf(ctx)
	for _, name := range aclNames {
		var err error
		if v := in.acls[name]; v != nil {
			err = fs.lower.Setxattr(ctx, b, name, v, 0)
		} else {
			err = fs.lower.Removexattr(ctx, b, name)
		}
		if err != nil && !errors.Is(err, layer.ENOATTR) && !errors.Is(err, syscall.EOPNOTSUPP) && !errors.Is(err, syscall.ENOTSUP) {
			return err
		}
	}
	// The mode last: it is what the access ACL's mask already says, and a
	// chown clears no bit of a directory's before it.
	set := &layer.SetAttr{Valid: layer.SetMode, Mode: in.a.Mode & 0o7777}
	if unix.Geteuid() == 0 {
		set.Valid |= layer.SetUid | layer.SetGid
		set.Uid, set.Gid = in.a.Uid, in.a.Gid
	}
	_, err := fs.lower.Setattr(ctx, b, set)
	return err
}

// mkbucket makes bucket directory b of directory lp (ds's), inheriting
// lp's attributes, so that whoever may create in the directory may in the
// bucket, and what they make is what it would be in the directory.
func (fs *FS) mkbucket(ctx context.Context, ds *dirState, lp, b string) error {
	ds.attrMu.Lock()
	defer ds.attrMu.Unlock()
	in, err := fs.inheritance(ctx, lp)
	if err != nil {
		return err
	}
	if _, err := fs.lower.Mkdir(layer.AsSelf(ctx), b, in.a.Mode&0o7777); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return nil
		}
		return err
	}
	return fs.inherit(ctx, b, in)
}

// passOn gives every existing bucket of directory path (lower lp) what it
// inherits, after a change of it (chmod, chown, setfacl). A bucket being
// made meanwhile (resharding makes them while the directory is in use)
// read the directory before the change or after it: attrMu makes
// mkbucket's read, mkdir and copy one step, so a bucket made with what
// was there before exists by the time passOn lists them.
func (fs *FS) passOn(ctx context.Context, path, lp string) error {
	ds, err := fs.state(ctx, path, lp)
	if err != nil {
		return err
	}
	ds.attrMu.Lock()
	defer ds.attrMu.Unlock()
	st := ds.get()
	if st == nil {
		return nil
	}
	in, err := fs.inheritance(ctx, lp)
	if err != nil {
		return nil // the change is made; the directory is gone since
	}
	for _, b := range buckets(st) {
		if err := fs.inherit(ctx, join(lp, b), in); err != nil && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("shard: %s: bucket %s keeps its old attributes: %w", path, b, err)
		}
	}
	return nil
}

// passOnACL is passOn after a change of an ACL of path, if it is a
// directory.
func (fs *FS) passOnACL(ctx context.Context, path, lp string) error {
	if a, err := fs.lower.Getattr(layer.AsSelf(ctx), lp); err != nil || !a.IsDir() {
		return nil
	}
	return fs.passOn(ctx, path, lp)
}

// changed records a change of the names of r's directory: its times, which
// the lower changed in a bucket, and (dirs) its subdirectory count.
func (fs *FS) changed(ctx context.Context, r *res, dirs bool) {
	if r.bucket == "" {
		return
	}
	fs.lower.Setattr(layer.AsSelf(ctx), r.plow, &layer.SetAttr{Valid: layer.SetMtimeNow})
	if dirs {
		r.parent.nlinkMu.Lock()
		r.parent.nlink = -1
		r.parent.nlinkMu.Unlock()
	}
}

// buckets lists the bucket directories that may exist in ds.
func buckets(st *State) []string {
	var out []string
	for _, l := range []*Layout{&st.Cur, st.From} {
		if l == nil || l.Scheme == Flat {
			continue
		}
		for b := 0; b < l.Buckets; b++ {
			out = append(out, l.BucketName(b))
		}
	}
	return out
}

// dirAttr makes a sharded directory's attributes: the link count is its
// subdirectories', not its buckets'.
func (fs *FS) dirAttr(ctx context.Context, ds *dirState, lp string, a layer.Attr) layer.Attr {
	st := ds.getOrNil()
	if st == nil || !a.IsDir() {
		return a
	}
	ds.nlinkMu.Lock()
	defer ds.nlinkMu.Unlock()
	n := int64(a.Nlink)
	if ds.nlink < 0 {
		var nb, sub int64
		for _, b := range buckets(st) {
			ba, err := fs.lower.Getattr(layer.AsSelf(ctx), join(lp, b))
			if err == nil && ba.IsDir() {
				nb++
				sub += int64(ba.Nlink) - 2
			}
		}
		ds.nlink = sub - nb // to add to the lower's count
	}
	n += ds.nlink
	if n < 2 {
		n = 2
	}
	a.Nlink = uint32(n)
	return a
}

// Getattr is the lower object's attributes; a sharded directory's link
// count is its subdirectories' (dirAttr).
func (fs *FS) Getattr(ctx context.Context, path string) (layer.Attr, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	defer r.done()
	// A sharded directory's link count is the lower's and its buckets':
	// read both while no resharding makes or removes buckets. (One whose
	// record is not cached has none running.)
	fs.mu.Lock()
	cached := fs.dirs[path]
	fs.mu.Unlock()
	if cached.getOrNil() != nil {
		cached.mu.RLock()
		defer cached.mu.RUnlock()
	}
	a, err := fs.lower.Getattr(ctx, r.lower)
	if err != nil || !a.IsDir() {
		return a, err
	}
	ds, err := fs.state(ctx, path, r.lower)
	if err != nil {
		return layer.Attr{}, err
	}
	return fs.dirAttr(ctx, ds, r.lower, a), nil
}

func (fs *FS) Setattr(ctx context.Context, path string, in *layer.SetAttr) (layer.Attr, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	defer r.done()
	a, err := fs.lower.Setattr(ctx, r.lower, in)
	if err != nil || !a.IsDir() {
		return a, err
	}
	if in.Valid&(layer.SetMode|layer.SetUid|layer.SetGid) != 0 {
		// Buckets follow the directory's owner and mode (and its ACL's
		// mask, which chmod changes).
		if err := fs.passOn(ctx, path, r.lower); err != nil {
			return layer.Attr{}, err
		}
	}
	ds, err := fs.state(ctx, path, r.lower)
	if err != nil {
		return layer.Attr{}, err
	}
	return fs.dirAttr(ctx, ds, r.lower, a), nil
}

func (fs *FS) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	defer r.done()
	return fs.lower.Open(ctx, r.lower, flags)
}

// making resolves path for an operation that makes a name, refusing
// reserved names.
func (fs *FS) making(ctx context.Context, path string) (*res, error) {
	if path == LockName {
		return nil, syscall.EPERM
	}
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	dir, name := split(path)
	if err := fs.reserved(dir, name, r.parent); err != nil {
		r.done()
		return nil, err
	}
	return r, nil
}

func (fs *FS) Create(ctx context.Context, path string, flags int, mode uint32) (f layer.File, a layer.Attr, err error) {
	r, err := fs.making(ctx, path)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	defer r.done()
	err = fs.inBucket(ctx, r, func() (err error) { f, a, err = fs.lower.Create(ctx, r.lower, flags, mode); return })
	if err == nil {
		fs.changed(ctx, r, false)
		fs.count(r, 1)
	}
	return f, a, err
}

// made runs a making operation that returns attributes.
func (fs *FS) made(ctx context.Context, path string, dir bool, op func(lp string) (layer.Attr, error)) (a layer.Attr, err error) {
	r, err := fs.making(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	defer r.done()
	err = fs.inBucket(ctx, r, func() (err error) { a, err = op(r.lower); return })
	if err == nil {
		fs.changed(ctx, r, dir)
		fs.count(r, 1)
	}
	return a, err
}

func (fs *FS) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	a, err := fs.made(ctx, path, true, func(lp string) (layer.Attr, error) {
		a, err := fs.lower.Mkdir(ctx, lp, mode)
		if err != nil {
			return a, err
		}
		fs.forget(path)
		if t, ok := fs.Target(path); ok {
			// A new directory under a rule is sharded from the start (its
			// buckets are made as names arrive).
			st := State{V: 1, Cur: t}
			if err := fs.meta.Set(ctx, lp, "layout", st.Encode()); err != nil &&
				!errors.Is(err, syscall.EOPNOTSUPP) && !errors.Is(err, syscall.ENOTSUP) {
				fs.lower.Rmdir(layer.AsSelf(ctx), lp)
				return layer.Attr{}, err
			}
		}
		return a, nil
	})
	return a, err
}

func (fs *FS) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (layer.Attr, error) {
	return fs.made(ctx, path, false, func(lp string) (layer.Attr, error) { return fs.lower.Mknod(ctx, lp, mode, rdev) })
}

func (fs *FS) Symlink(ctx context.Context, target, path string) (layer.Attr, error) {
	return fs.made(ctx, path, false, func(lp string) (layer.Attr, error) { return fs.lower.Symlink(ctx, target, lp) })
}

func (fs *FS) Readlink(ctx context.Context, path string) (string, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return "", err
	}
	defer r.done()
	return fs.lower.Readlink(ctx, r.lower)
}

func (fs *FS) Link(ctx context.Context, oldpath, newpath string) (layer.Attr, error) {
	o, err := fs.resolve(ctx, oldpath)
	if err != nil {
		return layer.Attr{}, err
	}
	defer o.done()
	return fs.made(ctx, newpath, false, func(lp string) (layer.Attr, error) { return fs.lower.Link(ctx, o.lower, lp) })
}

func (fs *FS) Unlink(ctx context.Context, path string) error {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return err
	}
	defer r.done()
	err = fs.lower.Unlink(ctx, r.lower)
	if err == nil {
		fs.changed(ctx, r, false)
		fs.count(r, -1)
	}
	return err
}

func (fs *FS) Rmdir(ctx context.Context, path string) error {
	release, err := fs.busy(path)
	if err != nil {
		return err
	}
	defer release()
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return err
	}
	defer r.done()
	if err := fs.emptyBuckets(ctx, path, r.lower); err != nil {
		return err
	}
	err = fs.lower.Rmdir(ctx, r.lower)
	if err == nil {
		fs.forget(path)
		fs.changed(ctx, r, true)
		fs.count(r, -1)
	}
	return err
}

// emptyBuckets removes the buckets of directory path (lower lp) before
// the directory is removed or replaced: empty buckets go; one that is not
// empty says ENOTEMPTY. Those removed already come back when a name
// needs them.
func (fs *FS) emptyBuckets(ctx context.Context, path, lp string) error {
	ds, err := fs.state(ctx, path, lp)
	st := ds.getOrNil()
	if err != nil || st == nil {
		return err
	}
	defer func() {
		ds.nlinkMu.Lock()
		ds.nlink = -1
		ds.nlinkMu.Unlock()
	}()
	for _, b := range buckets(st) {
		err := fs.lower.Rmdir(layer.AsSelf(ctx), join(lp, b))
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			if errors.Is(err, syscall.EEXIST) {
				err = syscall.ENOTEMPTY
			}
			return err
		}
	}
	return nil
}

// busy refuses to rename or remove a directory that `cairn reshard` is
// resharding, or one above it. A growth the daemon started by itself is
// stopped instead (at its next batch: the record says where, and the next
// change in the directory resumes it), and none starts until release:
// a job keeps its directory's path.
func (fs *FS) busy(paths ...string) (release func(), err error) {
	fs.mu.Lock()
	var stop []*Job
	for p, j := range fs.jobs {
		for _, path := range paths {
			if j.running() && (p == path || strings.HasPrefix(p, path+"/") || path == "") {
				if !j.auto {
					fs.mu.Unlock()
					return nil, syscall.EBUSY
				}
				j.cancel()
				stop = append(stop, j)
			}
		}
	}
	for _, path := range paths {
		fs.renaming[path]++
	}
	fs.mu.Unlock()
	for _, j := range stop {
		<-j.stopped
	}
	return func() {
		fs.mu.Lock()
		for _, path := range paths {
			if fs.renaming[path]--; fs.renaming[path] == 0 {
				delete(fs.renaming, path)
			}
		}
		fs.mu.Unlock()
	}, nil
}

func (fs *FS) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	release, err := fs.busy(oldpath, newpath)
	if err != nil {
		return err
	}
	defer release()
	o, err := fs.resolve(ctx, oldpath)
	if err != nil {
		return err
	}
	defer o.done()
	n, err := fs.making(ctx, newpath)
	if err != nil {
		return err
	}
	defer n.done()
	if flags&layer.RenameExchange != 0 {
		dir, name := split(oldpath)
		if err := fs.reserved(dir, name, o.parent); err != nil {
			return err
		}
	}
	a, aerr := fs.lower.Getattr(layer.AsSelf(ctx), o.lower)
	b, berr := fs.lower.Getattr(layer.AsSelf(ctx), n.lower)
	if berr == nil && b.IsDir() && aerr == nil && a.IsDir() && flags&layer.RenameExchange == 0 {
		// A directory replaces an empty one: the empty buckets go first.
		if err := fs.emptyBuckets(ctx, newpath, n.lower); err != nil {
			return err
		}
	}
	err = fs.inBucket(ctx, n, func() error { return fs.lower.Rename(ctx, o.lower, n.lower, flags) })
	if err != nil {
		return err
	}
	isDir := aerr == nil && a.IsDir() || berr == nil && b.IsDir()
	if isDir || flags&layer.RenameExchange != 0 {
		fs.forget(oldpath)
		fs.forget(newpath)
	}
	fs.changed(ctx, o, isDir)
	fs.changed(ctx, n, isDir)
	switch {
	case flags&layer.RenameExchange != 0: // both names stay
	case berr == nil:
		fs.count(o, -1) // the new name replaced one
	default:
		fs.count(o, -1)
		fs.count(n, 1)
	}
	return nil
}

// Extended attributes: the layer's record is hidden; the control names
// (control.go) start and follow a resharding.
func (fs *FS) Getxattr(ctx context.Context, path, name string, dest []byte) (int, error) {
	if fs.meta.Owns(name) {
		return 0, layer.ENOATTR
	}
	if strings.HasPrefix(name, controlPrefix) {
		return fs.getControl(ctx, path, name, dest)
	}
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return 0, err
	}
	defer r.done()
	return fs.lower.Getxattr(ctx, r.lower, name, dest)
}

func (fs *FS) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	if fs.meta.Owns(name) {
		return syscall.EPERM
	}
	if strings.HasPrefix(name, controlPrefix) {
		return fs.setControl(ctx, path, name, value)
	}
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return err
	}
	defer r.done()
	err = fs.lower.Setxattr(ctx, r.lower, name, value, flags)
	if err != nil || !isACL(name) {
		return err
	}
	return fs.passOnACL(ctx, path, r.lower)
}

func isACL(name string) bool { return name == aclNames[0] || name == aclNames[1] }

func (fs *FS) Removexattr(ctx context.Context, path, name string) error {
	if fs.meta.Owns(name) {
		return syscall.EPERM
	}
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return err
	}
	defer r.done()
	err = fs.lower.Removexattr(ctx, r.lower, name)
	if err != nil || !isACL(name) {
		return err
	}
	return fs.passOnACL(ctx, path, r.lower)
}

func (fs *FS) Listxattr(ctx context.Context, path string, dest []byte) (int, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return 0, err
	}
	defer r.done()
	mb := layer.MetaBase{Base: layer.Base{Lower: fs.lower}, Meta: fs.meta}
	return mb.Listxattr(ctx, r.lower, dest)
}

func (fs *FS) Statfs(ctx context.Context, path string) (layer.Statfs, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return layer.Statfs{}, err
	}
	defer r.done()
	return fs.lower.Statfs(ctx, r.lower)
}

// SyncDir makes the directory's entries durable: those of its buckets too.
func (fs *FS) SyncDir(ctx context.Context, path string) error {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return err
	}
	defer r.done()
	ds, err := fs.state(ctx, path, r.lower)
	if err != nil {
		return err
	}
	if st := ds.get(); st != nil {
		for _, b := range buckets(st) {
			if err := fs.lower.SyncDir(ctx, join(r.lower, b)); err != nil && !errors.Is(err, syscall.ENOENT) {
				return err
			}
		}
	}
	return fs.lower.SyncDir(ctx, r.lower)
}

// Tmpfile makes the nameless file in the directory itself: it has no
// entry anywhere until LinkFile gives it one.
func (fs *FS) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	r, err := fs.resolve(ctx, dir)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	defer r.done()
	return fs.lower.Tmpfile(ctx, r.lower, flags, mode)
}

func (fs *FS) LinkFile(ctx context.Context, f layer.File, newpath string) (layer.Attr, error) {
	return fs.made(ctx, newpath, false, func(lp string) (layer.Attr, error) { return fs.lower.LinkFile(ctx, f, lp) })
}

func (fs *FS) GetFlags(ctx context.Context, path string) (uint32, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return 0, err
	}
	defer r.done()
	return fs.lower.GetFlags(ctx, r.lower)
}

func (fs *FS) SetFlags(ctx context.Context, path string, flags uint32) error {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return err
	}
	defer r.done()
	return fs.lower.SetFlags(ctx, r.lower, flags)
}

func (fs *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	d, err := fs.OpenDir(ctx, path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return layer.ReadDirAll(ctx, d, plus)
}
