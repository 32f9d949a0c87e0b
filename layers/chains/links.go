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

	"golang.org/x/sys/unix"

	"cairn/layer"
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

// view makes the bytes the link at p presents.
func (fs *FS) view(ctx context.Context, p string, l *link) ([]byte, layer.Attr, error) {
	t, err := l.resolve(p)
	if err != nil {
		return nil, layer.Attr{}, err
	}
	if fs.reserved(t) {
		return nil, layer.Attr{}, syscall.ENOENT
	}
	if err := fs.mayRead(ctx, t); err != nil {
		return nil, layer.Attr{}, err
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
			f, err = fs.Open(ctx, t, unix.O_RDONLY)
		}
	}
	if err != nil {
		return nil, layer.Attr{}, err
	}
	defer f.Release(ctx)
	var src bytes.Buffer
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, rerr := f.ReadAt(ctx, buf, off)
		src.Write(buf[:n])
		off += int64(n)
		if src.Len() > maxLinkView {
			return nil, layer.Attr{}, syscall.EFBIG
		}
		if rerr == io.EOF || (rerr == nil && n == 0) {
			break
		}
		if rerr != nil {
			return nil, layer.Attr{}, rerr
		}
	}
	out := src.Bytes()
	for _, v := range views {
		switch v {
		case "gzip":
			var z bytes.Buffer
			w, _ := gzip.NewWriterLevel(&z, gzip.DefaultCompression)
			w.Write(out)
			w.Close()
			out = z.Bytes()
		}
		if len(out) > maxLinkView {
			return nil, layer.Attr{}, syscall.EFBIG
		}
	}
	return out, ta, nil
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
		b, _, err := fs.view(ctx, p, l)
		if err != nil {
			return
		}
		n = int64(len(b))
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
	b, _, err := fs.view(ctx, p, l)
	if err != nil {
		lf.Release(ctx)
		return nil, err
	}
	return &linkFile{File: lf, lower: lf, b: b}, nil
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
	names, cur, err := fs.readRecord(ctx, p)
	if err != nil {
		return err
	}
	if l == nil {
		if cur == nil {
			return syscall.ENODATA
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
		if !fs.waitWriters(a.ID()) {
			return syscall.EBUSY
		}
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
func (f *linkFile) Flush(ctx context.Context) error                      { return nil }
func (f *linkFile) Fsync(ctx context.Context, datasync bool) error       { return nil }
func (f *linkFile) Release(ctx context.Context) error                    { return f.lower.Release(ctx) }
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
