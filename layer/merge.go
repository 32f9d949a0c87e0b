package layer

import (
	"context"
	"io"
)

// Merge describes a listing made of several streams read one after the
// other, the first whole before the second: the branches of a fan-out
// layer (union). Keep decides on each entry, as the layer's rules say
// (the first branch that has a name shows it).
type Merge struct {
	// N is the number of streams.
	N int
	// Open opens stream k at its start.
	Open func(ctx context.Context, k int) (Dir, error)
	// Keep decides on entry e of stream k, which it may change. whole
	// says that this listing has read streams 0 to k-1 whole, from the
	// start, with no seek between (what Keep remembers of them is then
	// complete; after a seek, it must look instead).
	Keep func(ctx context.Context, k int, e *DirEntry, whole bool) (bool, error)
	// Restart, if set, runs when the listing starts again (Seek(0)).
	Restart func()
}

// MergeDirs is the stream of m. Memory stays bounded: one stream is open at
// a time, and the cookies it gives (positions in the listing) find their
// place again from a ring of the last mergeRing entries given (the cookie
// of the entry in its stream) or, further back, from a checkpoint every
// mergeEvery entries and a count from there.
func MergeDirs(m Merge) Dir { return &mergedDir{m: m, whole: true} }

const (
	mergeRing  = 4096
	mergeEvery = 4096
)

// mergePos is where the listing is after entry seq: after cookie c of
// stream k (seq 0: the start).
type mergePos struct {
	seq uint64
	k   int
	c   uint64
}

type mergedDir struct {
	m     Merge
	k     int    // the stream being read
	cur   Dir    // stream k, open (nil: not yet)
	seq   uint64 // the entries given since the start
	max   uint64 // the highest cookie given
	whole bool   // read from the start without a seek
	ring  [mergeRing]mergePos
	ckpts []mergePos
}

func (d *mergedDir) Next(ctx context.Context, plus bool) (DirEntry, uint64, error) {
	for {
		if d.k >= d.m.N {
			return DirEntry{}, 0, io.EOF
		}
		if d.cur == nil {
			s, err := d.m.Open(ctx, d.k)
			if err != nil {
				return DirEntry{}, 0, err
			}
			d.cur = s
		}
		e, c, err := d.cur.Next(ctx, plus)
		if err == io.EOF {
			d.cur.Close()
			d.cur = nil
			d.k++
			continue
		}
		if err != nil {
			return DirEntry{}, 0, err
		}
		keep, err := d.m.Keep(ctx, d.k, &e, d.whole)
		if err != nil {
			return DirEntry{}, 0, err
		}
		if !keep {
			continue
		}
		d.seq++
		p := mergePos{seq: d.seq, k: d.k, c: c}
		d.ring[d.seq%mergeRing] = p
		if d.seq > d.max {
			d.max = d.seq
			if d.seq%mergeEvery == 0 {
				d.ckpts = append(d.ckpts, p)
			}
		}
		return e, d.seq, nil
	}
}

func (d *mergedDir) Seek(ctx context.Context, off uint64) error {
	if off == d.seq && (off != 0 || d.k == 0 && d.cur == nil) {
		return nil
	}
	if off > d.max {
		return errInvalidSeek
	}
	if off == 0 {
		if d.m.Restart != nil {
			d.m.Restart()
		}
		d.moveTo(mergePos{})
		d.whole = true
		return nil
	}
	if p := d.ring[off%mergeRing]; p.seq == off {
		return d.reopen(ctx, p)
	}
	// Further back than the ring: from the last checkpoint before it,
	// count the entries again.
	var from mergePos
	for _, p := range d.ckpts {
		if p.seq <= off {
			from = p
		}
	}
	if err := d.reopen(ctx, from); err != nil {
		return err
	}
	for d.seq < off {
		if _, _, err := d.Next(ctx, false); err != nil {
			if err == io.EOF {
				return errInvalidSeek
			}
			return err
		}
	}
	return nil
}

// moveTo closes the open stream and sets the position to p, whose stream
// is opened by the next Next.
func (d *mergedDir) moveTo(p mergePos) {
	if d.cur != nil {
		d.cur.Close()
		d.cur = nil
	}
	d.k, d.seq = p.k, p.seq
}

// reopen continues after p: its stream opened and sought.
func (d *mergedDir) reopen(ctx context.Context, p mergePos) error {
	d.moveTo(p)
	d.whole = false
	if p.seq == 0 {
		return nil
	}
	s, err := d.m.Open(ctx, p.k)
	if err != nil {
		return err
	}
	if err := s.Seek(ctx, p.c); err != nil {
		s.Close()
		return err
	}
	d.cur = s
	return nil
}

func (d *mergedDir) Close() error {
	if d.cur != nil {
		err := d.cur.Close()
		d.cur = nil
		return err
	}
	return nil
}
