package shard

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"syscall"
	"time"
)

// Automatic growth. A hash directory whose policy grows (Config.MaxBucket,
// the max_bucket option) starts with one bucket, so that a small directory
// costs what a flat one does (one more lower directory, not 256), and the
// daemon splits its buckets in the background when the average bucket
// holds more than max_bucket entries: a resharding to 2^k times the
// buckets (Reshard's machinery: its record, its batches under the
// directory's write lock, its crash safety; listings stay stable), which
// a rename or removal of the directory stops, to be resumed by the next
// change in it.
//
// The entry count is kept in memory per directory: from the first name
// made in it after the record is read, an estimate from a few of its
// buckets (grow), then changed by every make and remove through the layer.
// Names made behind the layer's back count from the next estimate on (the
// next mount).

// count records that a name was made (+1) or removed (-1) in r's
// directory, and starts a growth if the directory needs one (or has one
// to resume, after a crash).
func (fs *FS) count(r *res, delta int64) {
	ds := r.parent
	if ds == nil || ds.maxBucket == 0 {
		return
	}
	st := ds.get()
	if st == nil || st.Cur.Scheme != Hash {
		return
	}
	n := ds.entries.Add(delta)
	if delta < 0 {
		return // a directory does not shrink
	}
	if st.From == nil && ds.counted.Load() && (n <= int64(ds.maxBucket)*int64(st.Cur.Buckets) || st.Cur.Buckets >= MaxBuckets) {
		return
	}
	if st.From != nil && st.From.Scheme != Hash {
		return // a conversion from flat is `cairn reshard`'s to resume
	}
	if time.Now().UnixNano() < ds.retryAt.Load() || !ds.growing.CompareAndSwap(false, true) {
		return
	}
	fs.mu.Lock()
	if fs.closed {
		fs.mu.Unlock()
		ds.growing.Store(false)
		return
	}
	fs.bg.Add(1)
	fs.mu.Unlock()
	dir := r.dir
	go func() {
		defer fs.bg.Done()
		defer ds.growing.Store(false)
		err := fs.grow(dir, ds)
		switch {
		case err == nil:
		case errors.Is(err, errSkipped), errors.Is(err, syscall.EBUSY), errors.Is(err, context.Canceled),
			errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.ELOOP):
			// A rename or removal, or a resharding of a directory above
			// or below: the next change tries again.
			ds.retryAt.Store(time.Now().Add(time.Second).UnixNano())
		default:
			slog.Warn("shard: a directory's growth stopped; it resumes with the next name made in it from 30 s on",
				"dir", "/"+dir, "err", err)
			ds.retryAt.Store(time.Now().Add(30 * time.Second).UnixNano())
		}
	}()
}

// grow estimates directory dir's entries if not done yet, and grows its
// buckets (or resumes a growth the record says is under way).
func (fs *FS) grow(dir string, ds *dirState) error {
	ctx := fs.bgCtx
	st := ds.get()
	to := st.Cur
	if st.From == nil {
		if !ds.counted.Load() {
			lp, err := fs.lowerDir(ctx, dir)
			if err != nil {
				return err
			}
			// Changes meanwhile are in the sample or not: off by those.
			before := ds.entries.Load()
			n, err := fs.estimate(ctx, lp, st.Cur)
			if err != nil {
				return err
			}
			ds.entries.Add(n - before)
			ds.counted.Store(true)
		}
		to.Buckets = need(ds.entries.Load(), ds.maxBucket, st.Cur.Buckets)
		if to.Buckets == st.Cur.Buckets {
			return nil
		}
	}
	return fs.run(ctx, dir, to, ds, nil)
}

// need is the bucket count for n entries at most maxBucket a bucket on
// average: from have, doubled as often as needed.
func need(n int64, maxBucket, have int) int {
	b := have
	for n > int64(maxBucket)*int64(b) && b < MaxBuckets {
		b *= 2
	}
	return b
}

// samples is how many buckets an estimate reads: keys are spread evenly,
// so a few buckets tell the average (their size is within a few percent
// of it at thousands of entries a bucket; exact with up to 4 buckets).
const samples = 4

// estimate is the number of entries of hash directory lp (layout l),
// from up to samples buckets spread over its key range.
func (fs *FS) estimate(ctx context.Context, lp string, l Layout) (int64, error) {
	k := min(samples, l.Buckets)
	var sum int64
	for i := 0; i < k; i++ {
		b := i * l.Buckets / k
		err := fs.list(ctx, join(lp, l.BucketName(b)), func(string) bool { sum++; return true })
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			return 0, err
		}
	}
	return sum * int64(l.Buckets) / int64(k), nil
}

// sized is hash layout l with as many buckets as directory lp (ds's)
// needs for its entries, counted all (a resharding without a layout
// given, under a growing policy): at most its max_bucket a bucket (the
// default's where it has none), never fewer than it has. A growth under
// way goes on to its own layout.
func (fs *FS) sized(ctx context.Context, lp string, ds *dirState, l Layout) (Layout, error) {
	grow := ds.maxBucket
	if grow == 0 {
		grow = DefaultMaxBucket
	}
	st := ds.get()
	if st != nil && st.From != nil {
		return st.Cur, nil
	}
	var n int64
	countIn := func(dir, skip string) error {
		err := fs.list(ctx, dir, func(name string) bool {
			if skip == "" || !strings.HasPrefix(name, skip) {
				n++
			}
			return true
		})
		if errors.Is(err, syscall.ENOENT) && dir != lp {
			return nil
		}
		return err
	}
	have := 1
	if st == nil {
		if err := countIn(lp, ""); err != nil {
			return Layout{}, err
		}
	} else {
		for _, b := range buckets(st) {
			if err := countIn(join(lp, b), ""); err != nil {
				return Layout{}, err
			}
		}
		if st.Cur.Scheme == Hash {
			have, l.Prefix = st.Cur.Buckets, st.Cur.Prefix
		}
	}
	l.Buckets = need(n, grow, have)
	return l, nil
}
