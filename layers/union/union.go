// Package union is Unionfs revived: one merged view of several branches,
// the first branch that has a name winning, with overlayfs's semantics for
// changes to what lives on a read-only branch (copy-up, whiteouts, opaque
// directories) in overlayfs's own on-disk format, so that the kernel's
// overlayfs reads an upper branch written by cairn, and cairn one written by
// the kernel (docs/union.md).
//
// Branches are layer.FS stacks with a mode (layer/fanout: RW, RO, NC). A
// path resolves branch by branch, in order: a whiteout (a character device
// 0/0) ends the search with "no such name"; a file ends it with that file;
// a directory is merged with the directories of the same name on the
// branches after it, down to an opaque one (trusted.overlay.opaque = "y")
// or to a branch where the name is not a directory.
package union

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
)

// Overlayfs's names.
const (
	xattrOpaque = "trusted.overlay.opaque"
	xattrPrefix = "trusted.overlay."
	// tmpPrefix names the union's temporary entries (a copy-up under
	// way, a whiteout about to replace a directory): left out of
	// listings, and removed by the operation that made them.
	tmpPrefix = ".cairn-union-tmp."
	// indexDir, at the root of a RW branch, holds a link to the copy of
	// each file of several links copied up from a read-only branch, by
	// the original's identity: its other names are linked to the copy
	// when they are looked up, so all stay one file (overlayfs's index).
	indexDir = ".cairn-union-index"
	// lockFile, in the index's directory (hidden with it: no name of the
	// union reaches into it), is the file whose lock the claim takes on
	// each RW branch (check.go).
	lockFile = indexDir + "/lock"
)

// FS is a union layer.
type FS struct {
	b      []fanout.Branch
	move   bool          // files that fill their branch move (movable)
	meta   []*layer.Meta // the union's side data on each branch's objects (origin)
	policy fanout.Policy
	log    *slog.Logger

	// dirs caches the resolution of directories: path -> the branches
	// that contribute to it, first first. Every change the union makes to
	// a directory's resolution drops the entries at and below it.
	mu   sync.Mutex
	dirs map[string][]int
	tmpN uint64
	// ownTmp begins this daemon's temporary names; others' are left
	// by a crash, and removed when their directory is listed.
	ownTmp string

	// known caches the resolutions of names, present and absent (see
	// knownOf): valid while gen is unchanged, and neither used nor kept
	// while the union is changing its branches (busy).
	kmu   sync.Mutex
	gen   uint64
	busy  int
	known map[string]knownName
	// shared: keep no resolution (Options.Shared).
	shared bool
	// imu orders the changes of the index's counts (index.go).
	imu sync.Mutex
	// checking: an fsck that may change nothing lists the tree (ReadDir
	// then leaves a crashed daemon's temporary entries alone).
	checking bool
	unlock   []func() // the claim's locks (Claim)
}

const (
	maxDirs  = 1 << 14
	maxKnown = 1 << 16
)

// Options configure a union.
type Options struct {
	// Policy chooses the branch of new objects among the RW ones
	// (default ff).
	Policy fanout.Policy
	// MoveOnENOSPC moves a file that fills its branch to another (see
	// movable).
	MoveOnENOSPC bool
	// Shared says that others change the branches too (mergerfs's use:
	// disks also written outside the union): the union then keeps no
	// resolution of names or directories, and is not layer.Exclusive, so
	// the kernel keeps what it learns for its usual timeouts only.
	Shared bool
}

// New builds a union of branches.
func New(branches []fanout.Branch, o Options) (*FS, error) {
	if len(branches) < 2 {
		return nil, errors.New("union: give at least two branches")
	}
	policy := o.Policy
	if policy == nil {
		policy = fanout.Policies["ff"]
	}
	// Two branches that are one directory would copy a file up onto
	// itself.
	seen := map[layer.ID]int{}
	for i, b := range branches {
		a, err := b.FS.Getattr(layer.AsSelf(context.Background()), "")
		if err != nil {
			return nil, fmt.Errorf("union: branch %d: %w", i+1, err)
		}
		if j, dup := seen[a.ID()]; dup {
			return nil, fmt.Errorf("union: branches %d and %d are the same directory", j+1, i+1)
		}
		seen[a.ID()] = i
	}
	rw := 0
	for _, b := range branches {
		if b.Mode == fanout.RW {
			rw++
		}
	}
	u := &FS{b: branches, policy: policy, log: slog.Default(), dirs: map[string][]int{}, known: map[string]knownName{}, move: o.MoveOnENOSPC && rw > 1,
		shared: o.Shared, ownTmp: fmt.Sprintf("%s%d.", tmpPrefix, unix.Getpid())}
	for _, b := range branches {
		u.meta = append(u.meta, layer.NewMeta(b.FS, "union"))
	}
	return u, nil
}

var _ layer.FS = (*FS)(nil)

func (u *FS) Lowers() []layer.FS {
	l := make([]layer.FS, len(u.b))
	for i, b := range u.b {
		l[i] = b.FS
	}
	return l
}

func (u *FS) Changes() layer.Changes { return layer.ChangesPlacement }

// Exclusive: the union sees its branches' changes only when it makes them
// (what it knows of names and directories is kept until then), as
// overlayfs does; the kernel may keep what it learnt as long. A shared
// union (Options.Shared) keeps nothing and is not exclusive.
func (u *FS) Exclusive() bool { return !u.shared }

func (u *FS) Close() error {
	for _, r := range u.unlock {
		r()
	}
	u.unlock = nil
	return nil
}

// FSCaps: what every branch can do, without RENAME_WHITEOUT (a whiteout
// is the union's own, as in overlayfs). The writeback cache
// (layer.FSWriteback) is kept: the kernel writes pages back, and reads
// the rest of partly written pages, through files open for writing, which
// are all copied up at their open; the files of the branches below are
// never written, and a copy-up copies a file no one writes yet.
func (u *FS) FSCaps() layer.FSCaps {
	c := layer.FSCaps(^uint16(0))
	for _, b := range u.b {
		c &= layer.FSCapsOf(b.FS)
	}
	return c &^ layer.FSRenameWhiteout
}

// ---- resolution ------------------------------------------------------------

// obj is a resolved path: the branches it is on, first first (one for
// anything but a directory), and the first one's attributes.
type obj struct {
	br  []int
	a   layer.Attr
	id  *shown   // a copy's recorded origin, shown as its identity
	lid layer.ID // the object's identity on its first branch (not shown)
}

// shown is the identity a copy shows: its original's. Indexed, its link
// count is the union's, as overlayfs counts it: the copy's names (its
// links but the index's) and the names of the original not yet linked to
// it (left: L - C, index.go); an entry made before the counting shows the
// copy's names only.
type shown struct {
	id      layer.ID
	indexed bool
	counted bool
	left    uint32
}

func (s *shown) apply(a *layer.Attr) {
	if s == nil {
		return
	}
	setID(a, s.id)
	if s.indexed && a.Nlink > 0 {
		a.Nlink = a.Nlink - 1
		if s.counted {
			a.Nlink += s.left
		}
		if a.Nlink == 0 && !s.counted {
			a.Nlink = 1
		}
	}
}

func (o *obj) top() int { return o.br[0] }

func isWhiteout(a *layer.Attr) bool { return a.Mode&unix.S_IFMT == unix.S_IFCHR && a.Rdev == 0 }

func isTmp(name string) bool { return strings.HasPrefix(name, tmpPrefix) }

func notFound(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR)
}

func (u *FS) opaque(ctx context.Context, i int, path string) bool {
	var b [1]byte
	n, err := u.b[i].FS.Getxattr(layer.AsSelf(ctx), path, xattrOpaque, b[:])
	return err == nil && n == 1 && b[0] == 'y'
}

// dirBranches are the branches that contribute to directory path.
func (u *FS) dirBranches(ctx context.Context, path string) ([]int, error) {
	u.mu.Lock()
	br, ok := u.dirs[path]
	u.mu.Unlock()
	if ok {
		return br, nil
	}
	o, err := u.resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	if !o.a.IsDir() {
		return nil, syscall.ENOTDIR
	}
	if u.shared {
		return o.br, nil
	}
	u.mu.Lock()
	if len(u.dirs) >= maxDirs {
		clear(u.dirs)
	}
	u.dirs[path] = o.br
	u.mu.Unlock()
	return o.br, nil
}

// forget drops the cached resolutions of path and of everything below it.
func (u *FS) forget(path string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for p := range u.dirs {
		if p == path || path == "" || strings.HasPrefix(p, path+"/") {
			delete(u.dirs, p)
		}
	}
}

// resolve finds path in the branches.
func (u *FS) resolve(ctx context.Context, path string) (*obj, error) {
	o, _, err := u.lookup(ctx, path)
	return o, err
}

// knownName is what a resolution found: the branches of the name (nil:
// absent), the whiteout that ended the search of an absent name (-1:
// none), and a copy's origin.
type knownName struct {
	gen uint64
	br  []int
	wh  int
	id  *shown
	lid layer.ID // the identity on br[0] (obj.lid)
}

// Resolutions are cached until the union changes anything: every
// operation that changes a branch (a create, a removal, a rename, a
// copy-up, a link made at lookup, a file moved off a full branch) runs
// between change() and its end, which forgets everything known and keeps
// lookups made meanwhile from being remembered. A name looked up twice with
// no change between costs its branches nothing the second time (its
// attributes are read from the branch that shows it); a name absent from
// every branch costs one lookup per branch, once: creates, which the kernel
// precedes with a lookup of the name, find it known absent. Changes made to
// the branches behind the union's back are, as with overlayfs, not seen
// until the union changes something itself.

// change begins a change of the branches; the function it returns ends it.
func (u *FS) change() func() {
	u.kmu.Lock()
	u.busy++
	u.gen++
	u.kmu.Unlock()
	return func() {
		u.kmu.Lock()
		u.busy--
		u.gen++
		u.kmu.Unlock()
	}
}

// changeAt is change, with what was known of path just before it began.
// The function that ends it is given what path is after the change (nil:
// not known), which is kept if no other change ran meanwhile: a create
// knows where it put the name, so the lookups and the file handle the
// kernel asks of a name it made need not search for it.
func (u *FS) changeAt(path string) (knownName, bool, func(after *knownName)) {
	u.kmu.Lock()
	k, ok := u.knownNow(path)
	u.busy++
	u.gen++
	g := u.gen
	u.kmu.Unlock()
	return k, ok, func(after *knownName) {
		u.kmu.Lock()
		u.busy--
		u.gen++
		if after != nil && u.gen == g+1 && u.busy == 0 && !u.shared {
			if len(u.known) >= maxKnown {
				clear(u.known)
			}
			after.gen = u.gen
			u.known[path] = *after
		}
		u.kmu.Unlock()
	}
}

// made is what is known of a name just made on branch i, with identity
// lid there.
func made(i int, lid layer.ID) *knownName { return &knownName{br: []int{i}, wh: -1, lid: lid} }

// knownNow is what is known of path now (kmu held).
func (u *FS) knownNow(path string) (knownName, bool) {
	if u.busy > 0 || u.shared {
		return knownName{}, false
	}
	k, ok := u.known[path]
	return k, ok && k.gen == u.gen
}

// lookup is resolve that also says, when path is not found, which branch
// holds the whiteout that ended the search (-1: none).
func (u *FS) lookup(ctx context.Context, path string) (*obj, int, error) {
	if isTmp(lastName(path)) || path == indexDir {
		return nil, -1, syscall.ENOENT
	}
	u.kmu.Lock()
	k, ok := u.knownNow(path)
	gen, quiet := u.gen, u.busy == 0
	u.kmu.Unlock()
	if ok {
		if k.br == nil {
			return nil, k.wh, syscall.ENOENT
		}
		if a, err := u.b[k.br[0]].FS.Getattr(ctx, path); err == nil {
			o := &obj{br: k.br, a: a, id: k.id, lid: a.ID()}
			u.shows(o)
			o.id.apply(&o.a)
			return o, -1, nil
		}
	}
	o, wh, err := u.search(ctx, path)
	if quiet && !u.shared && (err == nil || errors.Is(err, syscall.ENOENT)) {
		u.kmu.Lock()
		if u.gen == gen && u.busy == 0 {
			if len(u.known) >= maxKnown {
				clear(u.known)
			}
			k := knownName{gen: gen, wh: wh}
			if o != nil {
				k.br, k.id, k.lid = o.br, o.id, o.lid
			}
			u.known[path] = k
		}
		u.kmu.Unlock()
	}
	return o, wh, err
}

// branchOf is the branch that shows path: what is known, without asking
// it for the attributes (getxattr, listxattr, readlink, inode flags).
func (u *FS) branchOf(ctx context.Context, path string) (int, error) {
	u.kmu.Lock()
	k, ok := u.knownNow(path)
	u.kmu.Unlock()
	if ok && k.br != nil {
		return k.br[0], nil
	}
	o, err := u.resolve(ctx, path)
	if err != nil {
		return -1, err
	}
	return o.top(), nil
}

// shows gives o's attributes what the union shows of them (before a
// copy's origin): a merged directory's link count, the branch's tag.
func (u *FS) shows(o *obj) {
	if len(o.br) > 1 {
		o.a.Nlink = 1 // merged: unknown, as overlayfs says (find knows)
	}
	layer.TagBranch(&o.a, o.top(), len(u.b))
}

// search looks path up in the branches (lookup, without what is known).
func (u *FS) search(ctx context.Context, path string) (*obj, int, error) {
	var cand []int
	if path == "" {
		for i := range u.b {
			cand = append(cand, i)
		}
	} else {
		dir, _ := layer.Split(path)
		var err error
		if cand, err = u.dirBranches(ctx, dir); err != nil {
			return nil, -1, err
		}
	}
	var o *obj
	wh := -1
	for _, i := range cand {
		a, err := u.b[i].FS.Getattr(ctx, path)
		if notFound(err) {
			continue
		}
		if err != nil {
			if o != nil {
				break // a lower part that cannot be read is left out
			}
			return nil, -1, u.branchErr(i, path, err)
		}
		if isWhiteout(&a) {
			if o == nil {
				wh = i
			}
			break
		}
		if o != nil && !a.IsDir() {
			break
		}
		if o == nil {
			o = &obj{a: a, lid: a.ID()}
		}
		o.br = append(o.br, i)
		if !a.IsDir() || u.opaque(ctx, i, path) {
			break
		}
	}
	if o == nil {
		return nil, wh, syscall.ENOENT
	}
	u.shows(o)
	if o.a.IsRegular() && o.a.Nlink > 1 && !u.writable(o.top()) {
		// Another name of this file may have been copied up: then this
		// one is linked to the copy.
		if linked, err := u.linkUp(ctx, path, o); err != nil || linked {
			if err != nil {
				return nil, -1, err
			}
			return u.search(ctx, path)
		}
	}
	o.id = u.origin(ctx, o.top(), path, &o.a)
	o.id.apply(&o.a)
	return o, -1, nil
}

func indexName(id layer.ID) string { return indexDir + "/" + hex.EncodeToString(encodeID(id)) }

// linkUp links path, a name of a file of several links on a read-only
// branch, to the copy another of its names made, if there is one.
func (u *FS) linkUp(ctx context.Context, path string, o *obj) (bool, error) {
	w, err := u.upper(o.top())
	if err != nil {
		return false, nil
	}
	self := layer.AsSelf(ctx)
	idx := indexName(o.a.ID())
	if k, err := u.indexCounts(ctx, w, idx); err != nil || k.kind != idxCopy {
		return false, nil // no copy (none, or a placeholder)
	}
	defer u.change()()
	dir, _ := layer.Split(path)
	if err := u.ensureDir(ctx, w, dir); err != nil {
		return false, err
	}
	u.markImpure(ctx, w, dir)
	if _, err := u.b[w].FS.Link(self, idx, path); err != nil {
		if errors.Is(err, syscall.EEXIST) {
			return true, nil // linked meanwhile, and counted
		}
		return false, err
	}
	u.ended(ctx, w, o.a.ID(), 0)
	return true, nil
}

// A copied-up file keeps the identity (inode number) of the file it was
// copied from, as overlayfs's copies do: the copy records it as side data
// ("origin": the ID the union gave the original, 32 bytes, and for a copy
// in the index (a file of several links, whose other names come to the
// copy when they are looked up) its kind and counts: see index.go).

func encodeID(id layer.ID) []byte {
	return binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(
		binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, id.Dev), id.Branch), id.Ino), id.Gen)
}

// origin is the recorded identity of an object on writable branch i (nil:
// none): a copy's, or a directory's copied up from a read-only branch.
func (u *FS) origin(ctx context.Context, i int, path string, a *layer.Attr) *shown {
	if !u.writable(i) {
		return nil
	}
	v, err := u.meta[i].Get(ctx, path, "origin")
	if err != nil || len(v) < 32 {
		return nil
	}
	be := binary.BigEndian
	s := &shown{id: layer.ID{Dev: be.Uint64(v), Branch: be.Uint64(v[8:]), Ino: be.Uint64(v[16:]), Gen: be.Uint64(v[24:])},
		indexed: len(v) > 32 && v[32] == idxCopy}
	if s.indexed && len(v) >= 41 {
		if l, c := be.Uint32(v[33:]), be.Uint32(v[37:]); l > c {
			s.left = l - c
		}
		s.counted = true
	}
	return s
}

func setID(a *layer.Attr, id layer.ID) {
	a.Dev, a.Branch, a.Ino, a.Gen = id.Dev, id.Branch, id.Ino, id.Gen
}

// branchErr logs an error of branch i that says the branch itself is in
// trouble (gone, read-only, failing), naming the branch (1 is the first).
func (u *FS) branchErr(i int, path string, err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		errno = syscall.EIO
	}
	switch errno {
	case syscall.EIO, syscall.EROFS, syscall.ENOTCONN, syscall.ESTALE, syscall.ENODEV, syscall.ENOSPC, syscall.EDQUOT:
		u.log.Error("union: a branch fails", "branch", i+1, "path", path, "err", err)
	}
	return err
}

func lastName(path string) string {
	_, n := layer.Split(path)
	return n
}

// below reports whether name exists (not as a whiteout) on one of the
// branches of its directory after branch t, before a whiteout: what a
// removal at t would uncover.
func (u *FS) below(ctx context.Context, path string, t int) (bool, error) {
	dir, _ := layer.Split(path)
	br, err := u.dirBranches(ctx, dir)
	if err != nil {
		return false, err
	}
	for _, i := range br {
		if i <= t {
			continue
		}
		a, err := u.b[i].FS.Getattr(ctx, path)
		if notFound(err) {
			continue
		}
		if err != nil {
			return false, err
		}
		return !isWhiteout(&a), nil
	}
	return false, nil
}

func (u *FS) writable(i int) bool { return u.b[i].Mode != fanout.RO }

// upper is the branch where an object now on branch t is changed: t if it
// may be written, else the first RW branch before it (copy-up).
func (u *FS) upper(t int) (int, error) {
	if u.writable(t) {
		return t, nil
	}
	for i := 0; i < t; i++ {
		if u.b[i].Mode == fanout.RW {
			return i, nil
		}
	}
	return -1, syscall.EROFS
}

// ---- reading -----------------------------------------------------------------

func (u *FS) Getattr(ctx context.Context, path string) (layer.Attr, error) {
	o, err := u.resolve(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	return o.a, nil
}

func (u *FS) Readlink(ctx context.Context, path string) (string, error) {
	i, err := u.branchOf(ctx, path)
	if err != nil {
		return "", err
	}
	return u.b[i].FS.Readlink(ctx, path)
}

// own reports whether an xattr name is the union's (overlayfs's marks,
// the side data): not shown, listed, set or removed through the union.
func (u *FS) own(name string) bool {
	return strings.HasPrefix(name, xattrPrefix) || u.meta[0].Owns(name)
}

func (u *FS) Getxattr(ctx context.Context, path, name string, dest []byte) (int, error) {
	if u.own(name) {
		return 0, layer.ENOATTR
	}
	i, err := u.branchOf(ctx, path)
	if err != nil {
		return 0, err
	}
	return u.b[i].FS.Getxattr(ctx, path, name, dest)
}

// Listxattr leaves overlayfs's attributes out.
func (u *FS) Listxattr(ctx context.Context, path string, dest []byte) (int, error) {
	i, err := u.branchOf(ctx, path)
	if err != nil {
		return 0, err
	}
	l := u.b[i].FS
	n, err := l.Listxattr(ctx, path, nil)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, n)
	if n, err = l.Listxattr(ctx, path, buf); err != nil {
		return 0, err
	}
	var out []byte
	for _, x := range strings.Split(string(buf[:n]), "\x00") {
		if x != "" && !u.own(x) {
			out = append(append(out, x...), 0)
		}
	}
	if len(dest) == 0 {
		return len(out), nil
	}
	if len(out) > len(dest) {
		return 0, syscall.ERANGE
	}
	return copy(dest, out), nil
}

// Statfs is the writable branches' (summed), or, with none, every
// branch's.
func (u *FS) Statfs(ctx context.Context, path string) (layer.Statfs, error) {
	var fss []layer.FS
	for _, b := range u.b {
		if b.Mode == fanout.RW {
			fss = append(fss, b.FS)
		}
	}
	if len(fss) == 0 {
		fss = u.Lowers()
	}
	return fanout.Statfs(ctx, fss)
}

func (u *FS) SyncDir(ctx context.Context, path string) error {
	br, err := u.dirBranches(ctx, path)
	if err != nil {
		return err
	}
	for _, i := range br {
		if u.writable(i) {
			if err := u.b[i].FS.SyncDir(ctx, path); err != nil {
				return err
			}
		}
	}
	return nil
}

// ---- open files ----------------------------------------------------------------

// file wraps an open file of branch i opened at path with flags.
func (u *FS) file(i int, f layer.File, id *shown, path string, flags int) layer.File {
	if u.move && u.b[i].Mode == fanout.RW && writes(flags) {
		return &movable{u: u, path: path, flags: flags, lower: f, i: i, id: id}
	}
	return u.branchFile(i, f, id)
}

// branchFile is an open file of branch i, tagged with it, showing id if
// set.
func (u *FS) branchFile(i int, f layer.File, id *shown) *fanout.File {
	bf := &fanout.File{BaseFile: layer.BaseFile{Lower: f}, I: i, N: len(u.b)}
	if id != nil {
		bf.Show = u.showOpen(i, id)
	}
	return bf
}

// showOpen is how an open file of branch i shows id: an indexed copy's
// link count follows the index's counts, read again each time (other names
// come to the copy while it is open), from the entry of the index, whose
// name does not change.
func (u *FS) showOpen(i int, id *shown) func(*layer.Attr) {
	if !id.indexed {
		return id.apply
	}
	idx := indexName(id.id)
	return func(a *layer.Attr) {
		s := *id
		if k, err := u.indexCounts(context.Background(), i, idx); err == nil && k.ok {
			s.counted, s.left = true, 0
			if k.l > k.c {
				s.left = k.l - k.c
			}
		}
		s.apply(a)
	}
}

func writes(flags int) bool {
	return flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0
}

func (u *FS) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	o, err := u.resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	i, id := o.top(), o.id
	if writes(flags) && !o.a.IsDir() && !u.writable(i) {
		defer u.change()()
		if i, err = u.copyUp(ctx, path, o); err != nil {
			return nil, err
		}
		id = &shown{id: o.a.ID(), indexed: o.a.IsRegular() && o.a.Nlink > 1}
	}
	f, err := u.b[i].FS.Open(ctx, path, flags)
	if err != nil {
		return nil, u.branchErr(i, path, err)
	}
	return u.file(i, f, id, path, flags), nil
}

// ---- changes ---------------------------------------------------------------------

// Setattr copies the object up first (metadata and data alike: a chmod of
// a lower file copies its data too; see docs/union.md).
func (u *FS) Setattr(ctx context.Context, path string, in *layer.SetAttr) (layer.Attr, error) {
	defer u.change()()
	i, err := u.changing(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	a, err := u.b[i].FS.Setattr(ctx, path, in)
	if err != nil {
		return a, err
	}
	layer.TagBranch(&a, i, len(u.b))
	u.origin(ctx, i, path, &a).apply(&a)
	return a, nil
}

// changing copies path up if it must be, and returns the branch where it
// may be changed.
func (u *FS) changing(ctx context.Context, path string) (int, error) {
	o, err := u.resolve(ctx, path)
	if err != nil {
		return -1, err
	}
	return u.copyUp(ctx, path, o)
}

func (u *FS) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	defer u.change()()
	if u.own(name) {
		return syscall.EPERM
	}
	i, err := u.changing(ctx, path)
	if err != nil {
		return err
	}
	return u.b[i].FS.Setxattr(ctx, path, name, value, flags)
}

func (u *FS) Removexattr(ctx context.Context, path, name string) error {
	defer u.change()()
	if u.own(name) {
		return layer.ENOATTR
	}
	i, err := u.changing(ctx, path)
	if err != nil {
		return err
	}
	return u.b[i].FS.Removexattr(ctx, path, name)
}

// newEntry prepares the creation of path: it must not exist (k: what was
// known of it as the change began, if known); it returns
// the branch that gets it (the policy's choice among the RW branches where
// the new name will be seen), with path's directory there, and whether a
// whiteout there must be replaced.
func (u *FS) newEntry(ctx context.Context, path string, k knownName, known bool) (int, bool, error) {
	if path == "" {
		return -1, false, syscall.EEXIST
	}
	wh := k.wh
	if !known {
		var err error
		if _, wh, err = u.lookup(ctx, path); err == nil {
			return -1, false, syscall.EEXIST
		} else if !errors.Is(err, syscall.ENOENT) {
			return -1, false, err
		}
	} else if k.br != nil {
		return -1, false, syscall.EEXIST
	}
	dir, _ := layer.Split(path)
	// The new name is seen if it is on a branch up to the directory's
	// last part and up to the first whiteout of the name.
	i, err := u.chooseBranch(ctx, dir, path, wh)
	if err != nil {
		return -1, false, err
	}
	return i, i == wh, nil
}

// chooseBranch is the policy's branch for a new object at path in dir,
// among the RW branches up to dir's last part and up to branch wh (a
// whiteout of the name; -1: none), with dir made there.
func (u *FS) chooseBranch(ctx context.Context, dir, path string, wh int) (int, error) {
	br, err := u.dirBranches(ctx, dir)
	if err != nil {
		return -1, err
	}
	last := br[len(br)-1]
	if wh >= 0 {
		last = min(last, wh)
	}
	cand := make([]fanout.Branch, 0, last+1)
	for i := 0; i <= last; i++ {
		b := u.b[i]
		if b.Mode == fanout.NC {
			b.Mode = fanout.RO // no new objects
		}
		cand = append(cand, b)
	}
	i, err := u.policy.Create(ctx, cand, path)
	if errors.Is(err, syscall.ENOENT) {
		// An "existing path" policy found no RW branch with the
		// directory: the first RW branch gets it.
		i, err = fanout.Policies["ff"].Create(ctx, cand, path)
	}
	if err != nil {
		return -1, err
	}
	return i, u.ensureDir(ctx, i, dir)
}

// place makes a new object at path on branch i with mk (given the path to
// make it at): over a whiteout, at a temporary name first, then renamed
// over the whiteout, so that the name never shows the lower object.
func (u *FS) place(ctx context.Context, i int, path string, overWhiteout bool, mk func(p string) error) error {
	if !overWhiteout {
		return mk(path)
	}
	tmp := u.tmpName(path)
	if err := mk(tmp); err != nil {
		return err
	}
	l, self := u.b[i].FS, layer.AsSelf(ctx)
	if a, err := l.Getattr(self, tmp); err == nil && a.IsDir() {
		// A directory cannot replace a non-directory: exchange them,
		// then remove the whiteout.
		if err := l.Rename(self, tmp, path, layer.RenameExchange); err != nil {
			u.remove(ctx, i, tmp)
			return err
		}
		return l.Unlink(self, tmp)
	}
	if err := l.Rename(self, tmp, path, 0); err != nil {
		u.remove(ctx, i, tmp)
		return err
	}
	return nil
}

func (u *FS) tmpName(path string) string {
	u.mu.Lock()
	u.tmpN++
	n := u.tmpN
	u.mu.Unlock()
	dir, _ := layer.Split(path)
	return layer.Join(dir, fmt.Sprintf("%s%d", u.ownTmp, n))
}

// remove removes a temporary entry of branch i.
func (u *FS) remove(ctx context.Context, i int, p string) {
	self := layer.AsSelf(ctx)
	if err := u.b[i].FS.Unlink(self, p); errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.EPERM) {
		u.b[i].FS.Rmdir(self, p)
	}
}

func (u *FS) Create(ctx context.Context, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	k, known, done := u.changeAt(path)
	var after *knownName
	defer func() { done(after) }()
	i, wh, err := u.newEntry(ctx, path, k, known)
	if errors.Is(err, syscall.EEXIST) && flags&unix.O_EXCL == 0 {
		f, err := u.Open(ctx, path, flags&^unix.O_CREAT)
		if err != nil {
			return nil, layer.Attr{}, err
		}
		a, err := f.Getattr(ctx)
		return f, a, err
	}
	if err != nil {
		return nil, layer.Attr{}, err
	}
	var f layer.File
	var a layer.Attr
	err = u.place(ctx, i, path, wh, func(p string) (err error) {
		f, a, err = u.b[i].FS.Create(ctx, p, flags|unix.O_EXCL, mode)
		return err
	})
	if err != nil {
		if f != nil {
			f.Release(ctx)
		}
		return nil, layer.Attr{}, u.branchErr(i, path, err)
	}
	after = made(i, a.ID())
	layer.TagBranch(&a, i, len(u.b))
	return u.file(i, f, nil, path, flags), a, nil
}

// Mkdir over a whiteout makes an opaque directory: what was below the
// removed name stays hidden.
func (u *FS) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	k, known, done := u.changeAt(path)
	var after *knownName
	defer func() { done(after) }()
	i, wh, err := u.newEntry(ctx, path, k, known)
	if err != nil {
		return layer.Attr{}, err
	}
	var a layer.Attr
	err = u.place(ctx, i, path, wh, func(p string) (err error) {
		if a, err = u.b[i].FS.Mkdir(ctx, p, mode); err != nil {
			return err
		}
		if wh {
			return u.b[i].FS.Setxattr(layer.AsSelf(ctx), p, xattrOpaque, []byte("y"), 0)
		}
		return nil
	})
	u.forget(path)
	if err == nil {
		after = made(i, a.ID())
	}
	layer.TagBranch(&a, i, len(u.b))
	return a, err
}

func (u *FS) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (layer.Attr, error) {
	return u.make(ctx, path, func(l layer.FS, p string) (layer.Attr, error) { return l.Mknod(ctx, p, mode, rdev) })
}

func (u *FS) Symlink(ctx context.Context, target, path string) (layer.Attr, error) {
	return u.make(ctx, path, func(l layer.FS, p string) (layer.Attr, error) { return l.Symlink(ctx, target, p) })
}

func (u *FS) make(ctx context.Context, path string, mk func(l layer.FS, p string) (layer.Attr, error)) (layer.Attr, error) {
	k, known, done := u.changeAt(path)
	var after *knownName
	defer func() { done(after) }()
	i, wh, err := u.newEntry(ctx, path, k, known)
	if err != nil {
		return layer.Attr{}, err
	}
	var a layer.Attr
	err = u.place(ctx, i, path, wh, func(p string) (err error) { a, err = mk(u.b[i].FS, p); return err })
	if err == nil {
		after = made(i, a.ID())
	}
	layer.TagBranch(&a, i, len(u.b))
	return a, err
}

// Link links on the branch of the (copied up) file.
func (u *FS) Link(ctx context.Context, oldpath, newpath string) (layer.Attr, error) {
	defer u.change()()
	o, err := u.resolve(ctx, oldpath)
	if err != nil {
		return layer.Attr{}, err
	}
	if o.a.IsDir() {
		return layer.Attr{}, syscall.EPERM
	}
	if _, err := u.resolve(ctx, newpath); err == nil {
		return layer.Attr{}, syscall.EEXIST
	} else if !errors.Is(err, syscall.ENOENT) {
		return layer.Attr{}, err
	}
	i, err := u.copyUp(ctx, oldpath, o)
	if err != nil {
		return layer.Attr{}, err
	}
	ndir, _ := layer.Split(newpath)
	if err := u.ensureDir(ctx, i, ndir); err != nil {
		return layer.Attr{}, err
	}
	if err := u.visibleAt(ctx, i, newpath); err != nil {
		return layer.Attr{}, err
	}
	wh := u.whiteoutAt(ctx, i, newpath)
	if u.origin(ctx, i, oldpath, &o.a) != nil {
		u.markImpure(ctx, i, ndir)
	}
	var a layer.Attr
	err = u.place(ctx, i, newpath, wh, func(p string) (err error) { a, err = u.b[i].FS.Link(ctx, oldpath, p); return err })
	layer.TagBranch(&a, i, len(u.b))
	if err == nil {
		u.origin(ctx, i, newpath, &a).apply(&a)
	}
	return a, err
}

func (u *FS) whiteoutAt(ctx context.Context, i int, path string) bool {
	a, err := u.b[i].FS.Getattr(ctx, path)
	return err == nil && isWhiteout(&a)
}

// visibleAt says whether a new name path on branch i would be seen: i
// must come before any whiteout of the name on the branches of its
// directory (and the directory's part on i must not be hidden). EXDEV
// otherwise: the application copies instead.
func (u *FS) visibleAt(ctx context.Context, i int, path string) error {
	dir, _ := layer.Split(path)
	br, err := u.dirBranches(ctx, dir)
	if err != nil {
		return err
	}
	if !contains(br, i) {
		return syscall.EXDEV
	}
	for _, j := range br {
		if j >= i {
			break
		}
		if _, err := u.b[j].FS.Getattr(ctx, path); err == nil {
			return syscall.EXDEV // a whiteout or an object before i
		}
	}
	return nil
}

func contains(s []int, i int) bool {
	for _, x := range s {
		if x == i {
			return true
		}
	}
	return false
}

// Unlink removes the name's file; if the name would then show a file of a
// later branch, a whiteout takes its place (atomically: made at a
// temporary name, then renamed over the file).
func (u *FS) Unlink(ctx context.Context, path string) error {
	defer u.change()()
	o, err := u.resolve(ctx, path)
	if err != nil {
		return err
	}
	if o.a.IsDir() {
		return syscall.EISDIR
	}
	return u.removeName(ctx, path, o, false)
}

func (u *FS) Rmdir(ctx context.Context, path string) error {
	defer u.change()()
	if path == "" {
		return syscall.EBUSY
	}
	o, err := u.resolve(ctx, path)
	if err != nil {
		return err
	}
	if !o.a.IsDir() {
		return syscall.ENOTDIR
	}
	defer u.forget(path)
	if t := o.top(); len(o.br) == 1 && u.writable(t) {
		// Wholly on one writable branch: its own rmdir answers first,
		// in its order (EPERM of an immutable parent before
		// ENOTEMPTY), unless whiteouts or what it would uncover need
		// the union.
		if up, err := u.below(ctx, path, t); err == nil && !up {
			if err := u.b[t].FS.Rmdir(ctx, path); !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
				return err
			}
		}
	}
	ents, err := u.ReadDir(ctx, path, false)
	if err != nil {
		return err
	}
	if len(ents) != 0 {
		return syscall.ENOTEMPTY
	}
	return u.removeName(ctx, path, o, true)
}

// removeName removes path, on o's first branch (its only one for a
// file), and hides what the removal would uncover with a whiteout.
func (u *FS) removeName(ctx context.Context, path string, o *obj, dir bool) error {
	t := o.top()
	if u.writable(t) {
		// What the removal would uncover on later writable branches
		// goes too, as mergerfs removes a name from every branch; a
		// whiteout hides only what is left on read-only ones.
		if err := u.removeBelow(ctx, path, o, dir); err != nil {
			return err
		}
	}
	uncovers, err := u.below(ctx, path, t)
	if err != nil {
		return err
	}
	w, err := u.upper(t)
	if err != nil {
		return err
	}
	self := layer.AsSelf(ctx)
	if w != t {
		// The name is on a read-only branch: only a whiteout removes it.
		pdir, _ := layer.Split(path)
		if err := u.ensureDir(ctx, w, pdir); err != nil {
			return err
		}
		if _, err := u.b[w].FS.Mknod(self, path, unix.S_IFCHR, 0); err != nil {
			return err
		}
		if o.a.IsRegular() && o.a.Nlink > 1 {
			// A name of a file of several links ends: the index counts it.
			u.ended(ctx, w, o.a.ID(), o.a.Nlink)
			u.collect(ctx, w, o.a.ID())
		}
		return nil
	}
	l := u.b[t].FS
	if dir {
		if err := u.clearDir(ctx, t, path); err != nil {
			return err
		}
	}
	if !uncovers {
		if dir {
			return l.Rmdir(ctx, path)
		}
		if err := l.Unlink(ctx, path); err != nil {
			return err
		}
		u.collectShown(ctx, t, o.id)
		return nil
	}
	tmp := u.tmpName(path)
	if _, err := l.Mknod(self, tmp, unix.S_IFCHR, 0); err != nil {
		return err
	}
	if !dir {
		if err := l.Rename(self, tmp, path, 0); err != nil {
			l.Unlink(self, tmp)
			return err
		}
		u.collectShown(ctx, t, o.id)
		return nil
	}
	if err := l.Rename(self, tmp, path, layer.RenameExchange); err != nil {
		l.Unlink(self, tmp)
		return err
	}
	return l.Rmdir(self, tmp)
}

// removeBelow removes path from the writable branches after o's first,
// down to the first read-only branch, whiteout or object of the other
// kind: a file's shadowed files, a directory's emptied parts.
func (u *FS) removeBelow(ctx context.Context, path string, o *obj, dir bool) error {
	pdir, _ := layer.Split(path)
	br, err := u.dirBranches(ctx, pdir)
	if err != nil {
		return err
	}
	for _, j := range br {
		if j <= o.top() {
			continue
		}
		a, err := u.b[j].FS.Getattr(ctx, path)
		if notFound(err) {
			continue
		}
		if err != nil || isWhiteout(&a) || !u.writable(j) || a.IsDir() != dir || dir && !contains(o.br, j) {
			return nil
		}
		l := u.b[j].FS
		var id *shown
		if dir {
			if err := u.clearDir(ctx, j, path); err != nil {
				return nil
			}
			err = l.Rmdir(ctx, path)
		} else {
			id = u.origin(ctx, j, path, &a)
			err = l.Unlink(ctx, path)
		}
		if err != nil {
			return u.branchErr(j, path, err)
		}
		u.collectShown(ctx, j, id)
	}
	return nil
}

// clearDir removes the whiteouts and temporary entries of directory path
// on branch i (a directory empty in the merged view holds nothing else).
func (u *FS) clearDir(ctx context.Context, i int, path string) error {
	self := layer.AsSelf(ctx)
	ents, err := u.b[i].FS.ReadDir(self, path, false)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := layer.Join(path, e.Name)
		if isTmp(e.Name) {
			u.remove(ctx, i, p)
			continue
		}
		if e.Mode&unix.S_IFMT == unix.S_IFCHR || e.Mode == 0 {
			if a, err := u.b[i].FS.Getattr(self, p); err == nil && isWhiteout(&a) {
				if err := u.b[i].FS.Unlink(self, p); err != nil {
					return err
				}
				continue
			}
		}
		return syscall.ENOTEMPTY
	}
	return nil
}

// Rename renames on one branch: a file is copied up first; a directory
// that is not wholly on one writable branch gives EXDEV (as overlayfs
// without redirect_dir: mv then copies it). The old name gets a whiteout
// if it would uncover a later branch's object.
func (u *FS) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	defer u.change()()
	if flags == layer.RenameExchange {
		if oldpath == "" || newpath == "" || strings.HasPrefix(oldpath, newpath+"/") || strings.HasPrefix(newpath, oldpath+"/") {
			return syscall.EINVAL
		}
		return u.exchange(ctx, oldpath, newpath)
	}
	if flags&^layer.RenameNoreplace != 0 {
		return syscall.EINVAL
	}
	// As the kernel checks before asking (when its dentries are one).
	switch {
	case newpath == "" || strings.HasPrefix(oldpath, newpath+"/"):
		return syscall.ENOTEMPTY
	case oldpath == "" || strings.HasPrefix(newpath, oldpath+"/"):
		return syscall.EINVAL
	}
	o, err := u.resolve(ctx, oldpath)
	if err != nil {
		return err
	}
	if oldpath == newpath {
		return nil
	}
	var i int
	if o.a.IsDir() {
		if len(o.br) > 1 || !u.writable(o.top()) {
			return syscall.EXDEV
		}
		if up, err := u.below(ctx, oldpath, o.top()); err != nil || up {
			// A hidden directory below would show under the old name.
			if err == nil {
				err = syscall.EXDEV
			}
			return err
		}
		i = o.top()
	} else if i, err = u.copyUp(ctx, oldpath, o); err != nil {
		return err
	}
	dst, err := u.resolve(ctx, newpath)
	var replaced *shown // the copy whose name the rename replaces
	switch {
	case err == nil:
		if flags&layer.RenameNoreplace != 0 {
			return syscall.EEXIST
		}
		if dst.a.IsDir() != o.a.IsDir() {
			if dst.a.IsDir() {
				return syscall.EISDIR
			}
			return syscall.ENOTDIR
		}
		if dst.a.IsDir() {
			ents, err := u.ReadDir(ctx, newpath, false)
			if err != nil {
				return err
			}
			if len(ents) != 0 {
				return syscall.ENOTEMPTY
			}
		}
		if dst.top() != i {
			// The target is on another branch: remove it there first
			// (a whiteout if need be), then the rename makes the name.
			if dst.top() < i && !u.writable(dst.top()) {
				return syscall.EXDEV
			}
			if err := u.removeName(ctx, newpath, dst, dst.a.IsDir()); err != nil {
				return err
			}
		} else if dst.a.IsDir() {
			if err := u.clearDir(ctx, i, newpath); err != nil {
				return err
			}
		} else {
			replaced = dst.id
		}
	case errors.Is(err, syscall.ENOENT):
	default:
		return err
	}
	ndir, _ := layer.Split(newpath)
	if err := u.ensureDir(ctx, i, ndir); err != nil {
		return err
	}
	if err := u.visibleAt(ctx, i, newpath); err != nil && !u.whiteoutAt(ctx, i, newpath) {
		return err
	}
	uncovers, err := u.below(ctx, oldpath, i)
	if err != nil {
		return err
	}
	l := u.b[i].FS
	if u.whiteoutAt(ctx, i, newpath) {
		// The name is free in the union: the whiteout goes (a
		// directory cannot replace it; a file replaces it).
		flags &^= layer.RenameNoreplace
		if o.a.IsDir() {
			if err := l.Unlink(layer.AsSelf(ctx), newpath); err != nil {
				return err
			}
		}
	}
	// Over a whiteout of the new name, or a directory that would merge
	// with a later branch's: the renamed directory is made opaque.
	if o.a.IsDir() {
		if up, err := u.below(ctx, newpath, i); err == nil && up {
			if err := l.Setxattr(layer.AsSelf(ctx), oldpath, xattrOpaque, []byte("y"), 0); err != nil {
				return err
			}
		}
	}
	if !o.a.IsDir() && u.origin(ctx, i, oldpath, &o.a) != nil {
		u.markImpure(ctx, i, ndir)
	}
	if uncovers {
		err = l.Rename(layer.AsSelf(ctx), oldpath, newpath, flags|layer.RenameWhiteout)
	} else {
		err = l.Rename(ctx, oldpath, newpath, flags)
	}
	u.forget(oldpath)
	u.forget(newpath)
	if err == nil && replaced != nil {
		u.collectShown(ctx, i, replaced) // a copy's name was replaced
	}
	return err
}

// exchange swaps two names that are (or, copied up, come to be) on one
// writable branch. A directory must be wholly there, and may not go where
// a later branch has a directory of the name (it would merge): EXDEV.
func (u *FS) exchange(ctx context.Context, a, b string) error {
	oa, err := u.resolve(ctx, a)
	if err != nil {
		return err
	}
	ob, err := u.resolve(ctx, b)
	if err != nil {
		return err
	}
	if a == b {
		return nil
	}
	side := func(p string, o *obj, other string) (int, error) {
		if !o.a.IsDir() {
			return u.copyUp(ctx, p, o)
		}
		if len(o.br) > 1 || !u.writable(o.top()) {
			return -1, syscall.EXDEV
		}
		if up, err := u.below(ctx, other, o.top()); err != nil || up {
			if err == nil {
				err = syscall.EXDEV
			}
			return -1, err
		}
		return o.top(), nil
	}
	i, err := side(a, oa, b)
	if err != nil {
		return err
	}
	j, err := side(b, ob, a)
	if err != nil {
		return err
	}
	if i != j {
		return syscall.EXDEV
	}
	// A copy that changes directories makes its new one impure.
	da, _ := layer.Split(a)
	db, _ := layer.Split(b)
	if !oa.a.IsDir() && u.origin(ctx, i, a, &oa.a) != nil {
		u.markImpure(ctx, i, db)
	}
	if !ob.a.IsDir() && u.origin(ctx, i, b, &ob.a) != nil {
		u.markImpure(ctx, i, da)
	}
	err = u.b[i].FS.Rename(ctx, a, b, layer.RenameExchange)
	u.forget(a)
	u.forget(b)
	return err
}

// Tmpfile makes a file with no name on the first RW branch where a name in
// dir would be seen, with dir there.
func (u *FS) Tmpfile(ctx context.Context, dir string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	defer u.change()()
	i, err := u.chooseBranch(ctx, dir, layer.Join(dir, "tmpfile"), -1)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	f, a, err := u.b[i].FS.Tmpfile(ctx, dir, flags, mode)
	if err != nil {
		return nil, a, u.branchErr(i, dir, err)
	}
	layer.TagBranch(&a, i, len(u.b))
	return u.branchFile(i, f, nil), a, nil
}

// LinkFile names an open file of the union (a tmpfile's) on its branch;
// EXDEV where the name would not be seen there.
func (u *FS) LinkFile(ctx context.Context, f layer.File, newpath string) (layer.Attr, error) {
	defer u.change()()
	var lf layer.File
	var i int
	switch x := f.(type) {
	case *fanout.File:
		lf, i = x.Lower, x.I
	case *movable:
		lf, i, _ = x.cur()
	default:
		return layer.Attr{}, syscall.EXDEV
	}
	if _, err := u.resolve(ctx, newpath); err == nil {
		return layer.Attr{}, syscall.EEXIST
	} else if !errors.Is(err, syscall.ENOENT) {
		return layer.Attr{}, err
	}
	dir, _ := layer.Split(newpath)
	if err := u.ensureDir(ctx, i, dir); err != nil {
		return layer.Attr{}, err
	}
	if err := u.visibleAt(ctx, i, newpath); err != nil {
		return layer.Attr{}, err
	}
	var a layer.Attr
	err := u.place(ctx, i, newpath, u.whiteoutAt(ctx, i, newpath), func(p string) (err error) {
		a, err = u.b[i].FS.LinkFile(ctx, lf, p)
		return err
	})
	layer.TagBranch(&a, i, len(u.b))
	return a, err
}

// GetFlags gives the inode flags of the object's first branch.
func (u *FS) GetFlags(ctx context.Context, path string) (uint32, error) {
	i, err := u.branchOf(ctx, path)
	if err != nil {
		return 0, err
	}
	return u.b[i].FS.GetFlags(ctx, path)
}

// SetFlags copies the object up first, as any change of its attributes.
func (u *FS) SetFlags(ctx context.Context, path string, flags uint32) error {
	defer u.change()()
	i, err := u.changing(ctx, path)
	if err != nil {
		return err
	}
	return u.b[i].FS.SetFlags(ctx, path, flags)
}
