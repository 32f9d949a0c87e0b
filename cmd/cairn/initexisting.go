package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/local"
)

// Encrypting a directory that holds files (cairn init over a non-empty
// lower): the files are copied, encrypted, into a new directory beside it,
// DIR.cairn-init, which is then exchanged with DIR in one rename
// (RENAME_EXCHANGE), and the plain files are kept as DIR.plain-TIME for
// the user to remove. A run that stops before the exchange leaves
// DIR.cairn-init, which the next run removes (it holds the volume's
// config, so it cannot be the plain files); DIR is untouched until then.

// initSuffix names the directory an encryption of existing files writes.
const initSuffix = ".cairn-init"

// isEmptyDir reports whether the layer's root has no entries.
func isEmptyDir(ctx context.Context, l layer.FS) (bool, error) {
	ents, err := l.ReadDir(ctx, "", false)
	return len(ents) == 0, err
}

// initExisting encrypts the files of dir into a new volume and puts it in
// dir's place; it returns the master key and where the plain files are.
func initExisting(dir string, p crypt.InitParams, pass []byte, stderr io.Writer) ([]byte, string, error) {
	ctx := context.Background()
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, "", err
	}
	work := dir + initSuffix
	if _, err := os.Lstat(work); err == nil {
		if _, err := os.Lstat(filepath.Join(work, crypt.ConfigName)); err != nil {
			return nil, "", fmt.Errorf("%s is there and is not an encryption that stopped (it has no %s): it may hold your plain files; look at it, and move it away", work, crypt.ConfigName)
		}
		fmt.Fprintf(stderr, "cairn init: removing %s, left by an encryption that stopped\n", work)
		if err := os.RemoveAll(work); err != nil {
			return nil, "", err
		}
	}
	if err := os.Mkdir(work, fi.Mode().Perm()); err != nil {
		return nil, "", err
	}
	fail := func(err error) ([]byte, string, error) {
		os.RemoveAll(work)
		return nil, "", err
	}
	nl, err := local.New(work)
	if err != nil {
		return fail(err)
	}
	defer nl.Close()
	master, err := crypt.Init(ctx, nl, p, pass)
	if err != nil {
		return fail(err)
	}
	cfg, err := crypt.ReadConfig(ctx, nl)
	if err != nil {
		return fail(err)
	}
	cfs, err := crypt.New(nl, cfg, master, crypt.Options{})
	if err != nil {
		return fail(err)
	}
	defer cfs.Close()
	// What there is to do, for the progress bar.
	var total, totalBytes int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if i, err := d.Info(); err == nil {
				total++
				totalBytes += i.Size()
			}
		}
		return nil
	})
	bar := newProgress(stderr, "init", "files", total, totalBytes)
	c := &encrypter{ctx: ctx, src: dir, dst: cfs, links: map[[2]uint64]string{}, bar: bar}
	err = c.tree()
	bar.done()
	if err != nil {
		return fail(err)
	}
	// Durable before it takes dir's place.
	unix.Sync()
	if err := exchange(work, dir); err != nil {
		return fail(fmt.Errorf("exchanging %s and %s: %w", work, dir, err))
	}
	kept := dir + ".plain-" + time.Now().UTC().Format("20060102T150405")
	if err := os.Rename(work, kept); err != nil {
		return master, work, nil // the volume is in place; the plain files stay where they are
	}
	if d, err := os.Open(filepath.Dir(dir)); err == nil {
		d.Sync()
		d.Close()
	}
	return master, kept, nil
}

// encrypter copies a tree into a crypt layer.
type encrypter struct {
	ctx        context.Context
	src        string
	dst        layer.FS
	links      map[[2]uint64]string // hard-linked files copied: device and inode -> path
	bar        *progress
	files      int64
	bytes      int64
	dirs       []dirTimes
	buf        []byte
	xattrNames []byte
}

type dirTimes struct {
	path string
	st   unix.Stat_t
}

func (c *encrypter) tree() error {
	err := filepath.WalkDir(c.src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(c.src, p)
		if rel == "." {
			rel = ""
		}
		if err := c.one(p, rel); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Directories' times last (their entries changed them), deepest first.
	for i := len(c.dirs) - 1; i >= 0; i-- {
		d := c.dirs[i]
		if _, err := c.dst.Setattr(c.ctx, d.path, &layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime,
			Atime: d.st.Atim, Mtime: d.st.Mtim}); err != nil {
			return fmt.Errorf("%s: %w", d.path, err)
		}
	}
	return nil
}

// one copies the object at p (rel in the volume).
func (c *encrypter) one(p, rel string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	mode := st.Mode & unix.S_IFMT
	switch {
	case rel == "":
		// The root exists: its attributes only.
	case mode == unix.S_IFDIR:
		if _, err := c.dst.Mkdir(c.ctx, rel, uint32(st.Mode)&0o7777); err != nil {
			return err
		}
	case mode == unix.S_IFREG && st.Nlink > 1 && c.links[[2]uint64{uint64(st.Dev), st.Ino}] != "":
		_, err := c.dst.Link(c.ctx, c.links[[2]uint64{uint64(st.Dev), st.Ino}], rel)
		return err
	case mode == unix.S_IFREG:
		if err := c.file(p, rel, &st); err != nil {
			return err
		}
		if st.Nlink > 1 {
			c.links[[2]uint64{uint64(st.Dev), st.Ino}] = rel
		}
	case mode == unix.S_IFLNK:
		target, err := os.Readlink(p)
		if err != nil {
			return err
		}
		if _, err := c.dst.Symlink(c.ctx, target, rel); err != nil {
			return err
		}
		// A link's owner, as far as the lower allows; its mode is
		// always 777 and its times follow.
		c.dst.Setattr(c.ctx, rel, &layer.SetAttr{Valid: layer.SetUid | layer.SetGid, Uid: st.Uid, Gid: st.Gid})
		return nil
	default: // fifos, sockets, devices
		if _, err := c.dst.Mknod(c.ctx, rel, uint32(st.Mode), uint64(st.Rdev)); err != nil {
			return err
		}
	}
	if err := c.meta(p, rel, &st); err != nil {
		return err
	}
	if mode == unix.S_IFDIR {
		c.dirs = append(c.dirs, dirTimes{rel, st})
	}
	return nil
}

// file copies the bytes of the regular file p; blocks of zeros stay holes.
func (c *encrypter) file(p, rel string, st *unix.Stat_t) error {
	in, err := os.Open(p)
	if err != nil {
		return err
	}
	defer in.Close()
	out, _, err := c.dst.Create(c.ctx, rel, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if c.buf == nil {
		c.buf = make([]byte, 1<<20)
	}
	var off int64
	for {
		n, rerr := in.ReadAt(c.buf, off)
		if n > 0 && !allZeros(c.buf[:n]) {
			if w, err := out.WriteAt(c.ctx, c.buf[:n], off); err != nil || w < n {
				out.Release(c.ctx)
				if err == nil {
					err = io.ErrShortWrite
				}
				return err
			}
		}
		off += int64(n)
		c.bytes += int64(n)
		c.bar.update(c.files, c.bytes, rel)
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			out.Release(c.ctx)
			return rerr
		}
	}
	if _, err := out.Setattr(c.ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(off)}); err != nil {
		out.Release(c.ctx)
		return err
	}
	if err := out.Release(c.ctx); err != nil {
		return err
	}
	c.files++
	c.bar.update(c.files, c.bytes, rel)
	return nil
}

func allZeros(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// meta gives rel the extended attributes, owner, mode and times of p.
func (c *encrypter) meta(p, rel string, st *unix.Stat_t) error {
	n, err := unix.Llistxattr(p, nil)
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return err
	}
	if n > 0 {
		names := make([]byte, n+256)
		if n, err = unix.Llistxattr(p, names); err != nil {
			return err
		}
		for _, name := range strings.Split(string(names[:n]), "\x00") {
			if name == "" {
				continue
			}
			sz, err := unix.Lgetxattr(p, name, nil)
			if err != nil {
				return err
			}
			v := make([]byte, sz)
			if sz, err = unix.Lgetxattr(p, name, v); err != nil {
				return err
			}
			if err := c.dst.Setxattr(c.ctx, rel, name, v[:sz], 0); err != nil {
				return fmt.Errorf("extended attribute %s: %w", name, err)
			}
		}
	}
	if _, err := c.dst.Setattr(c.ctx, rel, &layer.SetAttr{Valid: layer.SetUid | layer.SetGid, Uid: st.Uid, Gid: st.Gid}); err != nil {
		return err
	}
	// The mode after the owner (chown clears set-id bits), then the times.
	_, err = c.dst.Setattr(c.ctx, rel, &layer.SetAttr{Valid: layer.SetMode | layer.SetAtime | layer.SetMtime, Mode: uint32(st.Mode) & 0o7777,
		Atime: st.Atim, Mtime: st.Mtim})
	return err
}
