package codec

import (
	"context"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"cairn/layer"
)

// Report is what Check found in one file.
type Report struct {
	Path     string
	Size     int64 // logical size
	Chunks   int   // chunks with data
	Records  int   // valid records in the log
	Garbage  int64 // bytes of the log that are no record (torn writes, damage)
	Replayed int   // records after the checkpoint (normal after a crash)
	// Problems are inconsistencies of the index: Repair rebuilds it.
	Problems []string
	// Damaged are chunks whose data cannot be read back: reads of them give
	// EIO; Repair cannot bring their bytes back.
	Damaged  []int64
	Repaired bool
}

// OK reports whether the file is consistent and readable.
func (r *Report) OK() bool { return len(r.Problems) == 0 && len(r.Damaged) == 0 }

func (r *Report) String() string {
	s := fmt.Sprintf("%s: %d bytes, %d chunks, %d records", r.Path, r.Size, r.Chunks, r.Records)
	if r.Replayed > 0 {
		s += fmt.Sprintf(", %d replayed after the checkpoint", r.Replayed)
	}
	if r.Garbage > 0 {
		s += fmt.Sprintf(", %d bytes of garbage", r.Garbage)
	}
	for _, p := range r.Problems {
		s += "\n  problem: " + p
	}
	if len(r.Damaged) > 0 {
		s += fmt.Sprintf("\n  damaged chunks (EIO): %v", r.Damaged)
	}
	if r.Repaired {
		s += "\n  repaired: index rebuilt"
	}
	return s
}

// Check checks one regular file of the layer: its header and checkpoint,
// the index they give against a scan of the whole log, and every chunk's
// data. With repair it rebuilds the index (checkpoint and header) when it
// is missing, stale or wrong. The file must not be in use by another
// process.
func (fs *FS) Check(ctx context.Context, path string, repair bool) (Report, error) {
	rep := Report{Path: path}
	flags := unix.O_RDONLY
	if repair {
		flags = unix.O_RDWR
	}
	lf, err := fs.Lower.Open(ctx, path, flags|unix.O_NOFOLLOW)
	if err != nil {
		return rep, err
	}
	defer lf.Release(ctx)
	a := &state{fs: fs, path: path, lower: lf, ro: !repair}
	if err := a.load(ctx); err != nil {
		return rep, err
	}
	rep.Problems = append(rep.Problems, a.problems...)
	rep.Replayed = a.scanned
	if a.logEnd == 0 {
		return rep, nil
	}
	// The whole log, scanned.
	b := &state{fs: fs, path: path, lower: lf, shift: a.shift, cs: a.cs, salt: a.salt,
		chunks: map[int64][]op{}, dirty: map[int64]*dirty{}, cache: map[int64][]byte{}}
	var recs []srec
	garbage, err := b.scanWith(ctx, headerSize, a.logEnd, a.salt, a.shift, func(r srec) bool {
		if r.r.typ != recIndex {
			recs = append(recs, r)
		}
		rep.Records++
		return true
	})
	if err != nil {
		return rep, err
	}
	rep.Garbage = garbage
	b.replay(recs)
	if len(a.problems) == 0 {
		if a.psize != b.psize {
			rep.Problems = append(rep.Problems, fmt.Sprintf("the index says %d bytes, the log %d", a.psize, b.psize))
		}
		for _, c := range union(a.chunks, b.chunks) {
			if !sameOps(a.chunks[c], b.chunks[c]) {
				rep.Problems = append(rep.Problems, fmt.Sprintf("chunk %d: the index and the log disagree", c))
			}
		}
	}
	// The index to keep: the loaded one if its header and checkpoint were
	// sound (it knows the newest generations even where a record header
	// was destroyed), else the scan's.
	use := a
	if len(a.problems) > 0 {
		use = b
		b.logEnd, b.nextGen, b.hdrSeq = a.logEnd, a.nextGen, a.hdrSeq
		b.ckptOff = 0
	}
	rep.Size = use.size
	rep.Chunks = len(use.chunks)
	for _, c := range use.order() {
		if _, err := use.decodeChunk(ctx, c); err != nil {
			rep.Damaged = append(rep.Damaged, c)
		}
	}
	if repair && (len(rep.Problems) > 0 || a.hdrStale || a.scanned > 0) {
		use.ro = false
		use.recount()
		if err := use.checkpoint(ctx); err != nil {
			return rep, err
		}
		if err := lf.Fsync(ctx, true); err != nil {
			return rep, err
		}
		if err := use.writeHeader(ctx); err != nil {
			return rep, err
		}
		if err := lf.Fsync(ctx, true); err != nil {
			return rep, err
		}
		rep.Repaired = len(rep.Problems) > 0
		rep.Problems = nil
	}
	return rep, nil
}

func union(a, b map[int64][]op) []int64 {
	var out []int64
	for c := range a {
		out = append(out, c)
	}
	for c := range b {
		if _, ok := a[c]; !ok {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// sameOps compares two ways of building a chunk, by generation: copies of
// a record may sit at different offsets.
func sameOps(x, y []op) bool {
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i].kind != y[i].kind || x[i].gen != y[i].gen || (x[i].kind == opClip && x[i].off != y[i].off) {
			return false
		}
	}
	return true
}

// Walk calls fn for every regular file under dir of the layer.
func Walk(ctx context.Context, fs layer.FS, dir string, fn func(path string) error) error {
	ents, err := fs.ReadDir(ctx, dir, false)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := layer.Join(dir, e.Name)
		switch e.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := Walk(ctx, fs, p, fn); err != nil {
				return err
			}
		case unix.S_IFREG:
			if err := fn(p); err != nil {
				return err
			}
		}
	}
	return nil
}
