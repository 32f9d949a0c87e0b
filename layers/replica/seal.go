package replica

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"syscall"
	"time"

	"cairnfs.dev/cairn/layer"
)

// Changes made to a replica outside cairn while it was unmounted. Every
// change of an object moves its change time (ctime), or its directory's
// (creates, unlinks, renames, writes, truncates, chmod, chown, xattrs,
// utimes), and no user can set a ctime. So at a clean unmount (Close) the
// layer seals each healthy replica: it records in the replica's state the
// replica's own clock reading after its last change (the ctime of its
// root after a last write there, then waits until that clock has moved on,
// so that a change made right after the unmount has a later ctime), and
// the root's own attributes (whose ctime the seal itself moves). A mount
// (Claim) reads the seals, removes them (a crash then leaves none), and
// looks, in the background, for an object whose ctime is after its
// replica's seal and not after the mount began; reads stay off a replica
// until its walk is done. A replica found changed is degraded and marked
// diverged in the state: `cairn resync` then compares it in full with the
// first healthy replica and makes it a copy. A replica without a seal (its
// last mount crashed or was killed) cannot be checked: the mount says so.

// seal is a replica's record of a clean unmount.
type seal struct {
	Ctime  layer.Time `json:"ctime"`  // the replica's clock after its last change
	Mode   uint32     `json:"mode"`   // the root's attributes, which the seal's own write
	Uid    uint32     `json:"uid"`    // leaves alone but for the ctime
	Gid    uint32     `json:"gid"`    //
	Mtime  layer.Time `json:"mtime"`  //
	Xattrs string     `json:"xattrs"` // a hash of the root's extended attributes (but the layer's own)
}

const keyTick = "tick"

func later(a, b layer.Time) bool { return a.Sec > b.Sec || a.Sec == b.Sec && a.Nsec > b.Nsec }

// clock reads replica i's clock after waiting for it to move on: it gives
// t, a reading that every change made to the replica before the call has a
// ctime not after, and every change made after it a ctime after (a change
// of the root's side data, whose ctime is read back, until it moves: at
// most a tick of the replica's kernel clock, or a second on a lower whose
// times are in seconds).
func (fs *FS) clock(ctx context.Context, i int) (layer.Time, error) {
	var t layer.Time
	defer fs.meta[i].Remove(ctx, "", keyTick)
	start := time.Now()
	for n := 0; ; n++ {
		if err := fs.meta[i].Set(ctx, "", keyTick, binary.LittleEndian.AppendUint32(nil, uint32(n))); err != nil {
			return t, err
		}
		a, err := fs.r[i].Getattr(ctx, "")
		if err != nil {
			return t, err
		}
		switch {
		case n == 0:
			t = a.Ctime
		case later(a.Ctime, t):
			return t, nil
		case time.Since(start) > 3*time.Second: // a lower that keeps seconds moves within one
			return t, errors.New("its clock (the ctime of its root) does not move")
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// rootSeal is what a seal records of replica i's root.
func (fs *FS) rootSeal(ctx context.Context, i int) (seal, error) {
	a, err := fs.r[i].Getattr(ctx, "")
	if err != nil {
		return seal{}, err
	}
	names, err := listXattr(ctx, fs.r[i], "")
	if err != nil && !errors.Is(err, syscall.EOPNOTSUPP) {
		return seal{}, err
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		if fs.own(n) {
			continue
		}
		v, err := getXattr(ctx, fs.r[i], "", n)
		if err != nil {
			return seal{}, err
		}
		h.Write([]byte(n + "\x00"))
		h.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(v))))
		h.Write(v)
	}
	return seal{Mode: a.Mode, Uid: a.Uid, Gid: a.Gid, Mtime: a.Mtime, Xattrs: hex.EncodeToString(h.Sum(nil))}, nil
}

// sealAll seals every healthy replica that was checked (fs.mu held), at
// the end of a mount or a resync.
func (fs *FS) sealAll(ctx context.Context) {
	if fs.state.Set == "" || fs.unlock == nil {
		return
	}
	ctx = layer.AsSelf(ctx)
	for i := range fs.r {
		if !fs.Healthy(i) || fs.unverified.Load()&(1<<i) != 0 {
			continue
		}
		t, err := fs.clock(ctx, i)
		var s seal
		if err == nil {
			s, err = fs.rootSeal(ctx, i)
		}
		if err == nil {
			s.Ctime = t
			st := fs.state
			st.Seal = &s
			v, _ := json.Marshal(st)
			err = fs.meta[i].Set(ctx, "", keyState, v)
		}
		if err != nil {
			fs.log.Warn("replica: a replica could not be sealed: the next mount cannot tell changes made to it outside cairn",
				"replica", i+1, "dir", layer.LowerDir(fs.r[i]), "err", err)
		}
	}
}

// window: a ctime after after and not after upto is a change made outside
// cairn while the replica was unmounted.
type window struct{ after, upto layer.Time }

func (w window) in(t layer.Time) bool { return later(t, w.after) && !later(t, w.upto) }

// changedIn walks replica i's tree (through its lower stack, one stat per
// object) and gives the first path whose ctime is in w; n counts the
// objects seen. Objects that go while it walks (the mount's changes) are
// passed over.
func (fs *FS) changedIn(ctx context.Context, i int, w window, n *int64) (string, error) {
	l := fs.r[i]
	var walk func(p string) (string, error)
	walk = func(p string) (string, error) {
		d, err := layer.OpenDir(ctx, l, p)
		if err != nil {
			return "", gone(err)
		}
		var dirs []string
		for {
			if err := ctx.Err(); err != nil {
				d.Close()
				return "", err
			}
			e, _, err := d.Next(ctx, true)
			if err == io.EOF {
				break
			}
			if err != nil {
				d.Close()
				return "", gone(err)
			}
			cp := layer.Join(p, e.Name)
			if hidden(cp) {
				continue // made by the claim, before the window ends
			}
			*n++
			a := e.Attr
			if a == nil {
				x, err := l.Getattr(ctx, cp)
				if err != nil {
					if err := gone(err); err != nil {
						d.Close()
						return "", err
					}
					continue
				}
				a = &x
			}
			if w.in(a.Ctime) {
				d.Close()
				return cp, nil
			}
			if a.IsDir() {
				dirs = append(dirs, cp)
			}
		}
		d.Close()
		for _, c := range dirs {
			if f, err := walk(c); f != "" || err != nil {
				return f, err
			}
		}
		return "", nil
	}
	return walk("")
}

// gone passes over an object that went while the walk was under way.
func gone(err error) error {
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	return err
}

// check is one mount's (or resync's) look for changes made outside cairn.
type check struct {
	due   map[int]window // replicas to walk
	found map[int]string // replicas found changed: the first path
}

// prepare reads the seals that load found (fs.seals): it compares each
// sealed replica's root with its seal and gives the replicas to walk, with
// the start of their windows (the end is set by begin). noSeal says, for
// a mount, which healthy replicas have none.
func (fs *FS) prepare(ctx context.Context) (c *check, noSeal []int, err error) {
	ctx = layer.AsSelf(ctx)
	c = &check{due: map[int]window{}, found: map[int]string{}}
	for i := range fs.r {
		if !fs.Healthy(i) {
			continue
		}
		s := fs.seals[i]
		if s == nil {
			noSeal = append(noSeal, i)
			continue
		}
		r, err := fs.rootSeal(ctx, i)
		if err != nil {
			return nil, nil, fmt.Errorf("replica: reading replica %d's root: %w", i+1, err)
		}
		r.Ctime = s.Ctime
		if r != *s {
			c.found[i] = ""
			continue
		}
		c.due[i] = window{after: s.Ctime, upto: layer.Time{Sec: 1 << 62}}
	}
	return c, noSeal, nil
}

// begin ends each window at the replica's clock now (after the seals are
// removed, before the mount serves): what the mount changes is after it.
// A replica whose clock cannot be read is not walked.
func (fs *FS) begin(ctx context.Context, c *check) {
	ctx = layer.AsSelf(ctx)
	for i, w := range c.due {
		t, err := fs.clock(ctx, i)
		if err != nil {
			fs.log.Warn("replica: a replica's clock cannot be read: changes made to it outside cairn are not looked for",
				"replica", i+1, "dir", layer.LowerDir(fs.r[i]), "err", err)
			delete(c.due, i)
			continue
		}
		w.upto = t
		c.due[i] = w
	}
}

// walk walks one replica of the check; it reports whether it finished.
func (fs *FS) walk(ctx context.Context, c *check, i int) bool {
	start := time.Now()
	var n int64
	p, err := fs.changedIn(layer.AsSelf(ctx), i, c.due[i], &n)
	if err != nil {
		if ctx.Err() == nil {
			fs.log.Warn("replica: the check for changes made outside cairn failed", "replica", i+1, "dir", layer.LowerDir(fs.r[i]), "err", err)
		}
		return false
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if p != "" {
		c.found[i] = p
		return true
	}
	fs.unverified.And(^uint32(1 << i))
	fs.log.Info("replica: no change made outside cairn since the last unmount", "replica", i+1, "dir", layer.LowerDir(fs.r[i]),
		"objects", n, "took", time.Since(start).Round(time.Microsecond).String())
	return true
}

// decide degrades the replicas found changed, and gives one line for each.
// When every healthy replica was changed, the primary is kept (one must
// serve) and said to be.
func (fs *FS) decide(c *check) []string {
	if len(c.found) == 0 {
		return nil
	}
	var ks []int
	var names []string
	for k := range c.found {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for _, k := range ks {
		names = append(names, fmt.Sprint(k+1))
	}
	changed := strings.Join(names, ", ")
	keep := -1
	if len(c.found) >= len(fs.healthy()) {
		keep = fs.primary()
	}
	var msgs []string
	where := func(k int) string {
		if c.found[k] == "" {
			return "its root directory's attributes"
		}
		return "/" + c.found[k]
	}
	for _, k := range ks {
		wasPrimary := k == fs.primary()
		if k == keep || !fs.diverge(k) {
			m := fmt.Sprintf("every replica was changed outside cairn while unmounted (replicas %s): replica %d (%s, first change found: %s) is kept and serves; the others are degraded: run 'cairn resync SPEC' to make them copies of it",
				changed, k+1, layer.LowerDir(fs.r[k]), where(k))
			fs.log.Error("replica: "+m, "replica", k+1, "dir", layer.LowerDir(fs.r[k]), "path", where(k), "changed", changed)
			msgs = append(msgs, m)
			continue
		}
		src := fs.primary()
		what := "a replica"
		if wasPrimary {
			what = "the primary replica"
		}
		m := fmt.Sprintf("%s was changed outside cairn while unmounted: replica %d (%s), first change found: %s; it is degraded (replicas changed: %s; replica %d serves): run 'cairn resync SPEC' to make it a copy of replica %d again",
			what, k+1, layer.LowerDir(fs.r[k]), where(k), changed, src+1, src+1)
		fs.log.Error("replica: "+m, "replica", k+1, "dir", layer.LowerDir(fs.r[k]), "path", where(k), "changed", changed)
		msgs = append(msgs, m)
	}
	fs.mu.Lock()
	fs.unverified.Store(0)
	fs.mu.Unlock()
	return msgs
}

// diverge degrades replica k, found changed outside cairn, and records it
// in the state (resync then compares it in full); false if it is the last
// healthy one.
func (fs *FS) diverge(k int) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	d := fs.degraded.Load()
	if d&(1<<k) != 0 {
		return true
	}
	if len(fs.r)-popcount(d) <= 1 {
		return false
	}
	fs.degraded.Store(d | 1<<k)
	fs.epoch.Add(1)
	clear(fs.marked)
	fs.state.Diverged |= 1 << k
	fs.saveState(context.Background())
	return true
}

// verify runs the check: in the background for a mount (done is closed
// when it is over), in place for a resync.
func (fs *FS) verify(ctx context.Context, c *check, background bool) []string {
	fs.mu.Lock()
	for i := range c.due {
		fs.unverified.Or(1 << i)
	}
	for i := range c.found {
		fs.unverified.Or(1 << i)
	}
	fs.mu.Unlock()
	run := func() []string {
		done := make(chan bool, len(c.due))
		for i := range c.due {
			go func() { done <- fs.walk(ctx, c, i) }()
		}
		ok := true
		for range c.due {
			ok = <-done && ok
		}
		if !ok {
			return nil // interrupted (unmounted): the replicas not checked are not sealed
		}
		return fs.decide(c)
	}
	if !background {
		return run()
	}
	fs.checking.Add(1)
	go func() {
		defer fs.checking.Done()
		run()
	}()
	return nil
}
