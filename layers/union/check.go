package union

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
)

// Claim locks the RW branches against a second process (layer.Claimer):
// the union keeps what it knows of them until it changes them itself, and
// an fsck must not collect an index entry that a mounted union is about to
// link a name to. One union at a time serves an upper branch, as overlayfs
// refuses an upper directory another mount uses, even with -shared. The
// lock is also on a file in the index's directory (lockFile), which other
// clients of a network file system see.
func (u *FS) Claim(ctx context.Context) error {
	if u.unlock != nil {
		return nil
	}
	for i, b := range u.b {
		if b.Mode == fanout.RO {
			continue
		}
		r, err := layer.LockLowerOwn(ctx, b.FS, fmt.Sprintf("union (branch %d)", i+1), lockFile, false)
		if err != nil {
			u.Close()
			return err
		}
		u.unlock = append(u.unlock, r)
	}
	return nil
}

// Fsck finds the index entries that no name can reach any more, which the
// counts keep (index.go): a crash between a change and its count, links of
// the original outside the branch's directory or under a hidden one,
// copies made before the counting, and the index's own temporary links. An
// entry is reached by a name of its copy (a link besides the index's) or
// by a name of its original that the union still shows on a read-only
// branch (the merged tree is listed to find them). With mode Repair those
// that none reaches are removed, and their blocks freed.
func (u *FS) Fsck(ctx context.Context, mode layer.CheckMode, progress func(done, total int, path string), report func(layer.FileReport)) (layer.CheckSummary, error) {
	self := layer.AsSelf(ctx)
	u.checking = mode == layer.CheckOnly
	defer func() { u.checking = false }()
	type entry struct {
		w     int
		path  string
		id    layer.ID
		valid bool // an entry of the index (not a temporary link)
		k     counts
	}
	var cands []entry
	total := 0
	for w, b := range u.b {
		if b.Mode == fanout.RO {
			continue
		}
		ents, err := b.FS.ReadDir(self, indexDir, false)
		if notFound(err) {
			continue
		}
		if err != nil {
			return layer.CheckSummary{}, fmt.Errorf("union: the index of branch %d: %w", w+1, err)
		}
		for _, e := range ents {
			p := layer.Join(indexDir, e.Name)
			if p == lockFile {
				continue // the claim's
			}
			total++
			a, err := b.FS.Getattr(self, p)
			if err != nil {
				continue // gone meanwhile
			}
			x := entry{w: w, path: p}
			if v, err := hex.DecodeString(e.Name); err == nil && len(v) == 32 {
				be := binary.BigEndian
				x.id, x.valid = layer.ID{Dev: be.Uint64(v), Branch: be.Uint64(v[8:]), Ino: be.Uint64(v[16:]), Gen: be.Uint64(v[24:])}, true
			}
			x.k, _ = u.indexCounts(ctx, w, p)
			if x.valid && x.k.kind != idxPlaceholder && a.Nlink > 1 {
				continue // the copy has names
			}
			cands = append(cands, x)
		}
	}
	// The originals a name still shows.
	shown := map[layer.ID]bool{}
	if len(cands) > 0 {
		done := 0
		var walk func(dir string) error
		walk = func(dir string) error {
			ents, err := u.ReadDir(ctx, dir, true)
			if err != nil {
				return fmt.Errorf("union: listing %q: %w", dir, err)
			}
			for _, e := range ents {
				p := layer.Join(dir, e.Name)
				if e.Mode&unix.S_IFMT == unix.S_IFDIR {
					if err := walk(p); err != nil {
						return err
					}
					continue
				}
				if a := e.Attr; a != nil && a.IsRegular() && a.Nlink > 1 {
					shown[a.ID()] = true
				}
			}
			done++
			progress(done, 0, dir)
			return nil
		}
		if err := walk(""); err != nil {
			return layer.CheckSummary{}, err
		}
	}
	orphans, removed := 0, 0
	for _, x := range cands {
		if x.valid && shown[x.id] {
			continue // a name of the original is left
		}
		r := layer.FileReport{Path: fmt.Sprintf("branch %d: %s", x.w+1, x.path)}
		what := "a temporary link"
		if x.valid {
			what = "the copy"
			if x.k.kind == idxPlaceholder {
				what = "a placeholder"
			}
			if x.k.ok {
				what += fmt.Sprintf(" of a file of %d links, %d counted gone", x.k.l, x.k.c)
			}
		}
		r.Text = fmt.Sprintf("%s: index entry (%s) that no name reaches", r.Path, what)
		if mode >= layer.Repair {
			if err := u.b[x.w].FS.Unlink(self, x.path); err != nil {
				r.Text += fmt.Sprintf(": not removed: %v", err)
				r.Problems = 1
				orphans++
			} else {
				r.Text += ": removed"
				r.Repaired, r.OK = true, true
				removed++
			}
		} else {
			r.Text += " (--repair removes it)"
			r.Problems = 1
			orphans++
		}
		report(r)
	}
	line := fmt.Sprintf("union: index entries: %d, reached by a name: %d", total, total-orphans-removed)
	if removed > 0 {
		line += fmt.Sprintf(", removed: %d", removed)
	}
	if orphans > 0 {
		line += fmt.Sprintf(", reached by none: %d", orphans)
	}
	return layer.CheckSummary{Line: line, Bad: orphans}, nil
}
