package union

import (
	"context"
	"encoding/binary"
	"errors"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// The index and its collection.
//
// The copy of a file of several links of a read-only branch is linked in
// the index (indexDir, at the root of the RW branch that holds it) by the
// original's identity, so that the original's other names, looked up
// later, are linked to it (linkUp). The index entry is what keeps the copy
// while a name of the original that was never looked up remains: it must
// go when no name can reach it any more, and not before.
//
// Every name of the original ends one way: it is linked to the copy (the
// name that was copied up, and each name linkUp links), or it is hidden by
// a whiteout before any copy exists. The index entry counts them, after
// the origin in its side data (see countsValue): the original's link count
// at the first event (L) and the names so ended (C). Names that are the
// copy's are its own links. So the entry goes when the copy has no link
// but the index's and C has reached L: every name of the original has
// ended, and every one that came to the copy has been removed. A whiteout
// made before the copy-up counts in a placeholder (an empty file at the
// entry's name, never linked to a name), whose count the copy takes over;
// a placeholder whose count reaches L goes too.
//
// Each count is made after what it counts (the link, the whiteout, the
// copy's rename into place), so that a crash between them leaves a count
// that is short: the entry is then kept (its blocks are not freed), never
// dropped while a name can still reach it. A link count that takes in names
// the union cannot see (outside the branch, under a directory already
// hidden) keeps the entry the same way. Entries made before the counting
// (an origin of 33 bytes) are kept.

// The kinds of index entries (the origin's 33rd byte).
const (
	idxCopy        = 1
	idxPlaceholder = 2
)

// counts is what an index entry records.
type counts struct {
	kind byte   // idxCopy or idxPlaceholder (0: not an index entry)
	l, c uint32 // the original's names; the names ended
	ok   bool   // counted (entries made before the counting are not)
}

// countsValue is the origin of an index entry: the original's identity,
// the kind, L and C.
func countsValue(id layer.ID, k counts) []byte {
	v := append(encodeID(id), k.kind)
	v = binary.BigEndian.AppendUint32(v, k.l)
	return binary.BigEndian.AppendUint32(v, k.c)
}

// indexCounts reads what index entry idx of branch w records.
func (u *FS) indexCounts(ctx context.Context, w int, idx string) (counts, error) {
	v, err := u.meta[w].Get(layer.AsSelf(ctx), idx, "origin")
	if err != nil {
		return counts{}, err
	}
	var k counts
	if len(v) > 32 {
		k.kind = v[32]
	}
	if len(v) >= 41 {
		be := binary.BigEndian
		k.l, k.c, k.ok = be.Uint32(v[33:]), be.Uint32(v[37:]), true
	}
	return k, nil
}

// ended counts one more name of the original with identity id ended
// (linked to its copy, or hidden), in the index entry of branch w; with
// no entry, a placeholder is made for a file of l links. A placeholder
// whose names have all ended goes.
func (u *FS) ended(ctx context.Context, w int, id layer.ID, l uint32) {
	u.imu.Lock()
	defer u.imu.Unlock()
	self := layer.AsSelf(ctx)
	fs := u.b[w].FS
	idx := indexName(id)
	k, err := u.indexCounts(ctx, w, idx)
	if notFound(err) {
		if l < 2 {
			return
		}
		if _, err := fs.Mkdir(self, indexDir, 0o700); err != nil && !errors.Is(err, syscall.EEXIST) {
			return
		}
		f, _, err := fs.Create(self, idx, unix.O_WRONLY|unix.O_EXCL, 0o600)
		if err != nil {
			return
		}
		f.Release(self)
		if err := u.meta[w].Set(self, idx, "origin", countsValue(id, counts{kind: idxPlaceholder, l: l, c: 1})); err != nil {
			fs.Unlink(self, idx)
		}
		return
	}
	if err != nil || !k.ok {
		return
	}
	k.c++
	if k.kind == idxPlaceholder && k.c >= k.l {
		fs.Unlink(self, idx)
		return
	}
	u.meta[w].Set(self, idx, "origin", countsValue(id, k))
}

// collect drops the index entry of the copy of the original with identity
// id, on branch w, once a name of the copy has been removed, if no name
// is left to reach it: the copy has no other link, and every name of the
// original has ended. Its blocks are then freed.
func (u *FS) collect(ctx context.Context, w int, id layer.ID) {
	u.imu.Lock()
	defer u.imu.Unlock()
	self := layer.AsSelf(ctx)
	idx := indexName(id)
	a, err := u.b[w].FS.Getattr(self, idx)
	if err != nil || a.Nlink > 1 {
		return
	}
	if k, err := u.indexCounts(ctx, w, idx); err == nil && k.ok && k.kind == idxCopy && k.c >= k.l {
		if err := u.b[w].FS.Unlink(self, idx); err == nil {
			u.log.Debug("union: index entry collected", "branch", w+1, "entry", idx)
		}
	}
}

// collectShown is collect for an object the union showed as s (nil, or a
// copy outside the index: nothing to do).
func (u *FS) collectShown(ctx context.Context, w int, s *shown) {
	if s != nil && s.indexed {
		u.collect(ctx, w, s.id)
	}
}
