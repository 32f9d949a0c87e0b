package chains

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Transformation links (MonA's way to open a file through a network of
// transformations; docs/chains.md): an empty regular file of the lower
// whose record, instead of a chain, names a target file and the views
// applied to it:
//
//	link-record = "L1:" target ":" view ("," view)*
//
// target is a path relative to the link's directory (it may not leave the
// root); views are applied left to right to the target's bytes as the
// mount presents them: "gzip" is their gzip encoding (RFC 1952, no name,
// no time: the same bytes every time), "stored" is the target as it is
// stored in the lower (its chain's format: a crypt file's ciphertext), which
// may only come first. A link is read-only, and is made and removed through
// user.cairn.link (setfattr -n user.cairn.link -v report.txt:gzip
// report.txt.gz, on an empty file).

// LinkXattr shows, makes and removes a transformation link.
const LinkXattr = "user.cairn.link"

const linkVersion = "L1"

// maxLinkView bounds what a link presents: it is made in memory when the
// link is opened.
const maxLinkView = 256 << 20

// DefaultViewBudget is the memory the views of all open links may hold
// together (Options.ViewBudget): without a bound, each open of a link
// held up to maxLinkView until its close, and any user could make the
// daemon hold N times that with N opens.
const DefaultViewBudget = 256 << 20

// viewWait is how long making a view waits for room in the budget.
const viewWait = time.Second

// viewBudget counts the bytes views hold (made or being made), daemon-wide.
type viewBudget struct {
	mu        sync.Mutex
	cond      *sync.Cond
	max, held int64
}

// take reserves n bytes, waiting up to viewWait for room: ENOMEM after
// that, EFBIG if n alone is more than the budget.
func (fs *FS) takeView(n int64) error {
	b := &fs.views
	if n > b.max {
		return syscall.EFBIG
	}
	deadline := time.Now().Add(viewWait)
	t := time.AfterFunc(viewWait, func() {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	defer t.Stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.held+n > b.max {
		if !time.Now().Before(deadline) {
			fs.log.Warn("chains: the views of open links hold their whole budget; an open of a link fails with ENOMEM",
				"budget", b.max, "held", b.held, "asked", n)
			return syscall.ENOMEM
		}
		b.cond.Wait()
	}
	b.held += n
	return nil
}

// giveView gives n bytes back.
func (fs *FS) giveView(n int64) {
	if n == 0 {
		return
	}
	b := &fs.views
	b.mu.Lock()
	b.held -= n
	b.cond.Broadcast()
	b.mu.Unlock()
}

// ViewBytes is the memory the views of links hold now (made or being
// made): never more than the budget.
func (fs *FS) ViewBytes() int64 {
	fs.views.mu.Lock()
	defer fs.views.mu.Unlock()
	return fs.views.held
}

// budgetBuffer is a buffer whose growth is taken from the view budget.
type budgetBuffer struct {
	fs    *FS
	b     bytes.Buffer
	held  *int64 // what the view holds, this buffer's share included
	ahead int64  // reserved and not yet written
}

func (w *budgetBuffer) Write(p []byte) (int, error) {
	if int64(w.b.Len()+len(p)) > maxLinkView {
		return 0, syscall.EFBIG
	}
	n := int64(len(p))
	use := min(n, w.ahead)
	w.ahead -= use
	if n > use {
		if err := w.fs.takeView(n - use); err != nil {
			return 0, err
		}
		*w.held += n - use
	}
	return w.b.Write(p)
}

type link struct {
	target string   // relative to the link's directory
	views  []string // applied left to right
}

func (l *link) String() string { return l.target + ":" + strings.Join(l.views, ",") }

func (l *link) record() []byte { return []byte(linkVersion + ":" + l.String()) }

// parseLink parses "target:view,view" (the xattr's value, and a link
// record's body).
func parseLink(s string) (*link, error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 {
		return nil, errors.New("a link is TARGET:VIEW[,VIEW...]")
	}
	l := &link{target: s[:i]}
	if strings.HasPrefix(l.target, "/") || strings.ContainsRune(l.target, 0) {
		return nil, fmt.Errorf("link target %q: want a path relative to the link's directory", l.target)
	}
	if err := checkTargetLength(l.target); err != nil {
		return nil, err
	}
	for _, v := range strings.Split(s[i+1:], ",") {
		v = strings.TrimSpace(v)
		switch v {
		case "gzip":
		case "stored":
			if len(l.views) != 0 {
				return nil, errors.New(`the view "stored" can only come first`)
			}
		default:
			return nil, fmt.Errorf("link view %q is not in this build of cairn (views: gzip, stored)", v)
		}
		l.views = append(l.views, v)
	}
	if len(l.views) > maxLinks {
		return nil, fmt.Errorf("a link of %d views (at most %d)", len(l.views), maxLinks)
	}
	return l, nil
}

// errTargetTooLong is a link target longer than a path (PATH_MAX) or with
// a name longer than a name (NAME_MAX): ENAMETOOLONG, as open(2) of it
// would say, rather than what the lower's xattr size limit would give.
type errTargetTooLong struct{ msg string }

func (e *errTargetTooLong) Error() string { return e.msg }

func checkTargetLength(t string) error {
	if len(t) >= unix.PathMax {
		return &errTargetTooLong{fmt.Sprintf("link target of %d bytes (a path has at most %d)", len(t), unix.PathMax-1)}
	}
	for _, c := range strings.Split(t, "/") {
		if len(c) > unix.NAME_MAX {
			return &errTargetTooLong{fmt.Sprintf("link target with a name of %d bytes (at most %d)", len(c), unix.NAME_MAX)}
		}
	}
	return nil
}

// resolve is the target's path in the layer, for a link at p.
func (l *link) resolve(p string) (string, error) {
	dir, _ := layer.Split(p)
	t := path.Clean(path.Join("/", dir, l.target))
	// Join from "/" clamps ".." at the root; refuse rather than clamp.
	rel := path.Join(dir, l.target)
	if rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("link target %q leaves the root", l.target)
	}
	return strings.TrimPrefix(t, "/"), nil
}

// linkSizes caches the presented size of links by their target's identity
// and change time, so that stat does not encode the target each time.
type linkSizes struct {
	mu sync.Mutex
	m  map[linkKey]int64
}

type linkKey struct {
	id           layer.ID
	size         uint64
	mtime, ctime layer.Time
	views        string
}

// view makes the bytes the link at p presents, and gives the bytes of
// the budget they hold (giveView when done with them; on error, nothing is
// held); fs.swap is held.
func (fs *FS) view(ctx context.Context, p string, l *link) (out []byte, held int64, err error) {
	defer func() {
		if err != nil {
			fs.giveView(held)
			out, held = nil, 0
		}
	}()
	t, err := l.resolve(p)
	if err != nil {
		return nil, 0, err
	}
	if fs.reserved(t) {
		return nil, 0, syscall.ENOENT
	}
	if err := fs.mayRead(ctx, t); err != nil {
		return nil, 0, err
	}
	views := l.views
	var f layer.File
	var ta layer.Attr
	if views[0] == "stored" {
		views = views[1:]
		if ta, err = fs.Lower.Getattr(ctx, t); err == nil && !ta.IsRegular() {
			err = syscall.EINVAL
		}
		if err == nil {
			f, err = layer.OpenNoAtime(ctx, fs.Lower, t, unix.O_RDONLY|unix.O_NOFOLLOW)
		}
	} else {
		if ta, err = fs.Lower.Getattr(ctx, t); err == nil && !ta.IsRegular() {
			err = syscall.EINVAL
		}
		if err == nil {
			if _, tl, rerr := fs.readRecord(ctx, t); rerr == nil && tl != nil {
				err = syscall.ELOOP // a link to a link
			}
		}
		if err == nil {
			// fs.open: the caller (an open or a stat of the link)
			// holds fs.swap for reading, and a second read lock would
			// wait behind a rename waiting for the write lock.
			f, err = fs.open(ctx, t, unix.O_RDONLY)
		}
	}
	if err != nil {
		return nil, 0, err
	}
	defer f.Release(ctx)
	// Every byte made is taken from the budget first: the source, then
	// each view's output, the one before it given back once it is made.
	src := &budgetBuffer{fs: fs, held: &held}
	if ta.Size > 0 {
		// The stored size: near enough to reserve it at once, so that
		// opens that do not fit together wait or fail before reading.
		if err := src.reserve(int64(min(ta.Size, maxLinkView+1))); err != nil {
			return nil, held, err
		}
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, rerr := f.ReadAt(ctx, buf, off)
		if _, err := src.Write(buf[:n]); err != nil {
			return nil, held, err
		}
		off += int64(n)
		if rerr == io.EOF || (rerr == nil && n == 0) {
			break
		}
		if rerr != nil {
			return nil, held, rerr
		}
	}
	src.unreserve()
	out = src.b.Bytes()
	for _, v := range views {
		switch v {
		case "gzip":
			z := &budgetBuffer{fs: fs, held: &held}
			w, _ := gzip.NewWriterLevel(z, gzip.DefaultCompression)
			_, werr := w.Write(out)
			if cerr := w.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				return nil, held, werr
			}
			fs.giveView(int64(len(out)))
			held -= int64(len(out))
			out = z.b.Bytes()
		}
	}
	return out, held, nil
}

// reserve takes n bytes of the budget ahead of writes, which then use them
// up before taking more; unreserve gives back what writes did not use.
func (w *budgetBuffer) reserve(n int64) error {
	if err := w.fs.takeView(n); err != nil {
		return err
	}
	*w.held += n
	w.ahead = n
	return nil
}

func (w *budgetBuffer) unreserve() {
	w.fs.giveView(w.ahead)
	*w.held -= w.ahead
	w.ahead = 0
}

// mayRead checks that the caller may read the file at t as if it opened it
// by its path: search permission on each directory above it and read
// permission on it (by mode bits: an ACL granting more is not consulted).
// The daemon reads a link's target itself, and the kernel checked only
// the link's own permissions: without this, a link would show any user
// any file of the mount.
func (fs *FS) mayRead(ctx context.Context, t string) error {
	c := layer.CallerOf(ctx)
	if c.Uid == 0 {
		return nil
	}
	may := func(p string, bits uint32) error {
		a, err := fs.Lower.Getattr(ctx, p)
		if err != nil {
			return err
		}
		m := a.Mode
		switch {
		case a.Uid == c.Uid:
			m >>= 6
		case c.InGroup(a.Gid):
			m >>= 3
		}
		if m&bits != bits {
			return syscall.EACCES
		}
		return nil
	}
	for dir := t; dir != ""; {
		dir, _ = layer.Split(dir)
		if err := may(dir, 1); err != nil {
			return err
		}
	}
	return may(t, 4)
}

// statLink sets the presented size of the link at p.
func (fs *FS) statLink(ctx context.Context, p string, l *link, a *layer.Attr) {
	a.Size = 0
	t, err := l.resolve(p)
	if err != nil || fs.mayRead(ctx, t) != nil {
		return
	}
	ta, err := fs.Lower.Getattr(ctx, t)
	if err != nil {
		return
	}
	k := linkKey{id: ta.ID(), size: ta.Size, mtime: ta.Mtime, ctime: ta.Ctime, views: strings.Join(l.views, ",")}
	fs.sizes.mu.Lock()
	n, ok := fs.sizes.m[k]
	fs.sizes.mu.Unlock()
	if !ok {
		b, held, err := fs.view(ctx, p, l)
		if err != nil {
			return
		}
		n = int64(len(b))
		fs.giveView(held)
		fs.sizes.mu.Lock()
		if fs.sizes.m == nil || len(fs.sizes.m) > 4096 {
			fs.sizes.m = map[linkKey]int64{}
		}
		fs.sizes.m[k] = n
		fs.sizes.mu.Unlock()
	}
	a.Size = uint64(n)
	a.Blocks = (a.Size + 511) / 512
}

// openLink opens the link at p: its view, made now, read-only.
func (fs *FS) openLink(ctx context.Context, p string, l *link, flags int) (layer.File, error) {
	if flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0 {
		return nil, syscall.EROFS
	}
	lf, err := fs.Lower.Open(ctx, p, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, err
	}
	b, held, err := fs.view(ctx, p, l)
	if err != nil {
		lf.Release(ctx)
		return nil, err
	}
	return &linkFile{File: lf, lower: lf, b: b, fs: fs, held: held}, nil
}

// setLink makes the empty regular file at p a link (l != nil), or a
// link an empty file again (l == nil).
func (fs *FS) setLink(ctx context.Context, p string, l *link) error {
	a, err := fs.Lower.Getattr(ctx, p)
	if err != nil {
		return err
	}
	if !a.IsRegular() {
		return syscall.EPERM
	}
	wf, err := fs.Lower.Open(ctx, p, unix.O_WRONLY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	wf.Release(ctx)
	fs.conv.Lock()
	defer fs.conv.Unlock()
	if names, _, err := fs.readRecord(ctx, p); err == nil && names != nil && !fs.waitWriters(a.ID()) {
		return syscall.EBUSY
	}
	// The record changes under the lock, so that no operation reads the
	// old one and acts on the file as it was.
	fs.swap.Lock()
	defer fs.swap.Unlock()
	if b, err := fs.Lower.Getattr(ctx, p); err != nil {
		return err
	} else if b.ID() != a.ID() {
		return syscall.EBUSY // replaced meanwhile
	}
	names, cur, err := fs.readRecord(ctx, p)
	if err != nil {
		return err
	}
	if l == nil {
		if cur == nil {
			return layer.ENOATTR
		}
		return fs.Meta.Remove(ctx, p, metaKey)
	}
	if cur == nil {
		pa := a
		fs.stat(ctx, p, &pa)
		if pa.Size != 0 {
			fs.log.Warn("chains: a link is made on an empty file", "path", p)
			return syscall.ENOTEMPTY
		}
	}
	if names != nil {
		// An empty guarded file (made under a rule): its stored form
		// (a header) goes, and so does its chain.
		fs.forget(ctx, a.ID())
		if _, err := fs.Lower.Setattr(layer.AsSelf(ctx), p, &layer.SetAttr{Valid: layer.SetSize}); err != nil {
			return err
		}
	}
	if _, err := l.resolve(p); err != nil {
		fs.log.Warn("chains: refused link", "path", p, "err", err)
		return syscall.EINVAL
	}
	return fs.Meta.Set(ctx, p, metaKey, l.record())
}

// linkFile is an open link: its view in memory.
type linkFile struct {
	layer.File // the lower file, for what is not overridden
	lower      layer.File
	b          []byte
	fs         *FS
	held       int64 // of the view budget
	once       sync.Once
}

func (f *linkFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off >= int64(len(f.b)) {
		return 0, io.EOF
	}
	n := copy(p, f.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *linkFile) WriteAt(context.Context, []byte, int64) (int, error) { return 0, syscall.EBADF }

func (f *linkFile) Getattr(ctx context.Context) (layer.Attr, error) {
	a, err := f.lower.Getattr(ctx)
	a.Size = uint64(len(f.b))
	a.Blocks = (a.Size + 511) / 512
	return a, err
}

func (f *linkFile) Setattr(context.Context, *layer.SetAttr) (layer.Attr, error) {
	return layer.Attr{}, syscall.EROFS
}
func (f *linkFile) Flush(ctx context.Context) error                { return nil }
func (f *linkFile) Fsync(ctx context.Context, datasync bool) error { return nil }
func (f *linkFile) Release(ctx context.Context) error {
	f.once.Do(func() { f.fs.giveView(f.held); f.b = nil })
	return f.lower.Release(ctx)
}
func (f *linkFile) Allocate(context.Context, int64, int64, uint32) error { return syscall.EROFS }
func (f *linkFile) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	if off >= int64(len(f.b)) {
		return 0, syscall.ENXIO
	}
	if whence == unix.SEEK_HOLE {
		return int64(len(f.b)), nil
	}
	return off, nil
}
func (f *linkFile) CopyFileRange(context.Context, int64, layer.File, int64, int64, uint32) (int64, error) {
	return 0, syscall.EXDEV
}
func (f *linkFile) Getlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32) (layer.Lock, error) {
	return f.lower.Getlk(ctx, owner, lk, flags)
}
func (f *linkFile) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32, wait bool) error {
	return f.lower.Setlk(ctx, owner, lk, flags, wait)
}
func (f *linkFile) PassthroughFd() (int, bool) { return -1, false }

// Caps: direct I/O, so that a link opened again after its target changed
// shows the new view, not pages of the old one.
func (f *linkFile) Caps() layer.Caps { return layer.CapDirectIO }
