package layer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ReadFile reads a whole file of fs (in-process use).
func ReadFile(ctx context.Context, fs FS, path string) ([]byte, error) {
	f, err := fs.Open(ctx, path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Release(ctx)
	var out []byte
	buf := make([]byte, 128<<10)
	for {
		n, err := f.ReadAt(ctx, buf, int64(len(out)))
		out = append(out, buf[:n]...)
		if err == io.EOF || (err == nil && n == 0) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// WriteFile creates or truncates path and writes data to it.
func WriteFile(ctx context.Context, fs FS, path string, data []byte, mode uint32) error {
	f, _, err := fs.Create(ctx, path, unix.O_WRONLY|unix.O_TRUNC, mode)
	if errors.Is(err, syscall.EEXIST) {
		f, err = fs.Open(ctx, path, unix.O_WRONLY|unix.O_TRUNC)
	}
	if err != nil {
		return err
	}
	for off := 0; off < len(data); {
		n, err := f.WriteAt(ctx, data[off:], int64(off))
		if err != nil {
			f.Release(ctx)
			return err
		}
		off += n
	}
	if err := f.Flush(ctx); err != nil {
		f.Release(ctx)
		return err
	}
	return f.Release(ctx)
}

// MkdirAll creates path and its missing parents.
func MkdirAll(ctx context.Context, fs FS, path string, mode uint32) error {
	if path == "" {
		return nil
	}
	a, err := fs.Getattr(ctx, path)
	if err == nil {
		if !a.IsDir() {
			return syscall.ENOTDIR
		}
		return nil
	}
	dir, _ := Split(path)
	if err := MkdirAll(ctx, fs, dir, mode); err != nil {
		return err
	}
	if _, err := fs.Mkdir(ctx, path, mode); err != nil && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	return nil
}

// CopyMeta gives the file at to the extended attributes of the file at from
// (but those skip names, if skip is set), then a's owner, mode and times,
// and makes it durable: what a layer that rewrites a file beside itself and
// renames it over (a conversion) keeps of the old one. The mode comes after
// the owner (chown clears set-id bits), the times last.
func CopyMeta(ctx context.Context, fs FS, from, to string, a *Attr, skip func(name string) bool) error {
	n, err := fs.Listxattr(ctx, from, nil)
	if err != nil && err != syscall.EOPNOTSUPP {
		return err
	}
	if err == nil && n > 0 {
		list := make([]byte, n+256)
		if n, err = fs.Listxattr(ctx, from, list); err != nil {
			return err
		}
		for _, name := range strings.Split(string(list[:n]), "\x00") {
			if name == "" || skip != nil && skip(name) {
				continue
			}
			sz, err := fs.Getxattr(ctx, from, name, nil)
			if err != nil {
				return err
			}
			v := make([]byte, sz)
			if sz, err = fs.Getxattr(ctx, from, name, v); err != nil {
				return err
			}
			if err := fs.Setxattr(ctx, to, name, v[:sz], 0); err != nil {
				return fmt.Errorf("extended attribute %s: %w", name, err)
			}
		}
	}
	if _, err := fs.Setattr(ctx, to, &SetAttr{Valid: SetUid | SetGid, Uid: a.Uid, Gid: a.Gid}); err != nil {
		return err
	}
	if _, err := fs.Setattr(ctx, to, &SetAttr{Valid: SetMode | SetAtime | SetMtime,
		Mode: a.Mode & 0o7777, Atime: a.Atime, Mtime: a.Mtime}); err != nil {
		return err
	}
	f, err := fs.Open(ctx, to, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	err = f.Fsync(ctx, false)
	f.Release(ctx)
	return err
}
