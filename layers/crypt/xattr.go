package crypt

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"syscall"

	"cairnfs.dev/cairn/layer"
)

// Extended attributes: the name is encrypted like a file name (AES-SIV with
// its own key and a fixed associated data instead of a directory IV) and
// stored in the lower's user namespace, or in its trusted namespace for a
// trusted.* name (ext4 refuses user.* on symlinks and device nodes, and
// trusted.* is for root only, above as below); the value is sealed with a
// random nonce and the lower name as associated data.
//
// POSIX ACLs (system.posix_acl_access and _default) are the exception: they
// are stored as they are, as the lower's own ACLs, so that the lower derives
// the mode from an access ACL and gives a new file or directory its parent's
// default ACL, as for every other layer. They say which users may do what,
// as the modes and owners do, which the lower shows too. An ACL that an
// older version stored encrypted is still read, and replaced at the next
// change.

const (
	xattrPrefix = "user."
	trustedNS   = "trusted."
	xattrAD     = "cairn-crypt v1 xattr name"
	xattrValAD  = "cairn-crypt v1 xattr value "
)

// namespaces are the xattr namespaces Linux knows: a name in none of them
// is refused as ext4 refuses it (EOPNOTSUPP), not stored encrypted.
var namespaces = []string{xattrPrefix, trustedNS, "security.", "system."}

func (fs *FS) xattrName(name string) (string, error) {
	if name == "" {
		return "", syscall.EINVAL
	}
	known := false
	for _, ns := range namespaces {
		known = known || strings.HasPrefix(name, ns)
	}
	if !known {
		return "", syscall.EOPNOTSUPP
	}
	fs.xmu.Lock()
	l, ok := fs.xnames[name]
	fs.xmu.Unlock()
	if !ok {
		ns := xattrPrefix
		if strings.HasPrefix(name, trustedNS) {
			ns = trustedNS
		}
		l = ns + fs.xattr.encrypt([]byte(xattrAD), name)
		fs.xmu.Lock()
		if len(fs.xnames) >= 1024 {
			clear(fs.xnames)
		}
		fs.xnames[name] = l
		fs.xmu.Unlock()
	}
	if len(l) > 255 {
		return "", syscall.ERANGE
	}
	return l, nil
}

// isACL reports whether name is a POSIX ACL, stored in the clear.
func isACL(name string) bool {
	return name == "system.posix_acl_access" || name == "system.posix_acl_default"
}

func (fs *FS) Getxattr(ctx context.Context, path, name string, dest []byte) (int, error) {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return 0, err
	}
	if isACL(name) {
		n, err := fs.Lower.Getxattr(ctx, lp, name, dest)
		if !errors.Is(err, layer.ENOATTR) {
			return n, err
		}
	}
	lname, err := fs.xattrName(name)
	if err != nil {
		return 0, err
	}
	raw, err := fs.getAll(func(b []byte) (int, error) { return fs.Lower.Getxattr(ctx, lp, lname, b) })
	if err != nil {
		return 0, err
	}
	ns := fs.meta.NonceSize()
	if len(raw) < ns+fs.meta.Overhead() {
		return 0, corruptf("/"+path, "extended attribute %s is too short", lname)
	}
	v, err := fs.meta.Open(nil, raw[:ns], raw[ns:], []byte(xattrValAD+lname))
	if err != nil {
		return 0, corruptf("/"+path, "extended attribute %s does not authenticate", lname)
	}
	if len(dest) == 0 {
		return len(v), nil
	}
	if len(dest) < len(v) {
		return len(v), syscall.ERANGE
	}
	return copy(dest, v), nil
}

// getAll calls a getxattr-style function with a large enough buffer.
func (fs *FS) getAll(get func([]byte) (int, error)) ([]byte, error) {
	for {
		n, err := get(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		b := make([]byte, n)
		m, err := get(b)
		if errors.Is(err, syscall.ERANGE) {
			continue // it grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		return b[:m], nil
	}
}

func (fs *FS) Setxattr(ctx context.Context, path, name string, value []byte, flags int) error {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return err
	}
	lname, err := fs.xattrName(name)
	if err != nil {
		return err
	}
	if isACL(name) {
		if err := fs.Lower.Setxattr(ctx, lp, name, value, flags); err != nil {
			return err
		}
		fs.Lower.Removexattr(ctx, lp, lname) // an encrypted one of an older version
		return nil
	}
	nonce := make([]byte, fs.meta.NonceSize())
	if _, err := io.ReadFull(fs.rand, nonce); err != nil {
		return randErr(err)
	}
	sealed := fs.meta.Seal(nonce, nonce, value, []byte(xattrValAD+lname))
	return fs.Lower.Setxattr(ctx, lp, lname, sealed, flags)
}

func (fs *FS) Removexattr(ctx context.Context, path, name string) error {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return err
	}
	lname, err := fs.xattrName(name)
	if err != nil {
		return err
	}
	if isACL(name) {
		err := fs.Lower.Removexattr(ctx, lp, name)
		if err2 := fs.Lower.Removexattr(ctx, lp, lname); err2 == nil {
			err = nil // an encrypted one of an older version
		}
		return err
	}
	return fs.Lower.Removexattr(ctx, lp, lname)
}

func (fs *FS) Listxattr(ctx context.Context, path string, dest []byte) (int, error) {
	lp, err := fs.lowerPath(ctx, path)
	if err != nil {
		return 0, err
	}
	raw, err := fs.getAll(func(b []byte) (int, error) { return fs.Lower.Listxattr(ctx, lp, b) })
	if err != nil {
		return 0, err
	}
	var out []byte
	acls := map[string]bool{}
	for _, l := range bytes.Split(raw, []byte{0}) {
		if isACL(string(l)) && !acls[string(l)] {
			acls[string(l)] = true
			out = append(append(out, l...), 0)
			continue
		}
		enc, ok := strings.CutPrefix(string(l), xattrPrefix)
		trusted := false
		if !ok {
			enc, trusted = strings.CutPrefix(string(l), trustedNS)
		}
		if !ok && !trusted {
			continue // not ours (a security label of the lower file system, say)
		}
		name, err := fs.xattr.decrypt([]byte(xattrAD), enc)
		if err == nil && trusted != strings.HasPrefix(name, trustedNS) {
			err = errName // moved between namespaces
		}
		if err != nil {
			return 0, corruptf("/"+path, "extended attribute name %s does not authenticate", l)
		}
		if isACL(name) {
			if acls[name] {
				continue // the lower's own ACL is listed
			}
			acls[name] = true
		}
		out = append(append(out, name...), 0)
	}
	if len(dest) == 0 {
		return len(out), nil
	}
	if len(dest) < len(out) {
		return len(out), syscall.ERANGE
	}
	return copy(dest, out), nil
}
