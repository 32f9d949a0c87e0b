package pack

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Fsck checks every directory's packed files and packs (layer.Checker):
// each ref is read back and its CRC checked (a damaged one is reported,
// and stays: reading it gives EIO), a file that carries a ref and bytes of
// its own (an unpack a crash cut) is reported and, with a repair, made
// whole as an open would, and a pack no file refers to is reported and,
// with a repair, removed (it holds no file's bytes: nothing is dropped).
// A check packs nothing, then or at the layer's close.
func (fs *FS) Fsck(ctx context.Context, mode layer.CheckMode, progress func(done, total int, path string), report func(layer.FileReport)) (layer.CheckSummary, error) {
	fs.noPack()
	ctx = layer.AsSelf(ctx)
	var dirs []string
	var walk func(dir string) error
	walk = func(dir string) error {
		dirs = append(dirs, dir)
		ents, err := fs.Lower.ReadDir(ctx, dir, false)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if e.Mode&0o170000 == 0o040000 && !reservedName(e.Name) {
				if err := walk(layer.Join(dir, e.Name)); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return layer.CheckSummary{}, fmt.Errorf("listing the directories of the pack layer: %w", err)
	}
	var sum layer.CheckSummary
	files, damaged, problems, repaired := 0, 0, 0, 0
	for i, dir := range dirs {
		progress(i, len(dirs), dir)
		fr := fs.checkDir(ctx, dir, mode, &files)
		if fr.Text == "" {
			continue
		}
		if fr.Repaired {
			repaired++
		}
		if fr.Dropped {
			sum.Dropped = true
		}
		if !fr.OK {
			sum.Bad++
			damaged += fr.Damaged
			problems += fr.Problems
		}
		report(fr)
	}
	sum.LostFound = LostFound
	sum.Line = fmt.Sprintf("pack layer: %d directories, %d packed files checked, %d repaired, %d problems left, %d damaged packed files",
		len(dirs), files, repaired, problems, damaged)
	return sum, nil
}

// noPack turns packing off for the rest of the layer's life, quietly (a
// check changes nothing it is not asked to).
func (fs *FS) noPack() { fs.offOnce.Do(func() { fs.off.Store(true) }) }

func (fs *FS) checkDir(ctx context.Context, dir string, mode layer.CheckMode, files *int) layer.FileReport {
	fs.renameMu.RLock()
	d := fs.lockDir(dir)
	s, err := fs.scanDir(ctx, dir)
	fr := layer.FileReport{Path: "/" + dir, OK: true}
	var lines []string
	say := func(f string, args ...any) { lines = append(lines, fmt.Sprintf(f, args...)) }
	if err != nil {
		fs.unlockDir(d)
		fs.renameMu.RUnlock()
		fr.Err, fr.OK = err, false
		fr.Text = fr.Path + ": cannot check: " + err.Error()
		return fr
	}
	for _, name := range s.bad {
		say("%s: malformed %s xattr: its bytes cannot be found (reading it gives EIO)", name, XattrName)
		fr.Damaged++
	}
	for _, name := range sortedKeys(s.refs) {
		*files++
		r := s.refs[name]
		if _, err := fs.readRecord(ctx, dir, r); err != nil {
			what := fmt.Sprintf("%s: damaged: its %d bytes at offset %d of %s cannot be read back (%v)", name, r.n, r.off, packName(r.pack), err)
			if mode != layer.RepairForce {
				say("%s; reading it gives EIO (--repair --force empties it, keeping what is left of its bytes in %s)", what, LostFound)
				fr.Damaged++
				continue
			}
			kept, err := fs.dropDamaged(ctx, dir, name, r)
			if err != nil {
				say("%s; cannot drop it: %v", what, err)
				fr.Damaged++
				continue
			}
			say("%s: dropped (the file is empty now); what was left of its bytes is in %s", what, kept)
			fr.Dropped, fr.Repaired = true, true
		}
	}
	// Files with bytes of their own and a ref: an unpack a crash cut.
	if ents, err := fs.Lower.ReadDir(ctx, dir, true); err == nil {
		for _, e := range ents {
			a := e.Attr
			if a == nil || !a.IsRegular() || a.Size == 0 || a.Size > maxCheck || reservedName(e.Name) {
				continue
			}
			p := layer.Join(dir, e.Name)
			r, ok, err := fs.getRef(ctx, p)
			if err != nil || !ok {
				continue
			}
			if mode == layer.CheckOnly {
				say("%s: an unpack was cut by a crash (its bytes and a ref: an open finishes it)", e.Name)
				fr.Problems++
				continue
			}
			if err := fs.resolve(ctx, p, a, r); err != nil {
				say("%s: an unpack was cut by a crash, and cannot be finished: %v", e.Name, err)
				fr.Problems++
				continue
			}
			say("%s: finished an unpack cut by a crash", e.Name)
			fr.Repaired = true
		}
	}
	// Packs no file refers to: left by a crash (of a compaction, or
	// before the first ref was set).
	var unref []string
	for _, n := range sortedKeys(packsByName(s)) {
		if s.live[packsByName(s)[n]] == 0 && len(s.bad) == 0 {
			unref = append(unref, n)
		}
	}
	if len(unref) > 0 && mode == layer.CheckOnly {
		say("unreferenced pack(s) %s (left by a crash; --repair removes them)", strings.Join(unref, ", "))
		fr.Problems++
	} else if len(unref) > 0 {
		var gone []string
		for _, n := range unref {
			if err := fs.Lower.Unlink(ctx, layer.Join(dir, n)); err != nil {
				say("unreferenced pack %s: cannot remove: %v", n, err)
				fr.Problems++
			} else {
				gone = append(gone, n)
			}
		}
		if len(gone) > 0 {
			say("removed unreferenced pack(s) %s", strings.Join(gone, ", "))
			fr.Repaired = true
		}
	}
	fs.unlockDir(d)
	fs.renameMu.RUnlock()
	fr.OK = fr.Damaged == 0 && fr.Problems == 0
	if len(lines) > 0 {
		fr.Text = fr.Path + ": " + strings.Join(lines, "; ")
	}
	return fr
}

// LostFound is the directory, at the root of the lower, where a forced
// repair keeps what is left of the bytes of the packed files it empties
// (the codecs' lost+found: a codec above skips it).
const LostFound = "lost+found"

// dropDamaged keeps what can be read of the damaged record r of dir/name
// in LostFound, then empties the file (its ref removed); the directory's
// lock is held. It returns the copy's path.
func (fs *FS) dropDamaged(ctx context.Context, dir, name string, r ref) (string, error) {
	path := layer.Join(dir, name)
	b := make([]byte, r.n)
	k := 0
	if pf, err := fs.Lower.Open(ctx, layer.Join(dir, packName(r.pack)), unix.O_RDONLY); err == nil {
		k, _ = pf.ReadAt(ctx, b, r.off)
		pf.Release(ctx)
	}
	if _, err := fs.Lower.Mkdir(ctx, LostFound, 0o700); err != nil && err != syscall.EEXIST {
		return "", err
	}
	kept := layer.Join(LostFound, fmt.Sprintf("%s.%s", strings.ReplaceAll(path, "/", "_"), time.Now().UTC().Format("20060102T150405.000000000")))
	out, _, err := fs.Lower.Create(ctx, kept, unix.O_WRONLY|unix.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	_, err = out.WriteAt(ctx, b[:k], 0)
	if err == nil {
		err = out.Fsync(ctx, false)
	}
	out.Release(ctx)
	if err != nil {
		return "", err
	}
	if err := fs.Lower.Removexattr(ctx, path, XattrName); err != nil {
		return "", err
	}
	return kept, nil
}

// packsByName maps the packs' names to their numbers.
func packsByName(s *dirPacks) map[string]uint64 {
	m := map[string]uint64{}
	for n := range s.sizes {
		m[packName(n)] = n
	}
	return m
}
