package codec

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// Mode says what Check may change (layer.CheckMode).
type Mode = layer.CheckMode

const (
	// CheckOnly changes nothing.
	CheckOnly = layer.CheckOnly
	// Repair rebuilds what can be rebuilt without losing a byte: the
	// index (checkpoint) and the header slots. It refuses a file whose
	// repair would drop data (damaged chunks stay EIO, a file with lost
	// records stays unserved) and says so.
	Repair = layer.Repair
	// RepairForce also drops what cannot be read back, after saving a copy
	// of the lower file in LostFound: damaged chunks, and, in a file with
	// lost records, every chunk those records may have changed (so that
	// nothing a lost truncation removed comes back). Dropped chunks read as
	// zeros.
	RepairForce = layer.RepairForce
)

// LostFound is the directory, at the root of the layer's lower, where
// RepairForce keeps a copy of each file whose data it drops. cairn fsck
// does not check the files in it.
const LostFound = "lost+found"

// Report is what Check found (and changed) in one file.
type Report struct {
	Path     string
	Size     int64 // logical size
	Chunks   int   // chunks with data
	Records  int   // valid records in the log
	Garbage  int64 // bytes of the log that are no record (torn writes, damage)
	Replayed int   // records after the checkpoint (normal after a crash)
	// DeadDamaged are records no longer in use whose payload checksum
	// fails: harmless for reads (compaction drops them), reported.
	DeadDamaged int
	// SlotsDamaged are header slots that fail their checksum while the
	// other one serves (a crash while it was written, or damage):
	// harmless, reported, rewritten by Repair.
	SlotsDamaged int
	// Problems are inconsistencies of the index or the header: Repair
	// rebuilds them.
	Problems []string
	// Damaged are chunks whose data cannot be read back: reads of them give
	// EIO. Only RepairForce drops them.
	Damaged []int64
	// Lost says records are missing (destroyed headers): the file is not
	// served; only RepairForce makes it readable, dropping what the lost
	// records may have changed.
	Lost string
	// Changes lists what a repair changed, one line each.
	Changes []string
	// Refused says why a repair was not made.
	Refused string
	// Dropped is the number of bytes of data a forced repair dropped;
	// LostAccepted, the lost records it gave up on (what they held is
	// unknown: the copy in LostFound has their bytes).
	Dropped      int64
	LostAccepted int
	Repaired     bool
	// Plain says the file is not the layer's (no magic: see IsPlain): it
	// is served as it is, until it is rewritten or converted.
	Plain bool
	// Encoded, for a plain file, is where a record of the format was found
	// in it: damaged data of the layer, whose magic numbers are destroyed,
	// rather than a file that was there before (-1: none).
	Encoded int64
}

// OK reports whether the file is consistent and readable.
func (r *Report) OK() bool {
	return len(r.Problems) == 0 && len(r.Damaged) == 0 && r.Lost == "" && !(r.Plain && r.Encoded >= 0)
}

func (r *Report) String() string {
	if r.Plain {
		s := fmt.Sprintf("%s: %d bytes, plain (not yet converted)", r.Path, r.Size)
		if r.Encoded >= 0 {
			s += fmt.Sprintf("\n  problem: no header, yet a record of the format at byte %d: this may be data of the layer whose header is destroyed, served raw (not repaired: look at it, restore it from a backup, or remove it)", r.Encoded)
		}
		return s
	}
	s := fmt.Sprintf("%s: %d bytes, %d chunks, %d records", r.Path, r.Size, r.Chunks, r.Records)
	if r.Replayed > 0 {
		s += fmt.Sprintf(", %d replayed after the checkpoint", r.Replayed)
	}
	if r.Garbage > 0 {
		s += fmt.Sprintf(", %d bytes of garbage", r.Garbage)
	}
	if r.DeadDamaged > 0 {
		s += fmt.Sprintf(", %d damaged records no longer in use", r.DeadDamaged)
	}
	if r.SlotsDamaged > 0 {
		s += fmt.Sprintf(", %d header slot damaged or torn (the other one serves)", r.SlotsDamaged)
	}
	for _, p := range r.Problems {
		s += "\n  problem: " + p
	}
	if r.Lost != "" && !slices.Contains(r.Problems, r.Lost) {
		s += "\n  problem: " + r.Lost
	}
	if len(r.Damaged) > 0 {
		s += fmt.Sprintf("\n  damaged chunks (EIO): %v", r.Damaged)
	}
	for _, c := range r.Changes {
		s += "\n  repaired: " + c
	}
	if r.Dropped > 0 {
		s += fmt.Sprintf("\n  lost: %d bytes of data dropped", r.Dropped)
	}
	if r.Refused != "" {
		s += "\n  not repaired: " + r.Refused
	}
	return s
}

// Check checks one regular file of the layer: its header slots and
// checkpoint, the index they give against a scan of the whole log, and
// every chunk's data. With Repair it rebuilds the index and header when
// they are missing, stale or wrong; with RepairForce it also drops what
// cannot be read back (see Mode). The file must not be in use by another
// process.
func (fs *FS) Check(ctx context.Context, path string, mode Mode) (Report, error) {
	rep := Report{Path: path}
	repair := mode != CheckOnly
	flags := unix.O_RDONLY
	if repair {
		flags = unix.O_RDWR
	}
	lf, err := fs.Lower.Open(ctx, path, flags|unix.O_NOFOLLOW)
	if err != nil {
		return rep, err
	}
	defer lf.Release(ctx)
	if la, err := lf.Getattr(ctx); err != nil {
		return rep, err
	} else if la.Size > 0 {
		plain, err := IsPlain(ctx, lf)
		if err != nil {
			return rep, err
		}
		if plain {
			rep.Plain, rep.Size = true, int64(la.Size)
			rep.Encoded, err = findRecord(ctx, lf)
			return rep, err
		}
	}
	a := &state{fs: fs.e, path: path, lower: lf, ro: true}
	if err := a.load(ctx); err != nil {
		return rep, err
	}
	rep.Problems = append(rep.Problems, a.problems...)
	rep.Lost = a.lost
	rep.Replayed = a.scanned
	if a.logEnd == 0 {
		// An empty file, maybe with the torn header of its creation.
		la, err := lf.Getattr(ctx)
		if err != nil {
			return rep, err
		}
		rep.Garbage = int64(la.Size)
		if repair && la.Size > 0 {
			if _, err := lf.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 0}); err != nil {
				return rep, err
			}
			rep.Changes = append(rep.Changes, fmt.Sprintf("the torn header of an empty file (%d bytes) cut", la.Size))
			rep.Repaired = true
		}
		return rep, nil
	}
	// Both header slots: a damaged one is reported (the other one serves).
	area := make([]byte, headerSize)
	n, err := lf.ReadAt(ctx, area, 0)
	if err != nil && err != io.EOF {
		return rep, err
	}
	good := 0
	for i := 0; i < 2; i++ {
		if _, err := parseSlot(area[min(i*slotSize, n):n]); err == nil {
			good++
		}
	}
	if good == 1 {
		rep.SlotsDamaged = 1
	}
	slotsBad := good < 2
	// The whole log, scanned.
	b := &state{fs: fs.e, path: path, lower: lf, shift: a.shift, cs: a.cs, salt: a.salt,
		chunks: map[int64][]op{}, dirty: map[int64]*dirty{}, cache: map[int64][]byte{}}
	var recs []srec
	gens := map[uint64]bool{}
	var floor, maxGen uint64 = 1, 0
	garbage, err := b.scanWith(ctx, headerSize, a.logEnd, a.salt, a.shift, func(r srec) bool {
		if r.r.typ != recIndex {
			recs = append(recs, r)
		}
		if r.r.typ == recSize && r.r.flags&flagReset != 0 {
			floor = max(floor, r.r.gen)
		}
		gens[r.r.gen] = true
		maxGen = max(maxGen, r.r.gen)
		rep.Records++
		return true
	})
	if err != nil {
		return rep, err
	}
	rep.Garbage = garbage
	b.replay(recs)
	// Does the log hold every generation from 1 (or the newest reset)?
	whole := findGaps(gens, floor, maxGen).n == 0
	disagree := false
	if a.lost == "" && len(a.problems) == 0 {
		n := len(rep.Problems)
		if a.psize != b.psize {
			rep.Problems = append(rep.Problems, fmt.Sprintf("the index says %d bytes, the log %d", a.psize, b.psize))
		}
		for _, c := range union(a.chunks, b.chunks) {
			if !sameOps(a.chunks[c], b.chunks[c]) {
				rep.Problems = append(rep.Problems, fmt.Sprintf("chunk %d: the index and the log disagree", c))
			}
		}
		disagree = len(rep.Problems) > n
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
	live := map[uint64]bool{}
	for _, ops := range use.chunks {
		for _, o := range ops {
			live[o.gen] = true
		}
	}
	for _, r := range recs {
		if !r.crcOK && !live[r.r.gen] {
			rep.DeadDamaged++
		}
	}
	rep.Size = use.size
	rep.Chunks = len(use.chunks)
	for _, c := range use.order() {
		if _, err := use.decodeChunk(ctx, c); err != nil {
			rep.Damaged = append(rep.Damaged, c)
		}
	}
	if !repair {
		return rep, nil
	}
	// What a repair would drop: damaged chunks, and with lost records,
	// every chunk built from records older than the first lost one (a lost
	// record may have changed it, or cut it off with a truncation).
	drop := slices.Clone(rep.Damaged)
	if a.lost != "" {
		first := a.missing.first
		if g := findGaps(gens, floor, first); a.whole && g.n > 0 {
			first = g.first // an earlier gap: as suspect
		}
		for c, ops := range use.chunks {
			for _, o := range ops {
				if o.kind != opClip && o.gen < first && !slices.Contains(drop, c) {
					drop = append(drop, c)
					break
				}
			}
		}
	}
	slices.Sort(drop)
	if (len(drop) > 0 || a.lost != "") && mode != RepairForce {
		var bytes int64
		for _, c := range drop {
			bytes += min(use.cs, use.size-c*use.cs)
		}
		rep.Refused = fmt.Sprintf("it would drop %d chunk(s), %d bytes", len(drop), bytes)
		if a.lost != "" {
			rep.Refused += fmt.Sprintf(", and give up %d lost record(s) whose content is unknown", a.missing.n)
		}
		rep.Refused += fmt.Sprintf(": run with --force to do so (a copy of the file is kept in %s)", LostFound)
		if a.lost != "" {
			return rep, nil // the file stays unserved: nothing is changed
		}
		drop = nil // the index can still be rebuilt; damaged chunks stay EIO
	}
	if len(drop) == 0 && len(rep.Problems) == 0 && !a.hdrStale && a.scanned == 0 && !slotsBad {
		return rep, nil
	}
	use.ro = false
	use.whole = whole && a.lost == ""
	use.recount()
	if len(drop) > 0 || a.lost != "" {
		saved, err := fs.saveLost(ctx, path, lf)
		if err != nil {
			return rep, fmt.Errorf("keeping a copy in %s before dropping data: %w", LostFound, err)
		}
		rep.Changes = append(rep.Changes, "the file as it was is kept as "+saved)
	}
	// Bytes after the log (a torn record left by a crash) go first: the
	// records appended now must not lie inside what a torn header claims.
	if la, err := lf.Getattr(ctx); err != nil {
		return rep, err
	} else if int64(la.Size) > use.logEnd {
		if _, err := lf.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(use.logEnd)}); err != nil {
			return rep, err
		}
		rep.Changes = append(rep.Changes, fmt.Sprintf("%d bytes after the log's last record (a torn write) cut", int64(la.Size)-use.logEnd))
	}
	if len(drop) > 0 {
		for _, c := range drop {
			n := min(use.cs, use.size-c*use.cs)
			rep.Dropped += n
			why := "damaged"
			if !slices.Contains(rep.Damaged, c) {
				why = "written before a lost record"
			}
			rep.Changes = append(rep.Changes, fmt.Sprintf("chunk %d (bytes %d to %d, %s): %d bytes dropped, they read as zeros", c, c*use.cs, c*use.cs+n, why, n))
			// An empty chunk record: the log itself says the chunk is
			// gone, so that a later rebuild from the log does not bring
			// its old records back.
			use.clock++
			use.dirty[c] = &dirty{buf: make([]byte, 0), loaded: true, whole: true, used: use.clock}
			delete(use.cache, c)
		}
		if err := use.flushDirty(ctx); err != nil {
			return rep, err
		}
	}
	if disagree {
		// The index (sound) knows records that a scan of the log gets
		// wrong (a destroyed header hides a newer record, or a truncation):
		// copy the live records after a reset record, so that the log
		// alone gives the index again.
		if err := use.compact(ctx); err != nil {
			return rep, err
		}
		rep.Changes = append(rep.Changes, "live records copied after a reset record: the log alone gives the index again")
	}
	if err := use.checkpoint(ctx); err != nil {
		return rep, err
	}
	if err := lf.Fsync(ctx, true); err != nil {
		return rep, err
	}
	// Both slots, so that a damaged one does not stay.
	for i := 0; i < 2; i++ {
		if err := use.writeHeader(ctx); err != nil {
			return rep, err
		}
	}
	if err := lf.Fsync(ctx, true); err != nil {
		return rep, err
	}
	if a.lost != "" {
		rep.LostAccepted = int(min(a.missing.n, 1<<30))
		rep.Changes = append(rep.Changes, fmt.Sprintf("%d lost record(s) given up: what they held is unknown (see the copy)", a.missing.n))
	}
	for _, p := range rep.Problems {
		if p != a.lost {
			rep.Changes = append(rep.Changes, "fixed: "+p)
		}
	}
	switch {
	case len(rep.Problems) > 0 && len(a.problems) > 0:
		rep.Changes = append(rep.Changes, "index rebuilt from the log: checkpoint and header written")
	case len(rep.Problems) > 0 || slotsBad:
		rep.Changes = append(rep.Changes, "checkpoint and header slots written")
	}
	rep.Repaired = len(rep.Changes) > 0
	rep.Problems = nil
	if len(drop) > 0 || a.lost != "" {
		rep.Damaged, rep.Lost = nil, ""
	}
	return rep, nil
}

// saveLost copies the lower file at path into LostFound and returns the
// copy's path.
func (fs *FS) saveLost(ctx context.Context, path string, lf layer.File) (string, error) {
	if _, err := fs.Lower.Mkdir(ctx, LostFound, 0o700); err != nil && err != syscall.EEXIST {
		return "", err
	}
	name := layer.Join(LostFound, fmt.Sprintf("%s.%s", strings.ReplaceAll(path, "/", "_"), time.Now().UTC().Format("20060102T150405.000000000")))
	out, _, err := fs.Lower.Create(ctx, name, unix.O_WRONLY|unix.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	defer out.Release(ctx)
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, err := lf.ReadAt(ctx, buf, off)
		if n > 0 {
			if w, err := out.WriteAt(ctx, buf[:n], off); err != nil || w < n {
				if err == nil {
					err = io.ErrShortWrite
				}
				return "", err
			}
			off += int64(n)
		}
		if err == io.EOF || (err == nil && n == 0) {
			break
		}
		if err != nil {
			return "", err
		}
	}
	if err := out.Fsync(ctx, false); err != nil {
		return "", err
	}
	return name, nil
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

// Walk calls fn for every regular file under dir of the layer, except
// those in LostFound at the root.
func Walk(ctx context.Context, fs layer.FS, dir string, fn func(path string) error) error {
	ents, err := fs.ReadDir(ctx, dir, false)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := layer.Join(dir, e.Name)
		switch e.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if p == LostFound {
				continue
			}
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

// Fsck checks every file of the layer (layer.Checker): `cairn fsck`.
func (fs *FS) Fsck(ctx context.Context, mode layer.CheckMode, progress func(done, total int, path string), report func(layer.FileReport)) (layer.CheckSummary, error) {
	var files []string
	if err := Walk(ctx, fs, "", func(p string) error { files = append(files, p); return nil }); err != nil {
		return layer.CheckSummary{}, fmt.Errorf("listing the files of the %s layer: %w", fs.e.kind.Name, err)
	}
	sum := layer.CheckSummary{LostFound: LostFound}
	var problems, damaged, repaired, plain int
	for i, p := range files {
		progress(i, len(files), p)
		rep, err := fs.Check(ctx, p, mode)
		if err != nil {
			sum.Bad++
			report(layer.FileReport{Path: p, Err: err})
			continue
		}
		fr := layer.FileReport{Path: p, Text: rep.String(), OK: rep.OK(), Repaired: rep.Repaired,
			Dropped: rep.Dropped > 0 || rep.LostAccepted > 0, Damaged: len(rep.Damaged), Problems: len(rep.Problems)}
		if rep.Lost != "" && !slices.Contains(rep.Problems, rep.Lost) {
			fr.Problems++
		}
		if rep.Repaired {
			repaired++
		}
		if rep.Plain && rep.OK() {
			plain++
		}
		if fr.Dropped {
			sum.Dropped = true
		}
		if !fr.OK {
			problems += fr.Problems
			damaged += fr.Damaged
			sum.Bad++
		}
		report(fr)
	}
	sum.Line = fmt.Sprintf("%s layer: %d files checked, %d repaired, %d index problems left, %d damaged chunks",
		fs.e.kind.Name, len(files), repaired, problems, damaged)
	if plain > 0 {
		files := "files"
		if plain == 1 {
			files = "file"
		}
		sum.Line += fmt.Sprintf(", %d plain %s (not yet converted: served as they are; 'cairn convert' converts them)", plain, files)
	}
	return sum, nil
}

// findRecord looks for a valid record header of the format anywhere in
// the plain file lf: its offset, or -1.
func findRecord(ctx context.Context, lf layer.File) (int64, error) {
	buf := make([]byte, scanBlock+recHdrSize)
	for off := int64(0); ; off += scanBlock {
		n, err := lf.ReadAt(ctx, buf, off)
		if err != nil && err != io.EOF {
			return -1, err
		}
		b := buf[:n]
		for i := 0; ; {
			j := bytes.Index(b[i:], recMagic[:])
			if j < 0 || i+j >= scanBlock {
				break
			}
			if _, perr := parseRec(b[i+j:], 0, 0); perr == nil {
				return off + int64(i+j), nil
			}
			i += j + 1
		}
		if n < len(buf) {
			return -1, nil
		}
	}
}
