// Package chains is MonA's per-file transformation chains: each regular
// file of the lower carries its own chain of transforms (layer.Transform:
// the codec engines, crypt's content), recorded with the file; a file with
// no chain is unguarded and passes through untouched (and to the kernel,
// with FUSE passthrough). Rules choose the chain of a new file by its path;
// the xattr user.cairn.chain shows a file's chain and pushes or pops links
// on a live file. docs/chains.md has the format and the semantics.
package chains

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/pathmatch"
)

// XattrName is the attribute that shows and changes a file's chain.
const XattrName = "user.cairn.chain"

// TmpDir is the directory at the root of the lower where conversions
// write the new form of a file before renaming it over the old one. It
// is the layer's own: hidden, emptied when the layer starts.
const TmpDir = ".cairn-chains"

// LockName is the file at the root of the lower whose lock the claim
// takes (check.go), which other clients of a network file system see:
// the layer's own, hidden as TmpDir is.
const LockName = ".cairn-chains.lock"

// CryptLink is the name of crypt's content as a link.
const CryptLink = "crypt"

// Rule gives new files whose path it matches a chain.
type Rule struct {
	Paths *pathmatch.Set
	Chain []string // top first
}

// Options configure the layer.
type Options struct {
	Rules []Rule
	// Crypt is the content encryption for crypt links (nil: a crypt link
	// has no key, EACCES), over the same lower.
	Crypt  *crypt.Content
	Logger *slog.Logger
	// ViewBudget is the memory all open transformation links may hold
	// for their views together (0: DefaultViewBudget).
	ViewBudget int64
}

// FS is the chains layer.
type FS struct {
	layer.MetaBase
	o   Options
	log *slog.Logger

	mu     sync.Mutex
	chains map[string]*chain // built chains, by their names joined with ","
	// writers counts the handles open for writing, by lower identity: a
	// conversion waits for them (see convert).
	writers map[layer.ID]int
	wcond   *sync.Cond
	conv    sync.Mutex // one conversion at a time
	// swap keeps a path naming one file while an operation reads the
	// file's record and acts through the chain it names (read lock):
	// what replaces or removes a file at a path (a rename, an unlink, the
	// rename that ends a conversion, a link record made on a file) takes
	// it for writing. Without it, an operation could read one file's
	// chain and open another through it: two engines would keep states of
	// one stored file, and their writes would corrupt it.
	swap    sync.RWMutex
	sizes   linkSizes  // the presented sizes of transformation links
	views   viewBudget // the memory views of links hold
	release func()     // lets go of the claim on the lower (Claim)
	cleaned []string   // the unfinished conversions Claim removed
}

// chain is a built chain: ts[0] is the top transform; ts[i] stores its
// files through layer.Transformed(lower, ts[i+1]); the last stores them in
// the lower.
type chain struct {
	names []string
	ts    []layer.Transform
}

// New makes the chains layer over lower.
func New(lower layer.FS, o Options) (*FS, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	for _, r := range o.Rules {
		if err := checkNames(r.Chain, true); err != nil {
			return nil, err
		}
	}
	fs := &FS{MetaBase: layer.MetaBase{Base: layer.Base{Lower: lower}, Meta: layer.NewMeta(lower, "chains")},
		o: o, log: o.Logger, chains: map[string]*chain{}, writers: map[layer.ID]int{}}
	fs.wcond = sync.NewCond(&fs.mu)
	fs.views.max = o.ViewBudget
	if fs.views.max <= 0 {
		fs.views.max = DefaultViewBudget
	}
	fs.views.cond = sync.NewCond(&fs.views.mu)
	return fs, nil
}

func (fs *FS) Changes() layer.Changes { return layer.ChangesData | layer.ChangesAttrs }

// ReplacesOnXattr: pushing or popping a chain (user.cairn.chain) renames a
// rewritten file over the old one (layer.XattrReplacer).
func (fs *FS) ReplacesOnXattr() bool { return true }

// FSCaps: no O_TMPFILE (a new file would need a chain before it has a
// path), no renameat2 whiteouts of our own to worry about. No writeback
// cache (layer.FSWriteback): a transformation link's view is made in the
// daemon, at the link's open, from its target's bytes as the stack has
// them; under the cache, the bytes written to the target and not yet
// written back by the kernel (its writer has not closed or fsync'ed it)
// would be missing from the view, which today has every write(2) made
// before the open. (Conversions by user.cairn.chain would be safe: they
// wait until no file of the target is open for writing, and the kernel
// writes its pages back before it lets go of a file.)
func (fs *FS) FSCaps() layer.FSCaps {
	return layer.FSCapsOf(fs.Lower) &^ (layer.FSTmpfile | layer.FSWriteback)
}

func (fs *FS) Tmpfile(context.Context, string, int, uint32) (layer.File, layer.Attr, error) {
	return nil, layer.Attr{}, syscall.EOPNOTSUPP
}

func (fs *FS) LinkFile(context.Context, layer.File, string) (layer.Attr, error) {
	return layer.Attr{}, syscall.EOPNOTSUPP
}

// Close closes the transforms of the built chains.
func (fs *FS) Close() error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var first error
	closed := map[layer.Transform]bool{}
	for _, c := range fs.chains {
		for _, t := range c.ts {
			if closed[t] {
				continue
			}
			closed[t] = true
			if err := t.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	if fs.release != nil {
		fs.release()
		fs.release = nil
	}
	return first
}

// ---- links and chains ----------------------------------------------------

var known sync.Map // link name -> bool

// knownLink reports whether this build has a link called name.
func knownLink(name string) bool {
	if name == CryptLink {
		return true
	}
	if v, ok := known.Load(name); ok {
		return v.(bool)
	}
	if !validName(name) {
		return false
	}
	_, err := codec.NewEngine(nil, name, codec.Options{Level: defaultLevel(name)})
	if err == nil {
		known.Store(name, true) // unknown names are not kept: the user makes them up
	}
	return err == nil
}

// UnknownLinkError is a chain naming a link this build lacks.
type UnknownLinkError struct{ Name string }

func (e *UnknownLinkError) Error() string {
	return fmt.Sprintf("link %q is not in this build of cairn", e.Name)
}

// checkNames checks a chain: known links, crypt at most once and only as
// the last (bottom) link (encrypted bytes do not compress, and one crypt
// journal serves the lower). strict (a new chain: a rule's, a setfattr's):
// an error is EINVAL material, and uuencode may be there once only (each
// one stores a third more, header included: a chain of 30 made a 100-byte
// file 152 MB, and 64 would fill any disk from one setfattr); a recorded
// chain is read whatever it holds.
func checkNames(names []string, strict bool) error {
	uu := 0
	for i, n := range names {
		if !knownLink(n) {
			return &UnknownLinkError{n}
		}
		if n == CryptLink && i != len(names)-1 {
			return errors.New("crypt can only be the last (bottom) link of a chain")
		}
		if n == "uuencode" {
			if uu++; uu > 1 && strict {
				return errors.New("uuencode can be in a chain only once (each one stores a third more)")
			}
		}
	}
	return nil
}

// chainOf builds (once) the chain of names; an empty chain is nil.
func (fs *FS) chainOf(names []string) (*chain, error) {
	if len(names) == 0 {
		return nil, nil
	}
	key := strings.Join(names, ",")
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if c := fs.chains[key]; c != nil {
		return c, nil
	}
	if err := checkNames(names, false); err != nil {
		return nil, err
	}
	if names[len(names)-1] == CryptLink && fs.o.Crypt == nil {
		return nil, syscall.EACCES
	}
	c := &chain{names: names, ts: make([]layer.Transform, len(names))}
	var below layer.FS = fs.Lower
	for i := len(names) - 1; i >= 0; i-- {
		var t layer.Transform
		if names[i] == CryptLink {
			t = fs.o.Crypt
		} else {
			e, err := codec.NewEngine(below, names[i], codec.Options{Level: defaultLevel(names[i]), Logger: fs.log})
			if err != nil {
				return nil, err
			}
			t = e
		}
		c.ts[i] = t
		below = layer.NewTransformed(below, t)
	}
	fs.chains[key] = c
	return c, nil
}

// defaultLevel is the level of a codec link: the codec layer's default.
func defaultLevel(name string) int {
	switch name {
	case "zstd":
		return 3
	case "gzip":
		return 6
	}
	return 0
}

// stat turns the lower attributes of a file stored through c into the
// presented ones.
func (c *chain) stat(ctx context.Context, p string, a *layer.Attr) error {
	for i := len(c.ts) - 1; i >= 0; i-- {
		if err := c.ts[i].Stat(ctx, p, a); err != nil {
			return err
		}
	}
	return nil
}

// settle settles the stored file id in every link, top first (each
// writes what the one above left in it).
func (c *chain) settle(ctx context.Context, id layer.ID) error {
	for _, t := range c.ts {
		if err := t.Settle(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// forget tells every built chain that the stored file id has lost its last
// name.
func (fs *FS) forget(ctx context.Context, id layer.ID) {
	fs.mu.Lock()
	cs := make([]*chain, 0, len(fs.chains))
	for _, c := range fs.chains {
		cs = append(cs, c)
	}
	fs.mu.Unlock()
	for _, c := range cs {
		for _, t := range c.ts {
			t.Forget(ctx, id)
		}
	}
}

// readRecord returns the record of the object at p: a chain (nil:
// unguarded), or a transformation link (links.go). A record this build
// cannot follow is an error naming what it lacks.
func (fs *FS) readRecord(ctx context.Context, p string) ([]string, *link, error) {
	v, err := fs.Meta.Get(ctx, p, metaKey)
	switch {
	case err == layer.ENOATTR || err == syscall.EOPNOTSUPP || err == syscall.EPERM:
		return nil, nil, nil
	case err != nil:
		return nil, nil, err
	}
	if body, ok := strings.CutPrefix(string(v), linkVersion+":"); ok {
		l, err := parseLink(body)
		if err != nil {
			return nil, nil, fmt.Errorf("chains: /%s: link record: %w", p, err)
		}
		return nil, l, nil
	}
	names, err := parseRecord(v)
	if err != nil {
		return nil, nil, fmt.Errorf("chains: /%s: %w", p, err)
	}
	if err := checkNames(names, false); err != nil {
		return nil, nil, fmt.Errorf("chains: /%s: recorded chain %q: %w", p, strings.Join(names, ","), err)
	}
	return names, nil, nil
}

// record returns the recorded chain of the object at p (nil: unguarded,
// or a link, which has no chain of its own).
func (fs *FS) record(ctx context.Context, p string) ([]string, error) {
	names, _, err := fs.readRecord(ctx, p)
	return names, err
}

// chainAt is the built chain of the regular file at p (nil: unguarded).
func (fs *FS) chainAt(ctx context.Context, p string) (*chain, error) {
	names, err := fs.record(ctx, p)
	if err != nil || names == nil {
		return nil, err
	}
	return fs.chainOf(names)
}

// ruleChain is the chain the rules give a new file at p.
func (fs *FS) ruleChain(p string) []string {
	for _, r := range fs.o.Rules {
		if r.Paths.Contains(p) {
			return r.Chain
		}
	}
	return nil
}

// ---- the layer's own names -------------------------------------------------

func (fs *FS) reserved(p string) bool {
	if p == TmpDir || p == LockName {
		return true
	}
	if fs.o.Crypt != nil {
		return fs.o.Crypt.Reserved(p)
	}
	return false
}

// cleanTmp removes what conversions a crash interrupted left in TmpDir,
// once the lower is claimed (another process's conversion may be under
// way until then), and gives the paths it removed.
func (fs *FS) cleanTmp(ctx context.Context) []string {
	ctx = layer.AsSelf(ctx)
	ents, err := fs.Lower.ReadDir(ctx, TmpDir, false)
	if err != nil {
		return nil
	}
	var gone []string
	for _, e := range ents {
		if p := layer.Join(TmpDir, e.Name); fs.Lower.Unlink(ctx, p) == nil {
			gone = append(gone, p)
		}
	}
	return gone
}

// ---- path operations -------------------------------------------------------

// stat turns the lower attributes a of the object at p into the
// presented ones; fs.swap is held. It fails only when p no longer names
// the file of a (a rename since a was taken): a listing then leaves the
// attributes to a lookup.
func (fs *FS) stat(ctx context.Context, p string, a *layer.Attr) error {
	if !a.IsRegular() {
		return nil
	}
	names, l, err := fs.readRecord(ctx, p)
	if err != nil || (names == nil && l == nil) {
		return nil // the lower's bytes; opening says what is wrong
	}
	if l != nil {
		fs.statLink(ctx, p, l, a)
		return nil
	}
	c, err := fs.chainOf(names)
	if err != nil {
		return nil
	}
	if err := c.stat(ctx, p, a); err != nil {
		if err == syscall.ESTALE {
			return err
		}
		fs.log.Warn("chains: cannot size the file", "path", p, "err", err)
	}
	return nil
}

func (fs *FS) Getattr(ctx context.Context, p string) (layer.Attr, error) {
	if fs.reserved(p) {
		return layer.Attr{}, syscall.ENOENT
	}
	fs.swap.RLock()
	defer fs.swap.RUnlock()
	return fs.getattr(ctx, p)
}

// getattr is Getattr; fs.swap is held.
func (fs *FS) getattr(ctx context.Context, p string) (layer.Attr, error) {
	for try := 0; ; try++ {
		a, err := fs.Lower.Getattr(ctx, p)
		if err != nil {
			return a, err
		}
		// ESTALE: the lower changed between the two looks (not through
		// this layer, which holds fs.swap).
		if err = fs.stat(ctx, p, &a); err != syscall.ESTALE || try == 2 {
			return a, err
		}
	}
}

func (fs *FS) ReadDir(ctx context.Context, p string, plus bool) ([]layer.DirEntry, error) {
	d, err := fs.OpenDir(ctx, p)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return layer.ReadDirAll(ctx, d, plus)
}

// OpenDir streams the lower's listing without the layer's own names, with
// the presented sizes (layer.DirOpener).
func (fs *FS) OpenDir(ctx context.Context, p string) (layer.Dir, error) {
	ld, err := layer.OpenDir(ctx, fs.Lower, p)
	if err != nil {
		return nil, err
	}
	return layer.MapDir(ld, func(ctx context.Context, e *layer.DirEntry) (bool, error) {
		q := layer.Join(p, e.Name)
		if fs.reserved(q) {
			return false, nil
		}
		if e.Attr != nil {
			fs.swap.RLock()
			err := fs.stat(ctx, q, e.Attr)
			fs.swap.RUnlock()
			if err != nil {
				e.Attr = nil // renamed since it was listed: the kernel will ask with a lookup
			}
		}
		return true, nil
	}), nil
}

func (fs *FS) Open(ctx context.Context, p string, flags int) (layer.File, error) {
	if fs.reserved(p) {
		return nil, syscall.ENOENT
	}
	fs.swap.RLock()
	defer fs.swap.RUnlock()
	return fs.open(ctx, p, flags)
}

// open is Open; fs.swap is held.
func (fs *FS) open(ctx context.Context, p string, flags int) (layer.File, error) {
	names, l, err := fs.readRecord(ctx, p)
	if err != nil {
		return nil, err
	}
	if l != nil {
		return fs.openLink(ctx, p, l, flags)
	}
	c, err := fs.chainOf(names)
	if err != nil {
		return nil, err
	}
	var f layer.File
	if c == nil {
		f, err = fs.Lower.Open(ctx, p, flags)
	} else {
		f, err = c.ts[0].Open(ctx, p, p, flags)
	}
	if err != nil {
		return nil, err
	}
	return fs.wrap(ctx, f, flags, c), nil
}

func (fs *FS) Create(ctx context.Context, p string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	if fs.reserved(p) {
		return nil, layer.Attr{}, syscall.EPERM
	}
	names := fs.ruleChain(p)
	c, err := fs.chainOf(names)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	fs.swap.RLock()
	defer fs.swap.RUnlock()
	// O_EXCL: an existing file keeps its own chain (or link), and is
	// opened as such below, never written as the rule would store it.
	var f layer.File
	var a layer.Attr
	if c == nil {
		f, a, err = fs.Lower.Create(ctx, p, flags|unix.O_EXCL, mode)
	} else {
		f, a, err = c.ts[0].Create(ctx, p, p, flags|unix.O_EXCL, mode)
	}
	if err == syscall.EEXIST && flags&unix.O_EXCL == 0 {
		f, err := fs.open(ctx, p, flags&^unix.O_CREAT)
		if err != nil {
			return nil, layer.Attr{}, err
		}
		a, err := f.Getattr(ctx)
		if err != nil {
			f.Release(ctx)
			return nil, a, err
		}
		return f, a, nil
	}
	if err != nil {
		return nil, a, err
	}
	if c == nil {
		return fs.wrap(ctx, f, flags, nil), a, nil
	}
	// The record before the application can write a byte: a crash in
	// between leaves an empty unguarded file.
	if err := fs.Meta.Set(ctx, p, metaKey, formatRecord(names)); err != nil {
		f.Release(ctx)
		fs.Lower.Unlink(layer.AsSelf(ctx), p)
		return nil, layer.Attr{}, fmt.Errorf("chains: recording the chain of /%s: %w", p, err)
	}
	return fs.wrap(ctx, f, flags, c), a, nil
}

func (fs *FS) Setattr(ctx context.Context, p string, in *layer.SetAttr) (layer.Attr, error) {
	fs.swap.RLock()
	defer fs.swap.RUnlock()
	if in.Valid&(layer.SetSize|setTimes) != 0 {
		a, err := fs.Lower.Getattr(ctx, p)
		if err != nil {
			return a, err
		}
		if a.IsRegular() {
			names, l, err := fs.readRecord(ctx, p)
			if err != nil {
				return layer.Attr{}, err
			}
			if l != nil && in.Valid&layer.SetSize != 0 {
				return layer.Attr{}, syscall.EROFS
			}
			c, err := fs.chainOf(names)
			if err != nil {
				return layer.Attr{}, err
			}
			if c != nil {
				if in.Valid&layer.SetSize != 0 {
					if err := c.ts[0].Truncate(ctx, p, p, int64(in.Size)); err != nil {
						return layer.Attr{}, err
					}
					rest := *in
					rest.Valid &^= layer.SetSize
					if rest.Valid == 0 {
						return fs.getattr(ctx, p)
					}
					in = &rest
				}
				if in.Valid&setTimes != 0 {
					if err := c.settle(ctx, a.ID()); err != nil {
						return layer.Attr{}, err
					}
				}
			}
		}
	}
	a, err := fs.Lower.Setattr(ctx, p, in)
	if err != nil {
		return a, err
	}
	fs.stat(ctx, p, &a)
	return a, nil
}

const setTimes = layer.SetAtime | layer.SetMtime | layer.SetAtimeNow | layer.SetMtimeNow

func (fs *FS) Mkdir(ctx context.Context, p string, mode uint32) (layer.Attr, error) {
	if fs.reserved(p) {
		return layer.Attr{}, syscall.EPERM
	}
	return fs.Lower.Mkdir(ctx, p, mode)
}

func (fs *FS) Mknod(ctx context.Context, p string, mode uint32, rdev uint64) (layer.Attr, error) {
	if fs.reserved(p) {
		return layer.Attr{}, syscall.EPERM
	}
	if t := mode & unix.S_IFMT; (t == unix.S_IFREG || t == 0) && fs.ruleChain(p) != nil {
		// A regular file gets its rule's chain however it is made.
		f, a, err := fs.Create(ctx, p, unix.O_WRONLY|unix.O_EXCL, mode&^unix.S_IFMT)
		if err != nil {
			return a, err
		}
		return a, f.Release(ctx)
	}
	return fs.Lower.Mknod(ctx, p, mode, rdev)
}

func (fs *FS) Symlink(ctx context.Context, target, p string) (layer.Attr, error) {
	if fs.reserved(p) {
		return layer.Attr{}, syscall.EPERM
	}
	return fs.Lower.Symlink(ctx, target, p)
}

func (fs *FS) Link(ctx context.Context, oldpath, newpath string) (layer.Attr, error) {
	if fs.reserved(oldpath) || fs.reserved(newpath) {
		return layer.Attr{}, syscall.EPERM
	}
	fs.swap.RLock()
	defer fs.swap.RUnlock()
	a, err := fs.Lower.Link(ctx, oldpath, newpath)
	if err != nil {
		return a, err
	}
	fs.stat(ctx, newpath, &a)
	return a, nil
}

func (fs *FS) Unlink(ctx context.Context, p string) error {
	if fs.reserved(p) {
		return syscall.ENOENT
	}
	fs.swap.Lock()
	a, aerr := fs.Lower.Getattr(ctx, p)
	err := fs.Lower.Unlink(ctx, p)
	fs.swap.Unlock()
	if err != nil {
		return err
	}
	if aerr == nil && a.IsRegular() && a.Nlink <= 1 {
		fs.forget(ctx, a.ID())
	}
	return nil
}

func (fs *FS) Rmdir(ctx context.Context, p string) error {
	if fs.reserved(p) {
		return syscall.ENOENT
	}
	return fs.Lower.Rmdir(ctx, p)
}

func (fs *FS) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	if fs.reserved(oldpath) || fs.reserved(newpath) {
		return syscall.EPERM
	}
	fs.swap.Lock()
	a, aerr := fs.Lower.Getattr(ctx, newpath)
	err := fs.Lower.Rename(ctx, oldpath, newpath, flags)
	fs.swap.Unlock()
	if err != nil {
		return err
	}
	if aerr == nil && a.IsRegular() && a.Nlink <= 1 && flags&layer.RenameExchange == 0 {
		fs.forget(ctx, a.ID())
	}
	return nil
}

// SetFlags refuses append-only and immutable on guarded files, as
// layer.Transformed does (a transform rewrites stored files in place).
func (fs *FS) SetFlags(ctx context.Context, p string, flags uint32) error {
	if fs.reserved(p) {
		return syscall.ENOENT
	}
	// Under the lock: the chain read and the flags set are of one file
	// (a conversion could otherwise put a guarded file under the name in
	// between, and make it append-only or immutable).
	fs.swap.RLock()
	defer fs.swap.RUnlock()
	if c, err := fs.chainAt(ctx, p); err == nil && c != nil {
		return layer.SetFlagsExcept(ctx, fs.Lower, p, flags, layer.FlagAppend|layer.FlagImmutable)
	}
	return fs.Lower.SetFlags(ctx, p, flags)
}

// Setxattr of a file capability settles a guarded file's open files first
// (see layer.Transformed.Setxattr); user.cairn.chain converts the file.
func (fs *FS) Setxattr(ctx context.Context, p, name string, value []byte, flags int) error {
	if name == LinkXattr {
		l, err := parseLink(string(value))
		if err != nil {
			fs.log.Warn("chains: refused link", "path", p, "value", string(value[:min(len(value), 256)]), "err", err)
			var long *errTargetTooLong
			if errors.As(err, &long) {
				return syscall.ENAMETOOLONG
			}
			return syscall.EINVAL
		}
		return fs.setLink(ctx, p, l)
	}
	if name == XattrName {
		names, err := parseNames(string(value))
		if err == nil {
			err = checkNames(names, true)
		}
		if err != nil {
			fs.log.Warn("chains: refused chain", "path", p, "value", string(value), "err", err)
			return syscall.EINVAL
		}
		cur, rerr := fs.record(ctx, p)
		if flags&layer.XattrCreate != 0 && rerr == nil && cur != nil {
			return syscall.EEXIST
		}
		if flags&layer.XattrReplace != 0 && rerr == nil && cur == nil {
			return layer.ENOATTR
		}
		return fs.convert(ctx, p, names)
	}
	if name == "security.capability" {
		fs.swap.RLock()
		defer fs.swap.RUnlock()
		if a, err := fs.Lower.Getattr(ctx, p); err == nil && a.IsRegular() {
			if c, err := fs.chainAt(ctx, p); err == nil && c != nil {
				if err := c.settle(ctx, a.ID()); err != nil {
					return err
				}
			}
		}
	}
	return fs.MetaBase.Setxattr(ctx, p, name, value, flags)
}

func (fs *FS) Getxattr(ctx context.Context, p, name string, dest []byte) (int, error) {
	if name != XattrName && name != LinkXattr {
		return fs.MetaBase.Getxattr(ctx, p, name, dest)
	}
	names, l, err := fs.readRecord(ctx, p)
	if err != nil {
		return 0, err
	}
	v := strings.Join(names, ",")
	if name == LinkXattr {
		v = ""
		if l != nil {
			v = l.String()
		}
	}
	if v == "" {
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

func (fs *FS) Removexattr(ctx context.Context, p, name string) error {
	if name == LinkXattr {
		return fs.setLink(ctx, p, nil)
	}
	if name != XattrName {
		return fs.MetaBase.Removexattr(ctx, p, name)
	}
	names, err := fs.record(ctx, p)
	if err != nil {
		return err
	}
	if names == nil {
		return layer.ENOATTR
	}
	return fs.convert(ctx, p, nil)
}

// ---- open files ------------------------------------------------------------

// file is an open file of the layer that may write: conversions wait for
// it (FS.writers). It forwards everything, capabilities included, so an
// unguarded file keeps passthrough.
type file struct {
	layer.BaseFile
	fs   *FS
	id   layer.ID
	c    *chain // nil: unguarded
	once sync.Once
}

// wrap counts f, a file of the chain c (nil: unguarded), if it is open
// for writing.
func (fs *FS) wrap(ctx context.Context, f layer.File, flags int, c *chain) layer.File {
	if flags&unix.O_ACCMODE == unix.O_RDONLY {
		return f
	}
	a, err := f.Getattr(ctx)
	if err != nil {
		return f
	}
	id := a.ID()
	fs.mu.Lock()
	fs.writers[id]++
	fs.mu.Unlock()
	return &file{BaseFile: layer.BaseFile{Lower: f}, fs: fs, id: id, c: c}
}

// Release of a file open for writing under a chain of several links
// settles the links below the top one: the top link's release writes its
// header into the link below, which would otherwise keep it in memory
// until it lets go of the file (the next close, a read's; an unmount) and
// move the file's mtime then.
func (f *file) Release(ctx context.Context) error {
	err := f.BaseFile.Release(ctx)
	if err == nil && f.c != nil && len(f.c.ts) > 1 {
		// By identity: the file may have been renamed since it was
		// opened, and its path may name a file of another chain.
		err = f.c.settle(ctx, f.id)
	}
	f.once.Do(func() {
		f.fs.mu.Lock()
		if f.fs.writers[f.id]--; f.fs.writers[f.id] <= 0 {
			delete(f.fs.writers, f.id)
		}
		f.fs.wcond.Broadcast()
		f.fs.mu.Unlock()
	})
	return err
}

// ---- conversion --------------------------------------------------------------

// writerWait is how long a conversion waits for the file's writers to
// close it (a close(2) through FUSE releases the file asynchronously).
const writerWait = 2 * time.Second

// waitWriters waits until no handle has id open for writing: false after
// writerWait.
func (fs *FS) waitWriters(id layer.ID) bool {
	deadline := time.Now().Add(writerWait)
	t := time.AfterFunc(writerWait, func() {
		fs.mu.Lock()
		fs.wcond.Broadcast()
		fs.mu.Unlock()
	})
	defer t.Stop()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for fs.writers[id] > 0 {
		if !time.Now().Before(deadline) {
			return false
		}
		fs.wcond.Wait()
	}
	return true
}

// convert rewrites the regular file at p with the chain names (nil:
// unguarded): the new form is written in TmpDir, with the file's owner,
// mode, times and xattrs, made durable, and renamed over the old one, so
// that a crash leaves the old file or the new one.
func (fs *FS) convert(ctx context.Context, p string, names []string) error {
	a, err := fs.Lower.Getattr(ctx, p)
	if err != nil {
		return err
	}
	if !a.IsRegular() {
		return syscall.EPERM // as ext4 for user.* on other objects
	}
	// Only someone who may write the file changes its chain.
	if wf, err := fs.Lower.Open(ctx, p, unix.O_WRONLY|unix.O_NOFOLLOW); err != nil {
		return err
	} else {
		wf.Release(ctx)
	}
	nc, err := fs.chainOf(names)
	if err != nil {
		return err
	}
	fs.conv.Lock()
	defer fs.conv.Unlock()
	if a, err = fs.Lower.Getattr(ctx, p); err != nil {
		return err
	}
	if a.Nlink > 1 {
		fs.log.Warn("chains: cannot convert a file with hard links", "path", p)
		return syscall.EMLINK
	}
	oldNames, l, err := fs.readRecord(ctx, p)
	if err != nil {
		return err
	}
	if l != nil {
		return syscall.EPERM // a link has no chain; remove the link first
	}
	if strings.Join(oldNames, ",") == strings.Join(names, ",") {
		return nil
	}
	oc, err := fs.chainOf(oldNames)
	if err != nil {
		return err
	}
	if !fs.waitWriters(a.ID()) {
		fs.log.Warn("chains: file still open for writing, not converted", "path", p)
		return syscall.EBUSY
	}
	self := layer.AsSelf(ctx)
	// a again, now that the writers are gone: what the copy starts from.
	src, a, err := fs.openSource(self, p, a.ID(), oldNames, oc)
	if err != nil {
		return err
	}
	defer src.Release(self)
	if _, err := fs.Lower.Mkdir(self, TmpDir, 0o700); err != nil && err != syscall.EEXIST {
		return err
	}
	tmp := layer.Join(TmpDir, fmt.Sprintf("%d.%d", a.Ino, a.Gen))
	fs.Lower.Unlink(self, tmp)
	if err := fs.writeConverted(self, p, tmp, src, nc, &a, names); err != nil {
		fs.Lower.Unlink(self, tmp)
		return err
	}
	// The copy is the file only if nothing changed it meanwhile (a write,
	// an xattr or a mode: its ctime) and no one has it open to write
	// (opens wait for the lock).
	fs.swap.Lock()
	fs.mu.Lock()
	writing := fs.writers[a.ID()] > 0
	fs.mu.Unlock()
	if b, err := fs.Lower.Getattr(self, p); err != nil || b.ID() != a.ID() || b.Ctime != a.Ctime || writing {
		fs.swap.Unlock()
		fs.Lower.Unlink(self, tmp)
		fs.log.Warn("chains: file replaced, changed or opened for writing during its conversion, not converted", "path", p)
		return syscall.EBUSY
	}
	err = fs.Lower.Rename(self, tmp, p, 0)
	fs.swap.Unlock()
	if err != nil {
		fs.Lower.Unlink(self, tmp)
		return err
	}
	dir, _ := layer.Split(p)
	if err := fs.Lower.SyncDir(self, dir); err != nil {
		fs.log.Warn("chains: fsync of the directory after a conversion", "path", p, "err", err)
	}
	fs.forget(ctx, a.ID())
	fs.log.Info("chains: converted", "path", p, "from", strings.Join(oldNames, ","), "to", strings.Join(names, ","))
	return nil
}

// openSource opens the file id at p, read through oc, its chain of
// names, for a conversion, and gives its lower attributes: EBUSY if p
// names another file now, or one with another chain (renamed or replaced
// since the conversion looked at it).
func (fs *FS) openSource(ctx context.Context, p string, id layer.ID, names []string, oc *chain) (layer.File, layer.Attr, error) {
	fs.swap.RLock()
	defer fs.swap.RUnlock()
	a, err := fs.Lower.Getattr(ctx, p)
	if err != nil {
		return nil, a, err
	}
	now, l, err := fs.readRecord(ctx, p)
	if err != nil {
		return nil, a, err
	}
	if a.ID() != id || l != nil || strings.Join(now, ",") != strings.Join(names, ",") {
		fs.log.Warn("chains: file replaced during its conversion, not converted", "path", p)
		return nil, a, syscall.EBUSY
	}
	var f layer.File
	if oc == nil {
		f, err = fs.Lower.Open(ctx, p, unix.O_RDONLY|unix.O_NOFOLLOW)
	} else {
		f, err = oc.ts[0].Open(ctx, p, p, unix.O_RDONLY)
	}
	return f, a, err
}

// writeConverted writes tmp: the bytes of src (p's file, read through its
// chain) stored through nc, with p's attributes and xattrs and the record
// of names, durable.
func (fs *FS) writeConverted(ctx context.Context, p, tmp string, src layer.File, nc *chain, a *layer.Attr, names []string) error {
	var dst layer.File
	var err error
	if nc == nil {
		dst, _, err = fs.Lower.Create(ctx, tmp, unix.O_RDWR|unix.O_EXCL, 0o600)
	} else {
		dst, _, err = nc.ts[0].Create(ctx, tmp, p, unix.O_RDWR|unix.O_EXCL, 0o600)
	}
	if err != nil {
		return err
	}
	if names != nil {
		if err := fs.Meta.Set(ctx, tmp, metaKey, formatRecord(names)); err != nil {
			dst.Release(ctx)
			return err
		}
	}
	buf := make([]byte, 1<<20)
	var off int64
	for {
		n, rerr := src.ReadAt(ctx, buf, off)
		if n > 0 {
			if _, err := dst.WriteAt(ctx, buf[:n], off); err != nil {
				dst.Release(ctx)
				return err
			}
			off += int64(n)
		}
		if rerr == io.EOF || (rerr == nil && n == 0) {
			break
		}
		if rerr != nil {
			dst.Release(ctx)
			return rerr
		}
	}
	if err := dst.Fsync(ctx, false); err != nil {
		dst.Release(ctx)
		return err
	}
	ta, err := dst.Getattr(ctx)
	if err != nil {
		dst.Release(ctx)
		return err
	}
	if err := dst.Release(ctx); err != nil {
		return err
	}
	// What the release left in the links below the top one (its header)
	// is written now, before the times are set.
	if nc != nil {
		if err := nc.settle(ctx, ta.ID()); err != nil {
			return err
		}
	}
	// Other xattrs of the file (ACLs, user attributes, a capability), its
	// owner, mode and times; durable (the transforms' own writes at release
	// included).
	return layer.CopyMeta(ctx, fs.Lower, p, tmp, a, fs.Meta.Owns)
}
