package union

import (
	"context"
	"errors"
	"io"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// copyUp makes o, found at path, changeable: if its branch is read-only it
// is copied to the first RW branch before it, with its directories, and
// that branch is returned. A file's copy is made at a temporary name and
// renamed into place, so that a crash leaves the old object or the whole
// new one, never a part.
func (u *FS) copyUp(ctx context.Context, path string, o *obj) (int, error) {
	t := o.top()
	i, err := u.upper(t)
	if err != nil || i == t {
		return i, err
	}
	dir, _ := layer.Split(path)
	if err := u.ensureDir(ctx, i, dir); err != nil {
		return -1, err
	}
	if o.a.IsDir() {
		return i, u.ensureDir(ctx, i, path)
	}
	self := layer.AsSelf(ctx)
	src, dst := u.b[t].FS, u.b[i].FS
	a, err := src.Getattr(self, path)
	if err != nil {
		return -1, err
	}
	indexed := a.IsRegular() && a.Nlink > 1
	idx, k := indexName(o.a.ID()), counts{kind: idxCopy, l: a.Nlink}
	if indexed {
		// Another name of the file may have been copied up meanwhile.
		if linked, err := u.linkUp(ctx, path, o); err != nil || linked {
			return i, err
		}
		// Names hidden before: the placeholder's count goes on.
		if pk, err := u.indexCounts(ctx, i, idx); err == nil && pk.kind == idxPlaceholder && pk.ok {
			k.l, k.c = pk.l, pk.c
		}
	}
	tmp := u.tmpName(path)
	switch {
	case a.IsRegular():
		err = copyData(self, src, dst, path, tmp, &a)
	case a.IsSymlink():
		var target string
		if target, err = src.Readlink(self, path); err == nil {
			_, err = dst.Symlink(self, target, tmp)
		}
	default:
		_, err = dst.Mknod(self, tmp, a.Mode&(unix.S_IFMT|0o7777), a.Rdev)
	}
	if err == nil {
		err = copyMeta(self, src, dst, path, tmp, &a)
	}
	if err == nil {
		// The copy keeps the original's identity (see origin).
		v := encodeID(o.a.ID())
		if indexed {
			v = countsValue(o.a.ID(), k) // this name counted once it is the copy's
		}
		err = u.meta[i].Set(self, tmp, "origin", v)
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.EPERM) && a.IsSymlink() {
			err = nil // no side data here: the copy has an identity of its own
		}
	}
	inIndex := false
	if err == nil && indexed {
		inIndex, err = u.index(ctx, i, tmp, idx)
	}
	if err == nil {
		u.markImpure(ctx, i, dir)
		err = dst.Rename(self, tmp, path, 0)
	}
	if err != nil {
		u.remove(ctx, i, tmp)
		u.log.Error("union: copy-up failed", "path", path, "from branch", t+1, "to branch", i+1, "err", err)
		return -1, err
	}
	if inIndex {
		u.ended(ctx, i, o.a.ID(), 0) // the copied name is the copy's now
	}
	return i, nil
}

// index links the copy tmp of branch i at idx in the index, in place of a
// placeholder if there is one; false if another copy is there (made
// meanwhile through another name).
func (u *FS) index(ctx context.Context, i int, tmp, idx string) (bool, error) {
	self := layer.AsSelf(ctx)
	dst := u.b[i].FS
	if _, err := dst.Mkdir(self, indexDir, 0o700); err != nil && !errors.Is(err, syscall.EEXIST) {
		return false, err
	}
	u.imu.Lock()
	defer u.imu.Unlock()
	_, err := dst.Link(self, tmp, idx)
	if !errors.Is(err, syscall.EEXIST) {
		return err == nil, err
	}
	if k, _ := u.indexCounts(ctx, i, idx); k.kind == idxCopy {
		return false, nil
	}
	// A placeholder (or one a crash left without its count): replaced.
	itmp := layer.Join(indexDir, lastName(u.tmpName(tmp)))
	if _, err := dst.Link(self, tmp, itmp); err != nil {
		return false, err
	}
	if err := dst.Rename(self, itmp, idx, 0); err != nil {
		dst.Unlink(self, itmp)
		return false, err
	}
	return true, nil
}

// copyData copies a regular file's bytes to a new file tmp, keeping holes.
func copyData(ctx context.Context, src, dst layer.FS, path, tmp string, a *layer.Attr) error {
	in, err := src.Open(ctx, path, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	defer in.Release(ctx)
	out, _, err := dst.Create(ctx, tmp, unix.O_WRONLY|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	size := int64(a.Size)
	ifd, ofd := fdOf(in), fdOf(out)
	defer closeFd(ifd)
	defer closeFd(ofd)
	err = copyRanges(ctx, in, out, ifd, ofd, size)
	if err == nil {
		_, err = out.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)})
	}
	if err == nil {
		err = out.Fsync(ctx, false)
	}
	if rerr := out.Release(ctx); err == nil {
		err = rerr
	}
	return err
}

// fdOf is a descriptor of f's lower file when f's bytes are exactly that
// file's (layer.CapPassthrough: a file of a bottom layer, or of layers that
// change no data over one), else -1.
func fdOf(f layer.File) int {
	if f.Caps()&layer.CapPassthrough == 0 {
		return -1
	}
	if fd, ok := f.PassthroughFd(); ok {
		return fd
	}
	return -1
}

func closeFd(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// copyRanges copies the data of in (not its holes) to out: in the kernel
// (copy_file_range) when both have descriptors (ifd, ofd >= 0), by reads
// and writes otherwise or where the kernel cannot (two file systems of
// different kinds).
func copyRanges(ctx context.Context, in, out layer.File, ifd, ofd int, size int64) error {
	var buf []byte
	for off := int64(0); off < size; {
		data, err := in.Lseek(ctx, off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			return nil // a hole to the end
		}
		if err != nil {
			data = off // no SEEK_DATA: copy everything
		}
		end, err := in.Lseek(ctx, data, unix.SEEK_HOLE)
		if err != nil || end > size {
			end = size
		}
		p := data
		for ifd >= 0 && ofd >= 0 && p < end {
			q := p
			n, err := copyFileRange(ifd, &p, ofd, &q, int(min(end-p, 1<<30)), 0)
			if err != nil {
				if errors.Is(err, syscall.EINTR) {
					continue
				}
				if !errors.Is(err, syscall.EXDEV) && !errors.Is(err, syscall.EINVAL) &&
					!errors.Is(err, syscall.EOPNOTSUPP) && !errors.Is(err, syscall.ENOSYS) {
					return err
				}
				ifd = -1 // the kernel cannot: copy by hand from p
				break
			}
			if n == 0 {
				return nil // shorter than it said: what is there is copied
			}
		}
		if p < end && buf == nil {
			buf = make([]byte, 1<<20)
		}
		for p < end {
			n, err := in.ReadAt(ctx, buf[:min(int64(len(buf)), end-p)], p)
			if n > 0 {
				w, werr := out.WriteAt(ctx, buf[:n], p)
				if werr == nil && w != n {
					werr = io.ErrShortWrite
				}
				if werr != nil {
					return werr
				}
				p += int64(n)
			}
			if err == io.EOF || n == 0 && err == nil {
				return nil // shorter than it said: what is there is copied
			}
			if err != nil && err != io.EOF {
				return err
			}
		}
		off = end
	}
	return nil
}

// copyMeta gives tmp path's owner, mode, xattrs and times (in that order:
// a chown clears set-id bits, and every change sets the change time).
func copyMeta(ctx context.Context, src, dst layer.FS, path, tmp string, a *layer.Attr) error {
	if err := copyXattrs(ctx, src, dst, path, tmp); err != nil {
		return err
	}
	in := &layer.SetAttr{Valid: layer.SetUid | layer.SetGid, Uid: a.Uid, Gid: a.Gid}
	if _, err := dst.Setattr(ctx, tmp, in); err != nil {
		return err
	}
	if !a.IsSymlink() {
		if _, err := dst.Setattr(ctx, tmp, &layer.SetAttr{Valid: layer.SetMode, Mode: a.Mode & 0o7777}); err != nil {
			return err
		}
	}
	_, err := dst.Setattr(ctx, tmp, &layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime, Atime: a.Atime, Mtime: a.Mtime})
	if a.IsSymlink() && errors.Is(err, syscall.EOPNOTSUPP) {
		err = nil
	}
	return err
}

// copyXattrs copies the extended attributes but overlayfs's own.
func copyXattrs(ctx context.Context, src, dst layer.FS, path, tmp string) error {
	n, err := src.Listxattr(ctx, path, nil)
	if err != nil || n == 0 {
		if errors.Is(err, syscall.EOPNOTSUPP) {
			err = nil
		}
		return err
	}
	list := make([]byte, n)
	if n, err = src.Listxattr(ctx, path, list); err != nil {
		return err
	}
	for _, name := range strings.Split(string(list[:n]), "\x00") {
		if name == "" || strings.HasPrefix(name, xattrPrefix) || strings.Contains(name, ".cairn.union.") {
			continue
		}
		vn, err := src.Getxattr(ctx, path, name, nil)
		if err != nil {
			continue // gone meanwhile
		}
		v := make([]byte, vn)
		if vn, err = src.Getxattr(ctx, path, name, v); err != nil {
			continue
		}
		if err := dst.Setxattr(ctx, tmp, name, v[:vn], 0); err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
			return err
		}
	}
	return nil
}

// ensureDir makes directory path exist on branch i, copying up each
// missing directory of the way with its owner, mode, xattrs and times
// (made at a temporary name and renamed into place).
func (u *FS) ensureDir(ctx context.Context, i int, path string) error {
	u.mu.Lock()
	br, known := u.dirs[path]
	u.mu.Unlock()
	if known && contains(br, i) {
		return nil // a part of the directory is there
	}
	self := layer.AsSelf(ctx)
	if a, err := u.b[i].FS.Getattr(self, path); err == nil {
		if !a.IsDir() {
			return syscall.ENOTDIR
		}
		return nil
	} else if !notFound(err) {
		return err
	}
	parent, _ := layer.Split(path)
	if path == "" {
		return syscall.ENOENT
	}
	if err := u.ensureDir(ctx, i, parent); err != nil {
		return err
	}
	o, err := u.resolve(ctx, path)
	if err != nil {
		return err
	}
	if !o.a.IsDir() {
		return syscall.ENOTDIR
	}
	src, dst := u.b[o.top()].FS, u.b[i].FS
	a, err := src.Getattr(self, path)
	if err != nil {
		return err
	}
	tmp := u.tmpName(path)
	if _, err := dst.Mkdir(self, tmp, 0o700); err != nil {
		return err
	}
	err = copyMeta(self, src, dst, path, tmp, &a)
	if err == nil {
		// The directory keeps its identity too (see origin).
		if err = u.meta[i].Set(self, tmp, "origin", encodeID(o.a.ID())); errors.Is(err, syscall.EOPNOTSUPP) {
			err = nil
		}
		u.markImpure(ctx, i, parent)
	}
	if err == nil {
		err = dst.Rename(self, tmp, path, 0)
	}
	if err != nil {
		dst.Rmdir(self, tmp)
		if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
			return nil // made by another copy-up meanwhile
		}
		return err
	}
	u.forget(path)
	return nil
}
