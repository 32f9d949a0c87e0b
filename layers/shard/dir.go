package shard

import (
	"context"
	"errors"
	"io"
	"sort"
	"strings"
	"syscall"

	"cairnfs.dev/cairn/layer"
)

// OpenDir streams a listing. A flat directory is its lower's stream. A
// sharded one is listed in key order (Layout.Key), a bucket at a time:
// each bucket is read whole and sorted, so the stream holds one bucket's
// entries, never the directory's. An entry's cookie is its key plus one;
// Seek(c) continues with the keys from c on. Keys depend on the name only,
// not on where it is kept, so a listing lists each name that exists
// throughout once, whatever is created, removed, or moved between
// buckets by a resharding meanwhile. (Two names with one 62-bit key would
// share a cookie: a seekdir to it skips the second; a listing read through
// is not affected.)
func (fs *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	r, err := fs.resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	lp := r.lower
	r.done()
	a, err := fs.lower.Getattr(ctx, lp)
	if err != nil {
		return nil, err
	}
	if !a.IsDir() {
		return nil, syscall.ENOTDIR
	}
	ds, err := fs.state(ctx, path, lp)
	if err != nil {
		return nil, err
	}
	if ds.get() == nil {
		if t, ok := fs.Target(path); ok {
			// Not sharded yet, but a resharding may start while it is
			// listed: list it in key order already.
			return &dir{fs: fs, path: path, ds: ds, assumed: t}, nil
		}
		ld, err := layer.OpenDir(ctx, fs.lower, lp)
		if err != nil {
			return nil, err
		}
		return layer.MapDir(ld, func(_ context.Context, e *layer.DirEntry) (bool, error) {
			noDirAttr(e)
			return lp != "" || e.Name != LockName, nil
		}), nil
	}
	return &dir{fs: fs, path: path, ds: ds}, nil
}

// noDirAttr leaves out a subdirectory's attributes: its lower link count
// counts its buckets, which Getattr corrects (the kernel looks it up).
func noDirAttr(e *layer.DirEntry) {
	if e.Attr != nil && e.Attr.IsDir() {
		e.Attr = nil
	}
}

type keyed struct {
	key uint64
	e   layer.DirEntry
}

type dir struct {
	fs   *FS
	path string
	ds   *dirState
	from uint64 // the smallest key not listed yet
	buf  []keyed
	end  uint64 // the key after buf's bucket
	// bucket is the last bucket read, whole and sorted, from key start
	// to end: a seek into it (go-fuse seeks back to the entry that did
	// not fit in each READDIR's buffer) takes its entries from there
	// rather than reading the bucket again.
	bucket []keyed
	start  uint64
	flat   []keyed // the flat part, in key order
	// flatDone: flat holds the flat part (a resharding from flat).
	flatDone bool
	// assumed is the layout of a flat directory that a rule covers, whose
	// keys order its listing.
	assumed Layout
	eof     bool
	lp      string // the directory's lower path, as of the last load
}

func (d *dir) Next(ctx context.Context, plus bool) (layer.DirEntry, uint64, error) {
	for {
		for len(d.buf) == 0 {
			if d.eof {
				return layer.DirEntry{}, 0, io.EOF
			}
			if err := d.load(ctx); err != nil {
				return layer.DirEntry{}, 0, err
			}
		}
		k := d.buf[0]
		d.buf = d.buf[1:]
		d.from = k.key + 1
		if len(d.buf) == 0 {
			d.from = d.end
		}
		if plus && !d.attr(ctx, &k.e) {
			continue // gone since its bucket was read
		}
		return k.e, k.key + 1, nil
	}
}

// attr gives e the attributes of its object now, and says whether it is
// still there. A bucket is read whole and its names given out later:
// attributes read with it could bring back a name removed meanwhile, from
// which the kernel would make an entry (and give a hard-linked file a
// path that is gone). A subdirectory gets none: its lower link count
// counts its buckets, which Getattr corrects (the kernel looks it up).
func (d *dir) attr(ctx context.Context, e *layer.DirEntry) bool {
	d.ds.mu.RLock()
	defer d.ds.mu.RUnlock()
	p, _ := d.fs.child(ctx, d.ds, d.lp, e.Name)
	a, err := d.fs.lower.Getattr(layer.AsSelf(ctx), p)
	if err != nil {
		return false
	}
	e.Attr = nil
	if !a.IsDir() {
		e.Attr = &a
	}
	return true
}

func (d *dir) Seek(ctx context.Context, off uint64) error {
	if d.bucket != nil && off >= d.start && off < d.end {
		i := sort.Search(len(d.bucket), func(i int) bool { return d.bucket[i].key >= off })
		d.from, d.buf, d.eof = off, d.bucket[i:], false
		if len(d.buf) == 0 {
			d.from = d.end
		}
		return nil
	}
	d.from, d.buf, d.bucket, d.eof = off, nil, nil, false
	if off == 0 {
		d.flat, d.flatDone = nil, false
	}
	return nil
}

func (d *dir) Close() error { return nil }

// load reads the bucket holding key d.from (with the names still in their
// old place during a resharding), keeping what is from d.from on.
func (d *dir) load(ctx context.Context) error {
	d.ds.mu.RLock()
	defer d.ds.mu.RUnlock()
	st := d.ds.get()
	cur, fromFlat := d.assumed, true
	if st != nil {
		cur, fromFlat = st.Cur, st.From != nil && st.From.Scheme == Flat
	}
	if d.from >= cur.firstKey(cur.count()) {
		d.eof = true
		return nil
	}
	r, err := d.fs.resolve(ctx, d.path)
	if err != nil {
		return err
	}
	lp := r.lower
	d.lp = lp
	r.done()
	t := cur.bucketOfKey(d.from)
	d.end = cur.firstKey(t + 1)
	seen := map[string]bool{}
	var out []keyed
	add := func(e layer.DirEntry) {
		k := cur.Key(e.Name)
		if k < d.from || k >= d.end || seen[e.Name] {
			return
		}
		seen[e.Name] = true
		out = append(out, keyed{k, e})
	}
	if st != nil {
		if err := d.read(ctx, join(lp, cur.BucketName(t)), "", add); err != nil {
			return err
		}
		if st.From != nil && !fromFlat {
			if s := st.From.bucketOfKey(cur.firstKey(t)); s >= st.Next {
				if err := d.read(ctx, join(lp, st.From.BucketName(s)), "", add); err != nil {
					return err
				}
			}
		}
	}
	if fromFlat {
		if !d.flatDone {
			// The names in the flat part, read once per listing (a flat
			// directory that a rule covers, and one being converted, is
			// listed holding them; names moved to their buckets since are
			// found there too, once).
			d.flat = nil
			skip := cur.Prefix // the buckets
			if st == nil {
				skip = "" // no buckets before the record
			}
			err := d.read(ctx, lp, skip, func(e layer.DirEntry) {
				d.flat = append(d.flat, keyed{cur.Key(e.Name), e})
			})
			if err != nil {
				return err
			}
			sort.Slice(d.flat, func(i, j int) bool { return d.flat[i].key < d.flat[j].key })
			d.flatDone = true
		}
		i := sort.Search(len(d.flat), func(i int) bool { return d.flat[i].key >= d.from })
		for ; i < len(d.flat) && d.flat[i].key < d.end; i++ {
			e := d.flat[i].e
			add(e)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].key != out[j].key {
			return out[i].key < out[j].key
		}
		return out[i].e.Name < out[j].e.Name
	})
	d.buf, d.bucket, d.start = out, out, d.from
	if len(out) == 0 {
		d.from = d.end
	}
	return nil
}

// read lists lower directory lp whole into fn (a missing bucket is
// empty), leaving out names that begin with skip.
func (d *dir) read(ctx context.Context, lp string, skip string, fn func(layer.DirEntry)) error {
	ld, err := layer.OpenDir(ctx, d.fs.lower, lp)
	if errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer ld.Close()
	for {
		e, _, err := ld.Next(ctx, false)
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		if skip != "" && strings.HasPrefix(e.Name, skip) || lp == "" && e.Name == LockName {
			continue
		}
		fn(e)
	}
}
