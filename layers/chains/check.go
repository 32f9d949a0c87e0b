package chains

import (
	"context"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Claim locks the lower while the layer is open (layer.Claimer): the codec
// links keep the state of open files in memory, so one process at a time
// serves a chains lower, even with -shared. The lock is also on a file of
// the lower's root (LockName), which other clients of a network file
// system see. Then it removes what conversions a crash left unfinished
// (not before: they may be a mounted daemon's, under way).
func (fs *FS) Claim(ctx context.Context) error {
	fs.mu.Lock()
	claimed := fs.release != nil
	fs.mu.Unlock()
	if claimed {
		return nil
	}
	release, err := layer.LockLowerOwn(ctx, fs.Lower, "chains", LockName, false)
	if err != nil {
		return err
	}
	cleaned := fs.cleanTmp(ctx)
	fs.mu.Lock()
	fs.release, fs.cleaned = release, cleaned
	fs.mu.Unlock()
	return nil
}

// Fsck reads every guarded file through its chain, which checks it
// (crypt authenticates each block, a codec decodes each chunk), reports
// the ones that cannot be read back, and the conversions a crash left
// unfinished in TmpDir (a repair removes them; mounting does too). Records
// naming links this build lacks are reported, not changed.
func (fs *FS) Fsck(ctx context.Context, mode layer.CheckMode, progress func(done, total int, path string), report func(layer.FileReport)) (layer.CheckSummary, error) {
	ctx = layer.AsSelf(ctx)
	var files []string
	var walk func(dir string) error
	walk = func(dir string) error {
		ents, err := fs.Lower.ReadDir(ctx, dir, false)
		if err != nil {
			return err
		}
		for _, e := range ents {
			p := layer.Join(dir, e.Name)
			switch {
			case fs.reserved(p):
			case e.Mode&unix.S_IFMT == unix.S_IFDIR:
				if err := walk(p); err != nil {
					return err
				}
			case e.Mode&unix.S_IFMT == unix.S_IFREG:
				files = append(files, p)
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		return layer.CheckSummary{}, err
	}
	var sum layer.CheckSummary
	guarded := 0
	for i, p := range files {
		progress(i, len(files), p)
		names, l, err := fs.readRecord(ctx, p)
		if err == nil && names == nil {
			if l != nil {
				if t, rerr := l.resolve(p); rerr == nil {
					if _, gerr := fs.Lower.Getattr(ctx, t); gerr != nil {
						report(layer.FileReport{Path: p, OK: true, Text: fmt.Sprintf("/%s: a link to %s, which is missing (%v)", p, t, gerr)})
					}
				}
			}
			continue
		}
		guarded++
		r := layer.FileReport{Path: p}
		if err == nil {
			err = fs.readThrough(ctx, p, names)
		}
		if err != nil {
			r.Err, r.Damaged, r.Text = err, 1, fmt.Sprintf("/%s: %v", p, err)
			sum.Bad++
		} else {
			r.OK, r.Text = true, fmt.Sprintf("/%s: %s: ok", p, strings.Join(names, ","))
		}
		report(r)
	}
	fs.mu.Lock()
	cleaned := fs.cleaned
	fs.cleaned = nil
	fs.mu.Unlock()
	for _, p := range cleaned {
		report(layer.FileReport{Path: p, OK: true, Repaired: true,
			Text: fmt.Sprintf("/%s: an unfinished conversion, removed when the stack started (the file it was for is whole)", p)})
	}
	left, _ := fs.Lower.ReadDir(ctx, TmpDir, false)
	for _, e := range left {
		r := layer.FileReport{Path: layer.Join(TmpDir, e.Name), Problems: 1,
			Text: fmt.Sprintf("/%s: an unfinished conversion (the file it was for is whole)", layer.Join(TmpDir, e.Name))}
		if mode != layer.CheckOnly {
			if err := fs.Lower.Unlink(ctx, r.Path); err == nil {
				r.Problems, r.Repaired, r.OK = 0, true, true
			}
		}
		if !r.OK {
			sum.Bad++
		}
		report(r)
	}
	sum.Line = fmt.Sprintf("chains: %d files, %d guarded, %d not readable, %d unfinished conversions", len(files), guarded, sum.Bad, len(cleaned)+len(left))
	return sum, nil
}

// readThrough reads the file at p through the chain names to its end.
func (fs *FS) readThrough(ctx context.Context, p string, names []string) error {
	c, err := fs.chainOf(names)
	if err != nil {
		return err
	}
	f, err := c.ts[0].Open(ctx, p, p, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer f.Release(ctx)
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, err := f.ReadAt(ctx, buf, off)
		off += int64(n)
		if err == io.EOF || (err == nil && n == 0) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
