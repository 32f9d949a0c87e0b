package codec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// ConvertSummary is what Convert did.
type ConvertSummary struct {
	Files     int   // regular files found
	Converted int   // converted now
	Already   int   // in the wanted form already (empty files included)
	Skipped   int   // left as they are (hard links)
	Failed    int   // could not be converted (left as they were)
	Leftovers int   // files of an interrupted conversion, removed
	Before    int64 // bytes of the converted files in the lower (see held), before
	After     int64 // and after
}

// ConvertReport is one file that Convert did not convert (or, with
// Converted, did).
type ConvertReport struct {
	Path      string
	Converted bool
	Before    int64
	After     int64
	Msg       string // why it was skipped, or the error
	Err       error
}

// convertBlock is the unit of copying: a block of zeros is not written
// (the new file keeps the hole).
const convertBlock = 1 << 20

// Convert rewrites every regular file of the layer's lower directory in
// the layer's format (toPlain: every file of the layer as plain bytes),
// one at a time: each is written beside the old one under ConvertPrefix,
// with the old one's owner, mode, times and extended attributes, made
// durable, and renamed over it, so that a crash leaves either. Files of
// an interrupted run are removed first. A file with several hard links is
// skipped (a rename would split them). The layer must be claimed (no
// daemon serves it). progress is told the files and bytes done.
func (fs *FS) Convert(ctx context.Context, toPlain bool, progress func(files, total int, bytes, totalBytes int64, path string), report func(ConvertReport)) (ConvertSummary, error) {
	var sum ConvertSummary
	type item struct {
		path string
		size int64
	}
	var files []item
	var totalBytes int64
	var walk func(dir string) error
	walk = func(dir string) error {
		ents, err := fs.Lower.ReadDir(ctx, dir, false)
		if err != nil {
			return err
		}
		for _, e := range ents {
			p := layer.Join(dir, e.Name)
			switch {
			case strings.HasPrefix(e.Name, ConvertPrefix) && e.Mode&unix.S_IFMT == unix.S_IFREG:
				if err := fs.Lower.Unlink(ctx, p); err != nil {
					return fmt.Errorf("removing %s, left by an interrupted conversion: %w", p, err)
				}
				sum.Leftovers++
			case e.Mode&unix.S_IFMT == unix.S_IFDIR:
				if p == LostFound {
					continue
				}
				if err := walk(p); err != nil {
					return err
				}
			case p == LockName:
				// The claim's lock file (claim.go): the layer's own.
			case e.Mode&unix.S_IFMT == unix.S_IFREG:
				a, err := fs.Lower.Getattr(ctx, p)
				if err != nil {
					return err
				}
				files = append(files, item{p, int64(a.Size)})
				totalBytes += int64(a.Size)
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return sum, fmt.Errorf("listing the files of the %s layer: %w", fs.e.kind.Name, err)
	}
	sum.Files = len(files)
	// New files are written by an engine of their own without fast tails:
	// a file written whole is encoded whole (fast tails would keep its
	// last chunk, all of a small file, unencoded).
	w, err := NewEngine(fs.e.Lower, fs.e.kind.Name, Options{Level: fs.e.kind.DefaultLevel, ChunkSize: 1 << fs.e.shift, CompactMin: fs.e.compactMin, Logger: fs.e.logger})
	if err != nil {
		return sum, err
	}
	w.codec = fs.e.codec // its level
	defer w.Close()
	var done int64
	for i, it := range files {
		progress(i, len(files), done, totalBytes, it.path)
		rep := fs.convertFile(ctx, w, it.path, toPlain, func(n int64) {
			progress(i, len(files), done+n, totalBytes, it.path)
		})
		done += it.size
		switch {
		case rep.Converted:
			sum.Converted++
			sum.Before += rep.Before
			sum.After += rep.After
		case rep.Err != nil:
			sum.Failed++
		case rep.Msg != "":
			sum.Skipped++
		default:
			sum.Already++
			continue
		}
		report(rep)
	}
	progress(len(files), len(files), totalBytes, totalBytes, "")
	return sum, nil
}

// convertFile converts the file at p; n is told the bytes copied.
func (fs *FS) convertFile(ctx context.Context, w *Engine, p string, toPlain bool, n func(int64)) ConvertReport {
	rep := ConvertReport{Path: p}
	fail := func(err error) ConvertReport {
		rep.Err = err
		rep.Msg = err.Error()
		return rep
	}
	a, err := fs.Lower.Getattr(ctx, p)
	if err != nil {
		return fail(err)
	}
	if a.Size == 0 {
		return rep // both the layer's empty file and a plain one
	}
	src, err := layer.OpenNoAtime(ctx, fs.Lower, p, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return fail(err)
	}
	plain, err := IsPlain(ctx, src)
	if err != nil {
		src.Release(ctx)
		return fail(err)
	}
	if plain == toPlain {
		src.Release(ctx)
		return rep
	}
	if a.Nlink > 1 {
		src.Release(ctx)
		rep.Msg = fmt.Sprintf("skipped: it has %d hard links, which converting would split (convert it through a mount: copy it and rename the copy over each name)", a.Nlink)
		return rep
	}
	if toPlain {
		src.Release(ctx)
		// Through the engine: its bytes.
		if src, err = fs.e.Open(ctx, p, p, unix.O_RDONLY|unix.O_NOFOLLOW); err != nil {
			return fail(err)
		}
		defer fs.e.Forget(ctx, a.ID()) // its state, after the rename
	}
	defer src.Release(ctx)
	size := int64(a.Size)
	if toPlain {
		sa, err := src.Getattr(ctx)
		if err != nil {
			return fail(err)
		}
		size = int64(sa.Size)
	}
	dir, _ := layer.Split(p)
	tmp := layer.Join(dir, fmt.Sprintf("%s%d", ConvertPrefix, a.Ino))
	fs.Lower.Unlink(ctx, tmp)
	if err := fs.writeConverted(ctx, w, src, tmp, size, toPlain, n); err != nil {
		fs.Lower.Unlink(ctx, tmp)
		return fail(err)
	}
	if err := layer.CopyMeta(ctx, fs.Lower, p, tmp, &a, nil); err != nil {
		fs.Lower.Unlink(ctx, tmp)
		return fail(err)
	}
	if b, err := fs.Lower.Getattr(ctx, p); err != nil || b.ID() != a.ID() {
		fs.Lower.Unlink(ctx, tmp)
		return fail(errors.New("replaced while it was converted"))
	}
	if err := fs.Lower.Rename(ctx, tmp, p, 0); err != nil {
		fs.Lower.Unlink(ctx, tmp)
		return fail(err)
	}
	if err := fs.Lower.SyncDir(ctx, dir); err != nil {
		return fail(fmt.Errorf("converted, but the directory could not be synced: %w", err))
	}
	b, err := fs.Lower.Getattr(ctx, p)
	if err != nil {
		return fail(err)
	}
	rep.Converted, rep.Before, rep.After = true, held(&a), held(&b)
	return rep
}

// writeConverted writes size bytes of src into the new file tmp: through
// the engine, or plain. Blocks of zeros stay holes.
func (fs *FS) writeConverted(ctx context.Context, w *Engine, src layer.File, tmp string, size int64, toPlain bool, n func(int64)) error {
	var dst layer.File
	var err error
	if toPlain {
		dst, _, err = fs.Lower.Create(ctx, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
	} else {
		dst, _, err = w.Create(ctx, tmp, tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o600)
	}
	if err != nil {
		return err
	}
	buf := make([]byte, convertBlock)
	for off := int64(0); off < size; {
		k, rerr := src.ReadAt(ctx, buf[:min(int64(len(buf)), size-off)], off)
		if k > 0 && !allZero(buf[:k]) {
			if w, err := dst.WriteAt(ctx, buf[:k], off); err != nil || w < k {
				dst.Release(ctx)
				if err == nil {
					err = io.ErrShortWrite
				}
				return err
			}
		}
		off += int64(k)
		n(off)
		if rerr == io.EOF || (rerr == nil && k == 0) {
			if off < size {
				dst.Release(ctx)
				return fmt.Errorf("the file shrank while it was converted (%d bytes of %d)", off, size)
			}
			break
		}
		if rerr != nil {
			dst.Release(ctx)
			return rerr
		}
	}
	// A hole at the end.
	if _, err := dst.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)}); err != nil {
		dst.Release(ctx)
		return err
	}
	if err := dst.Fsync(ctx, false); err != nil {
		dst.Release(ctx)
		return err
	}
	if err := dst.Release(ctx); err != nil {
		return err
	}
	if !toPlain {
		// Let go of the new file: the layer's engine serves it from now.
		if a, err := w.Lower.Getattr(ctx, tmp); err == nil {
			w.Forget(ctx, a.ID())
		}
	}
	return nil
}

// held is what a file holds: its size, or the space its blocks take if
// that is less (a sparse file).
func held(a *layer.Attr) int64 { return min(int64(a.Size), int64(a.Blocks)*512) }

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
