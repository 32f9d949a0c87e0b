// Package crypt is the encrypting layer (Cryptfs, after FiST; its format and
// threat model are in docs/crypt.md). File contents are sealed in blocks with
// AES-256-GCM (or XChaCha20-Poly1305) bound to the file and the block's
// place; names, symlink targets and extended attributes are encrypted too.
// A name cache after pefs's keeps the cost of a name independent of the size
// of its directory.
package crypt

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
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
)

// FS is a crypt layer over one lower layer.
type FS struct {
	layer.Base
	t     *Content // the content: the files' bytes
	names *names
	xattr *names
	meta  cipher.AEAD // symlink targets and xattr values
	ivKey []byte      // MACs of directory IVs
	cache *nameCache
	rand  io.Reader
	log   *slog.Logger

	bmu      sync.Mutex
	badNames map[string]bool // lower paths of names left out of listings, logged once

	mu sync.Mutex

	xmu    sync.Mutex
	xnames map[string]string // xattr name -> lower name (a few: ACLs, user.*)

	release func() // lets go of the claim on the lower (see Claim)
}

// Claim locks the lower directory for as long as the layer is open
// (layer.Claimer): the layer keeps names, sizes and journals in memory, so
// a second mount of the same volume, which would corrupt it, is refused
// with a *layer.InUseError.
func (fs *FS) Claim(ctx context.Context) error {
	fs.mu.Lock()
	claimed := fs.release != nil
	fs.mu.Unlock()
	if claimed {
		return nil
	}
	// The configuration file too: the lock other clients of a network
	// file system see (a directory's flock is this machine's only).
	// Shared with other shared claims (cairn mount -shared): files'
	// sizes and bytes come from the lower at each open and a file's
	// journal lives only while it is open, so that mounts that take turns
	// on files (close, then open elsewhere) read what the other wrote.
	release, err := layer.LockLowerShared(ctx, fs.Lower, "crypt", ConfigName, layer.SharedClaim(ctx))
	if err != nil {
		return err
	}
	fs.mu.Lock()
	fs.release = release
	fs.mu.Unlock()
	return nil
}

// Share makes the name cache check its directories before use
// (layer.Sharer): it keeps directories' IVs by path, which another
// machine's rename or re-creation of a directory changes (see nameCache).
func (fs *FS) Share() { fs.cache.shared = true }

// cachedDir returns the cache entry of the plaintext directory path, if it
// has one that is still right.
func (fs *FS) cachedDir(ctx context.Context, path string) *dirEntry {
	d := fs.cache.dir(path)
	if d == nil || !fs.cache.shared {
		return d
	}
	if time.Since(d.read) < sharedTTL {
		if a, err := fs.Lower.Getattr(ctx, d.lower); err == nil && a.IsDir() && a.ID() == d.id && a.Btime == d.btime {
			return d
		}
	}
	fs.cache.forget(path, d)
	return nil
}

// Close lets go of the claim.
func (fs *FS) Close() error {
	fs.mu.Lock()
	release := fs.release
	fs.release = nil
	fs.mu.Unlock()
	if release != nil {
		release()
	}
	return nil
}

var _ layer.FS = (*FS)(nil)

// Options tune a crypt layer.
type Options struct {
	// CacheDirs and CacheNames bound the name cache (defaults 16384 and
	// 262144).
	CacheDirs, CacheNames int
	// Rand is the source of nonces, file IDs and directory IVs (default
	// crypto/rand); tests set it for known answers.
	Rand io.Reader
	// Logger gets the lines about damage the layer works around (a name
	// left out of a listing); default slog.Default().
	Logger *slog.Logger
	// NoJournal turns off the journal of in-place rewrites (journal.go).
	NoJournal bool
}

// New stacks a crypt layer over lower, whose configuration is cfg and whose
// master key is master (see Unlock).
func New(lower layer.FS, cfg *Config, master []byte, o Options) (*FS, error) {
	if err := cfg.CheckMasterKey(master); err != nil {
		return nil, err
	}
	if o.Rand == nil {
		o.Rand = rand.Reader
	}
	if o.CacheDirs == 0 {
		o.CacheDirs = 1 << 14
	}
	if o.CacheNames == 0 {
		o.CacheNames = 1 << 18
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	protectProcess()
	t, err := NewContent(lower, cfg, master, o)
	if err != nil {
		return nil, err
	}
	nm, err := newNames(subkey(master, "names", 64))
	if err != nil {
		return nil, err
	}
	xn, err := newNames(subkey(master, "xattr names", 64))
	if err != nil {
		return nil, err
	}
	fs := &FS{
		Base: layer.Base{Lower: lower}, t: t, names: nm, xattr: xn,
		meta:  newAEADClear(cfg.Cipher, subkey(master, "meta", 32)),
		ivKey: keep(subkey(master, "diriv", 32)),
		cache: newNameCache(o.CacheDirs, o.CacheNames), rand: o.Rand, log: o.Logger, badNames: map[string]bool{},
		xnames: map[string]string{},
	}
	return fs, nil
}

// Unlock reads the configuration from lower and opens it with a passphrase
// (or, with isMasterKey, with the master key written as FormatMasterKey
// does), and stacks the layer.
func Unlock(ctx context.Context, lower layer.FS, secret []byte, isMasterKey bool, o Options) (*FS, error) {
	cfg, err := ReadConfig(ctx, lower)
	if err != nil {
		return nil, err
	}
	var master []byte
	if isMasterKey {
		if master, err = ParseMasterKey(string(secret)); err != nil {
			return nil, err
		}
		if err := cfg.CheckMasterKey(master); err != nil {
			return nil, fmt.Errorf("%w for %s", err, where(lower, ConfigName))
		}
	} else if master, err = cfg.Unwrap(secret); err != nil {
		return nil, fmt.Errorf("%w for %s", err, where(lower, ConfigName))
	}
	defer clear(master)
	return New(lower, cfg, master, o)
}

func (fs *FS) Changes() layer.Changes {
	return layer.ChangesNames | layer.ChangesData | layer.ChangesAttrs
}

// corrupt is the error for data that does not authenticate: the frontend
// logs it and the application gets EIO.
type corrupt struct {
	what string // the plaintext path, or the lower one
	msg  string
}

func (e *corrupt) Error() string {
	return "crypt: " + e.what + ": " + e.msg + " (tampered with or damaged)"
}

func corruptf(what, f string, a ...any) error { return &corrupt{what: what, msg: fmt.Sprintf(f, a...)} }

// IsCorrupt reports whether err says that stored data failed to
// authenticate.
func IsCorrupt(err error) bool {
	var c *corrupt
	return errors.As(err, &c)
}

// --- paths ---

// dir returns the cache entry of the plaintext directory path, reading its
// IV (and its parents') when it is not cached.
func (fs *FS) dir(ctx context.Context, path string) (*dirEntry, error) {
	if d := fs.cachedDir(ctx, path); d != nil {
		return d, nil
	}
	gen := fs.cache.generation()
	lower := ""
	if path != "" {
		parent, name := layer.Split(path)
		pd, err := fs.dir(ctx, parent)
		if err != nil {
			return nil, err
		}
		lname, _, err := fs.encName(pd, name)
		if err != nil {
			return nil, err
		}
		lower = layer.Join(pd.lower, lname)
	}
	var a *layer.Attr
	if fs.cache.shared {
		// Before the IV: a directory remade between the two shows
		// another identity at its next use.
		da, err := fs.Lower.Getattr(ctx, lower)
		if err != nil {
			return nil, err
		}
		a = &da
	}
	iv, err := fs.readIV(ctx, path, lower)
	if err != nil {
		return nil, err
	}
	return fs.cache.addDir(path, lower, iv, a, gen), nil
}

func (fs *FS) readIV(ctx context.Context, path, lower string) ([]byte, error) {
	f, err := fs.Lower.Open(ctx, layer.Join(lower, dirIVName), unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
			// The directory may be missing (ENOENT is right), or
			// may have lost its IV.
			a, aerr := fs.Lower.Getattr(ctx, lower)
			if aerr != nil {
				return nil, aerr
			}
			if !a.IsDir() {
				return nil, syscall.ENOTDIR
			}
			return fs.repairIV(ctx, path, lower, false)
		}
		return nil, err
	}
	defer f.Release(ctx)
	b := make([]byte, dirIVSize+dirIVMAC+1)
	n, err := readFull(ctx, f, b, 0)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return fs.repairIV(ctx, path, lower, true)
	}
	iv, ok := checkIV(fs.ivKey, b[:n])
	if !ok {
		return nil, corruptf("/"+path, "the directory's IV (%s) does not authenticate", layer.Join(lower, dirIVName))
	}
	return iv, nil
}

// repairIV gives a new IV to a directory whose IV file is empty or missing
// (exists says which), as a crash during its mkdir or rmdir, or during a
// rename over it, can leave it, if the directory holds nothing else (no
// name depends on the lost IV; a side file left without its entry does
// not count).
func (fs *FS) repairIV(ctx context.Context, path, lower string, exists bool) ([]byte, error) {
	p := layer.Join(lower, dirIVName)
	ents, err := fs.Lower.ReadDir(ctx, lower, false)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if e.Name != dirIVName && !(isSide(e.Name) && !hasEntry(ents, strings.TrimSuffix(e.Name, longSuffix))) {
			if exists {
				return nil, corruptf("/"+path, "the directory's IV (%s) is empty", p)
			}
			return nil, corruptf("/"+path, "directory %s has no %s", lower, dirIVName)
		}
	}
	iv := make([]byte, dirIVSize)
	if _, err := io.ReadFull(fs.rand, iv); err != nil {
		return nil, randErr(err)
	}
	if exists {
		if err := fs.Lower.Unlink(ctx, p); err != nil {
			return nil, err
		}
	}
	// As the daemon: whoever looks first may only read the directory.
	if err := writeNew(context.Background(), fs.Lower, p, ivFile(fs.ivKey, iv), 0o444, true); err != nil {
		return nil, err
	}
	return iv, nil
}

// encName returns the lower name of a plaintext name in directory d, and
// the encoded name when the lower name is its long form ("" otherwise).
func (fs *FS) encName(d *dirEntry, name string) (lname, long string, err error) {
	if !layer.ValidName(name) {
		return "", "", syscall.EINVAL
	}
	if len(name) > 255 {
		return "", "", syscall.ENAMETOOLONG
	}
	enc, ok := fs.cache.encoded(d, name)
	if !ok {
		enc = fs.names.encrypt(d.iv, name)
		fs.cache.add(d, name, enc, "")
	}
	lname, isLong := lowerName(enc)
	if isLong {
		long = enc
	}
	return lname, long, nil
}

// lowerPath translates a plaintext path.
func (fs *FS) lowerPath(ctx context.Context, path string) (string, error) {
	lp, _, _, err := fs.lowerEntry(ctx, path)
	return lp, err
}

// lowerEntry translates a plaintext path and also returns its directory's
// entry and the encoded name when it is long.
func (fs *FS) lowerEntry(ctx context.Context, path string) (lpath string, d *dirEntry, long string, err error) {
	if path == "" {
		return "", nil, "", nil
	}
	dir, name := layer.Split(path)
	if d, err = fs.dir(ctx, dir); err != nil {
		return "", nil, "", err
	}
	lname, long, err := fs.encName(d, name)
	if err != nil {
		return "", nil, "", err
	}
	return layer.Join(d.lower, lname), d, long, nil
}

// writeLong writes the side file of a long name before the entry is made,
// and syncs it: the entry cannot be read without it (see Mkdir's IV).
func (fs *FS) writeLong(ctx context.Context, lpath, long string) error {
	if long == "" {
		return nil
	}
	side := lpath + longSuffix
	f, _, err := fs.Lower.Create(ctx, side, unix.O_WRONLY|unix.O_TRUNC, 0o444)
	if errors.Is(err, syscall.EACCES) {
		// A side file left read-only by an earlier entry of the same
		// name holds the same bytes.
		return nil
	}
	if err != nil {
		return err
	}
	n, err := f.WriteAt(ctx, []byte(long), 0)
	if err == nil && n != len(long) {
		err = fmt.Errorf("crypt: short write of %s (%d of %d bytes)", side, n, len(long))
	}
	if err == nil {
		err = f.Fsync(ctx, false)
	}
	if rerr := f.Release(ctx); err == nil {
		err = rerr
	}
	return err
}

// dropLong removes the side file of a long name whose entry is gone.
func (fs *FS) dropLong(ctx context.Context, lpath, long string) {
	if long != "" {
		fs.Lower.Unlink(ctx, lpath+longSuffix)
	}
}

// decName returns the plaintext name of a lower name in directory d
// (which lists as ldir in the lower).
func (fs *FS) decName(ctx context.Context, dpath string, d *dirEntry, lname string) (string, error) {
	if n, ok := fs.cache.decoded(d, lname); ok {
		return n, nil
	}
	var side []byte
	if isLong(lname) {
		p := layer.Join(d.lower, lname+longSuffix)
		var err error
		if side, err = fs.readSide(ctx, p); err != nil {
			if errors.Is(err, syscall.ENOENT) {
				return "", corruptf("/"+dpath, "long name %s has no %s", layer.Join(d.lower, lname), longSuffix)
			}
			return "", err
		}
	}
	name, enc, err := fs.names.decodeLower(d.iv, lname, side)
	if err != nil {
		return "", corruptf("/"+dpath, "name %s: %v", layer.Join(d.lower, lname), err)
	}
	fs.cache.add(d, name, enc, lname)
	return name, nil
}

// readSide reads a long name's side file, which is never longer than
// maxSide: a longer one is damage, not a reason to read gigabytes.
func (fs *FS) readSide(ctx context.Context, p string) ([]byte, error) {
	f, err := fs.Lower.Open(ctx, p, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, err
	}
	defer f.Release(ctx)
	b := make([]byte, maxSide+1)
	n, err := readFull(ctx, f, b, 0)
	if err != nil {
		return nil, err
	}
	return b[:n], nil
}

// --- attributes ---

// fixAttr turns lower attributes into plaintext ones.
func (fs *FS) fixAttr(a *layer.Attr) {
	switch {
	case a.IsRegular():
		fs.t.Stat(context.Background(), "", a)
	case a.IsSymlink() && a.Size != uint64(longLinkSize): // (a long one: fixLink)
		n := a.Size * 6 / 8 // base64 without padding
		if n > uint64(fs.meta.NonceSize()+fs.meta.Overhead()) {
			a.Size = n - uint64(fs.meta.NonceSize()+fs.meta.Overhead())
		} else {
			a.Size = 0
		}
	}
}

func (fs *FS) Getattr(ctx context.Context, path string) (layer.Attr, error) {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	a, err := fs.Lower.Getattr(ctx, lp)
	if err != nil {
		return a, err
	}
	fs.fixAttr(&a)
	fs.fixLink(ctx, lp, &a)
	return a, nil
}

func (fs *FS) Setattr(ctx context.Context, path string, in *layer.SetAttr) (layer.Attr, error) {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	if in.Valid&layer.SetSize != 0 {
		f, err := fs.t.open(ctx, lp, path, unix.O_WRONLY)
		if err != nil {
			return layer.Attr{}, err
		}
		a, err := f.Setattr(ctx, in)
		if rerr := f.Release(ctx); err == nil {
			err = rerr
		}
		return a, err
	}
	a, err := fs.Lower.Setattr(ctx, lp, in)
	if err != nil {
		return a, err
	}
	fs.fixAttr(&a)
	fs.fixLink(ctx, lp, &a)
	return a, nil
}

// --- directories ---

func (fs *FS) ReadDir(ctx context.Context, path string, plus bool) ([]layer.DirEntry, error) {
	d, err := fs.OpenDir(ctx, path)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return layer.ReadDirAll(ctx, d, plus)
}

// OpenDir streams path's listing (layer.DirOpener), decrypting names as
// they come; the cookies are the lower's.
func (fs *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	d, err := fs.dir(ctx, path)
	if err != nil {
		return nil, err
	}
	ld, err := layer.OpenDir(ctx, fs.Lower, d.lower)
	if err != nil {
		return nil, err
	}
	return layer.MapDir(ld, func(ctx context.Context, e *layer.DirEntry) (bool, error) {
		if isOwn(e.Name) {
			return false, nil
		}
		name, err := fs.decName(ctx, path, d, e.Name)
		if IsCorrupt(err) {
			// One damaged or planted name must not hide the rest.
			fs.logBadName(layer.Join(d.lower, e.Name), err)
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if e.Attr != nil {
			fs.fixAttr(e.Attr)
			fs.fixLink(ctx, layer.Join(d.lower, e.Name), e.Attr)
		}
		e.Name = name
		return true, nil
	}), nil
}

// logBadName says once per lower path that a name was left out of a
// listing (a bounded set: past it, lines may repeat).
func (fs *FS) logBadName(lpath string, err error) {
	fs.bmu.Lock()
	seen := fs.badNames[lpath]
	if !seen {
		if len(fs.badNames) >= 4096 {
			clear(fs.badNames)
		}
		fs.badNames[lpath] = true
	}
	fs.bmu.Unlock()
	if !seen {
		var c *corrupt
		errors.As(err, &c)
		fs.log.Warn("crypt: entry left out of a directory listing (tampered with or damaged)", "lower", lpath, "why", c.msg)
	}
}

func (fs *FS) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	gen := fs.cache.generation()
	lp, _, long, err := fs.lowerEntry(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	if err := fs.writeLong(ctx, lp, long); err != nil {
		return layer.Attr{}, err
	}
	// Owner write and search until the IV is in, whatever mode asks.
	a, err := fs.Lower.Mkdir(ctx, lp, mode|0o300)
	if err != nil {
		if !errors.Is(err, syscall.EEXIST) {
			fs.dropLong(ctx, lp, long)
		}
		return a, err
	}
	iv := make([]byte, dirIVSize)
	if _, err := io.ReadFull(fs.rand, iv); err != nil {
		fs.Lower.Rmdir(ctx, lp)
		fs.dropLong(ctx, lp, long)
		return layer.Attr{}, randErr(err)
	}
	// Synced before mkdir returns, so before any entry in the directory
	// can exist: every name in it depends on the IV, and the lower file
	// system may make an entry durable (a journal commit) before the data
	// of a file written earlier (delayed allocation).
	if err := writeNew(ctx, fs.Lower, layer.Join(lp, dirIVName), ivFile(fs.ivKey, iv), 0o444, true); err != nil {
		fs.Lower.Rmdir(ctx, lp)
		fs.dropLong(ctx, lp, long)
		return layer.Attr{}, err
	}
	// Take back only the owner bits added above: the rest is the lower's
	// (the caller's umask or a default ACL, a set-group-ID directory's bit).
	if extra := a.Mode & 0o300 &^ mode; extra != 0 {
		if a, err = fs.Lower.Setattr(ctx, lp, &layer.SetAttr{Valid: layer.SetMode, Mode: a.Mode & 0o7777 &^ extra}); err != nil {
			return a, err
		}
	}
	if fs.cache.addDir(path, lp, iv, &a, gen); fs.cache.generation() != gen {
		fs.cache.drop(path) // an ancestor moved meanwhile
	}
	return a, nil
}

func (fs *FS) Rmdir(ctx context.Context, path string) error {
	lp, _, long, err := fs.lowerEntry(ctx, path)
	if err != nil {
		return err
	}
	restore, err := fs.emptyOwn(ctx, path, lp) // ENOTDIR for a file
	if err != nil {
		return err
	}
	if err := fs.Lower.Rmdir(ctx, lp); err != nil {
		restore()
		return err
	}
	fs.cache.drop(path)
	fs.dropLong(ctx, lp, long)
	return nil
}

// emptyOwn prepares the directory at lower path lp, which must hold nothing
// but the layer's own files, for its removal (rmdir, or a rename over it):
// it removes those files (the IV file last) and returns a function that
// puts the IV back, for when the removal fails. Anything else in the
// directory gives ENOTEMPTY and changes nothing. The kernel holds the
// directory's lock during rmdir and rename, so no entry can appear through
// the layer meanwhile; a crash between this and the removal leaves an empty
// directory without an IV file, which readIV repairs.
func (fs *FS) emptyOwn(ctx context.Context, path, lp string) (restore func(), err error) {
	ents, err := fs.Lower.ReadDir(ctx, lp, false)
	if err != nil {
		return nil, err
	}
	var sides []string
	for _, e := range ents {
		switch {
		case e.Name == dirIVName:
		case isSide(e.Name) && !hasEntry(ents, strings.TrimSuffix(e.Name, longSuffix)):
			sides = append(sides, e.Name) // left by a crash before its entry was made
		default:
			return nil, syscall.ENOTEMPTY
		}
	}
	ivPath := layer.Join(lp, dirIVName)
	var iv []byte
	if d := fs.cachedDir(ctx, path); d != nil && d.lower == lp {
		iv = d.iv
	} else if b, err := layer.ReadFile(ctx, fs.Lower, ivPath); err == nil {
		iv, _ = checkIV(fs.ivKey, b)
	}
	for _, s := range sides {
		if err := fs.Lower.Unlink(ctx, layer.Join(lp, s)); err != nil && !errors.Is(err, syscall.ENOENT) {
			return nil, err
		}
	}
	if err := fs.Lower.Unlink(ctx, ivPath); err != nil && !errors.Is(err, syscall.ENOENT) {
		return nil, err
	}
	return func() {
		// As the daemon, not the caller: the caller may not be allowed
		// to create files in the directory it tried to remove.
		if iv != nil {
			writeNew(context.Background(), fs.Lower, ivPath, ivFile(fs.ivKey, iv), 0o444, true)
		}
	}, nil
}

func hasEntry(ents []layer.DirEntry, name string) bool {
	for _, e := range ents {
		if e.Name == name {
			return true
		}
	}
	return false
}

// --- other objects ---

func (fs *FS) Mknod(ctx context.Context, path string, mode uint32, rdev uint64) (layer.Attr, error) {
	return fs.make(ctx, path, func(lp string) (layer.Attr, error) { return fs.Lower.Mknod(ctx, lp, mode, rdev) })
}

// make creates an entry with mk, handling a long name.
func (fs *FS) make(ctx context.Context, path string, mk func(lp string) (layer.Attr, error)) (layer.Attr, error) {
	lp, _, long, err := fs.lowerEntry(ctx, path)
	if err != nil {
		return layer.Attr{}, err
	}
	if err := fs.writeLong(ctx, lp, long); err != nil {
		return layer.Attr{}, err
	}
	a, err := mk(lp)
	if err != nil {
		if !errors.Is(err, syscall.EEXIST) {
			fs.dropLong(ctx, lp, long)
		}
		return a, err
	}
	fs.fixAttr(&a)
	fs.fixLink(ctx, lp, &a)
	return a, nil
}

const symlinkAAD = "cairn-crypt v1 symlink"

func (fs *FS) Symlink(ctx context.Context, target, path string) (layer.Attr, error) {
	if len(target) >= unix.PathMax {
		return layer.Attr{}, syscall.ENAMETOOLONG
	}
	nonce := make([]byte, fs.meta.NonceSize())
	if _, err := io.ReadFull(fs.rand, nonce); err != nil {
		return layer.Attr{}, randErr(err)
	}
	enc := b64.EncodeToString(fs.meta.Seal(nonce, nonce, []byte(target), []byte(symlinkAAD)))
	if len(enc) < unix.PathMax {
		return fs.make(ctx, path, func(lp string) (layer.Attr, error) { return fs.Lower.Symlink(ctx, enc, lp) })
	}
	// Too long for a lower symlink: the encrypted target goes to a file of
	// its own, named by its hash, and the symlink names that file.
	// The directory and file are the daemon's, not the caller's: every
	// user's long symlinks go there.
	ltarget, store := longLink(len(target), enc)
	daemon := context.Background()
	if _, err := fs.Lower.Mkdir(daemon, longLinkDir, 0o700); err != nil && !errors.Is(err, syscall.EEXIST) {
		return layer.Attr{}, err
	}
	if err := writeNew(daemon, fs.Lower, store, []byte(enc), 0o444, true); err != nil {
		return layer.Attr{}, err
	}
	a, err := fs.make(ctx, path, func(lp string) (layer.Attr, error) { return fs.Lower.Symlink(ctx, ltarget, lp) })
	if err != nil {
		fs.Lower.Unlink(ctx, store)
		return a, err
	}
	a.Size = uint64(len(target))
	return a, nil
}

// fixLink gives a symlink whose target is in a file of its own (see
// longLink) its plaintext size, which its lower size does not tell.
func (fs *FS) fixLink(ctx context.Context, lp string, a *layer.Attr) {
	if a.IsSymlink() && a.Size == uint64(longLinkSize) {
		if t, err := fs.Lower.Readlink(ctx, lp); err == nil {
			if n, _, ok := parseLongLink(t); ok {
				a.Size = uint64(n)
			}
		}
	}
}

// dropLongLink removes the target file of the symlink at lp if the symlink
// is about to lose its last name (the kernel holds the inode's lock during
// unlink and rename, so no link can be added meanwhile); call it before
// the removal, and the function it returns after it succeeded.
func (fs *FS) dropLongLink(ctx context.Context, lp string) func() {
	a, err := fs.Lower.Getattr(ctx, lp)
	if err != nil || !a.IsSymlink() || a.Size != uint64(longLinkSize) || a.Nlink > 1 {
		return func() {}
	}
	t, err := fs.Lower.Readlink(ctx, lp)
	if err != nil {
		return func() {}
	}
	_, store, ok := parseLongLink(t)
	if !ok {
		return func() {}
	}
	return func() { fs.Lower.Unlink(ctx, store) }
}

func (fs *FS) Readlink(ctx context.Context, path string) (string, error) {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return "", err
	}
	enc, err := fs.Lower.Readlink(ctx, lp)
	if err != nil {
		return "", err
	}
	size := -1
	if n, store, ok := parseLongLink(enc); ok {
		f, err := fs.Lower.Open(ctx, store, unix.O_RDONLY|unix.O_NOFOLLOW)
		if errors.Is(err, syscall.ENOENT) {
			return "", corruptf("/"+path, "symlink %s has no target file %s", lp, store)
		}
		if err != nil {
			return "", err
		}
		b := make([]byte, maxLongLink+1)
		k, err := readFull(ctx, f, b, 0)
		f.Release(ctx)
		if err != nil {
			return "", err
		}
		if _, want, _ := parseLongLink(longLinkTarget(n, string(b[:k]))); want != store {
			return "", corruptf("/"+path, "symlink %s does not match its target file %s", lp, store)
		}
		enc, size = string(b[:k]), n
	}
	b, err := b64.DecodeString(enc)
	ns := fs.meta.NonceSize()
	if err == nil && len(b) >= ns+fs.meta.Overhead() && b64.EncodeToString(b) == enc {
		var t []byte
		if t, err = fs.meta.Open(nil, b[:ns], b[ns:], []byte(symlinkAAD)); err == nil && (size < 0 || size == len(t)) {
			return string(t), nil
		}
	}
	return "", corruptf("/"+path, "symlink target of %s does not authenticate", lp)
}

func (fs *FS) Link(ctx context.Context, oldpath, newpath string) (layer.Attr, error) {
	olp, err := fs.lowerPath(ctx, oldpath)
	if err != nil {
		return layer.Attr{}, err
	}
	return fs.make(ctx, newpath, func(lp string) (layer.Attr, error) { return fs.Lower.Link(ctx, olp, lp) })
}

func (fs *FS) Unlink(ctx context.Context, path string) error {
	lp, _, long, err := fs.lowerEntry(ctx, path)
	if err != nil {
		return err
	}
	dropTarget := fs.dropLongLink(ctx, lp)
	if err := fs.Lower.Unlink(ctx, lp); err != nil {
		return err
	}
	dropTarget()
	fs.dropLong(ctx, lp, long)
	return nil
}

func (fs *FS) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	olp, _, olong, err := fs.lowerEntry(ctx, oldpath)
	if err != nil {
		return err
	}
	nlp, _, nlong, err := fs.lowerEntry(ctx, newpath)
	if err != nil {
		return err
	}
	exchange := flags&layer.RenameExchange != 0
	if !exchange {
		if err := fs.writeLong(ctx, nlp, nlong); err != nil {
			return err
		}
	}
	dropTarget := func() {}
	if !exchange {
		dropTarget = fs.dropLongLink(ctx, nlp) // a symlink replaced
	}
	err = fs.Lower.Rename(ctx, olp, nlp, flags)
	if (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)) && !exchange && flags&layer.RenameNoreplace == 0 {
		// The target may be a directory that holds only its IV.
		restore, eerr := fs.emptyOwn(ctx, newpath, nlp)
		if eerr != nil {
			return eerr
		}
		if err = fs.Lower.Rename(ctx, olp, nlp, flags); err != nil {
			restore()
		}
	}
	if err != nil {
		return err
	}
	if olp != nlp {
		dropTarget()
	}
	// A directory moved (or replaced) takes its IV along: forget the
	// cached paths below both names.
	fs.cache.drop(oldpath)
	fs.cache.drop(newpath)
	// The old name's side file goes with its entry, unless a whiteout
	// now stands under that name.
	if !exchange && olp != nlp && flags&layer.RenameWhiteout == 0 {
		fs.dropLong(ctx, olp, olong)
	}
	return nil
}

func (fs *FS) Statfs(ctx context.Context, path string) (layer.Statfs, error) {
	s, err := fs.Lower.Statfs(ctx, "")
	if err != nil {
		return s, err
	}
	s.NameLen = 255 // long names are stored in their hashed form
	return s, nil
}

func (fs *FS) SyncDir(ctx context.Context, path string) error {
	d, err := fs.dir(ctx, path)
	if err != nil {
		return err
	}
	return fs.Lower.SyncDir(ctx, d.lower)
}

// --- finding objects by identity (file handles of the mount) ---

// Handle is layer.Finder's: the lower's, of the object's lower path.
func (fs *FS) Handle(ctx context.Context, path string, id layer.ID) ([]byte, error) {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return nil, err
	}
	return layer.Handle(ctx, fs.Lower, lp, id)
}

// Find is layer.Finder's: the lower finds the object and its names are
// decrypted, a directory at a time. A file of the layer's own is no object
// of the stack (ESTALE).
func (fs *FS) Find(ctx context.Context, id layer.ID, h []byte) (string, error) {
	lp, err := layer.Find(ctx, fs.Lower, id, h)
	if err != nil || lp == "" {
		return "", err
	}
	p := ""
	for _, lname := range strings.Split(lp, "/") {
		if isOwn(lname) {
			return "", syscall.ESTALE
		}
		d, err := fs.dir(ctx, p)
		if err != nil {
			return "", err
		}
		name, err := fs.decName(ctx, p, d, lname)
		if err != nil {
			return "", err
		}
		p = layer.Join(p, name)
	}
	return p, nil
}
