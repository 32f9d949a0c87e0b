// Package fanout is what every fan-out layer (mux, union, replica, shard)
// needs and should not write again: branches with modes, policies that
// choose a branch (mergerfs's, by name), running an operation on several
// branches and combining their errors, and a file system summed over
// branches. Objects that come up from branch i are tagged with
// layer.TagBranch, as layer's docs say; the layer's own bookkeeping runs
// under layer.AsSelf.
package fanout

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"syscall"

	"cairnfs.dev/cairn/layer"
)

// Mode is what a branch may be used for (mergerfs's RW, RO, NC).
type Mode int

const (
	RW Mode = iota // read-write
	RO             // read-only: never written, nothing created
	NC             // no create: existing objects are written, new ones go elsewhere
)

var modeNames = []string{"RW", "RO", "NC"}

func (m Mode) String() string { return modeNames[m] }

// ParseMode reads "RW", "RO" or "NC" (any case).
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if strings.EqualFold(s, n) {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown branch mode %q (known: RW, RO, NC)", s)
}

// Branch is one lower of a fan-out layer.
type Branch struct {
	FS   layer.FS
	Mode Mode
	// MinFree is the free space (bytes available to unprivileged users)
	// below which the branch gets no new objects (mergerfs's
	// minfreespace); 0: no minimum.
	MinFree uint64
}

// Policy chooses the branch that gets a new object (create, mkdir, mknod,
// symlink, the target of a copy-up).
type Policy interface {
	// Create returns the index in bs of the branch for a new object at
	// path, among the RW branches; EROFS if there is none.
	Create(ctx context.Context, bs []Branch, path string) (int, error)
}

// Policies are the policies by name: mergerfs's create policies. Each
// chooses among the RW branches with at least their MinFree of free space.
//   - ff: first found, the first RW branch;
//   - epff: existing path, first found: the first RW branch that has the
//     new object's parent directory;
//   - mfs, lfs: the RW branch with the most (least) free space;
//   - lus: the RW branch with the least used space;
//   - epmfs, eplfs: among those that have the parent directory, the most
//     (least) free;
//   - rand: a random RW branch;
//   - pfrd: a random RW branch, each as likely as its share of the free
//     space.
var Policies = map[string]Policy{
	"ff":    choose{},
	"epff":  choose{existing: true},
	"mfs":   choose{space: +1},
	"lfs":   choose{space: -1},
	"lus":   choose{space: -1, used: true},
	"epmfs": choose{existing: true, space: +1},
	"eplfs": choose{existing: true, space: -1},
	"rand":  choose{random: true},
	"pfrd":  choose{random: true, space: +1},
}

// PolicyNames are the names of Policies, sorted.
func PolicyNames() []string {
	var n []string
	for k := range Policies {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// PolicyByName returns the named policy.
func PolicyByName(name string) (Policy, error) {
	if p, ok := Policies[name]; ok {
		return p, nil
	}
	return nil, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(PolicyNames(), ", "))
}

type choose struct {
	existing bool
	space    int  // +1 most free, -1 least free, 0 first
	used     bool // space counts used space, not free
	random   bool // with space: weighted by free space
}

// free is branch b's free space (bytes available) and used space.
func free(ctx context.Context, b Branch) (avail, used uint64, err error) {
	st, err := b.FS.Statfs(ctx, "")
	if err != nil {
		return 0, 0, err
	}
	return st.Bavail * uint64(st.Bsize), (st.Blocks - st.Bfree) * uint64(st.Bsize), nil
}

func (c choose) Create(ctx context.Context, bs []Branch, path string) (int, error) {
	var cand []int
	full := false
	for i, b := range bs {
		if b.Mode != RW {
			continue
		}
		if b.MinFree > 0 {
			if avail, _, err := free(ctx, b); err != nil || avail < b.MinFree {
				full = true
				continue
			}
		}
		cand = append(cand, i)
	}
	if len(cand) == 0 {
		if full {
			return -1, syscall.ENOSPC
		}
		return -1, syscall.EROFS
	}
	if c.existing {
		dir, _ := layer.Split(path)
		var has []int
		for _, i := range cand {
			if a, err := bs[i].FS.Getattr(ctx, dir); err == nil && a.IsDir() {
				has = append(has, i)
			}
		}
		if len(has) == 0 {
			return -1, syscall.ENOENT
		}
		cand = has
	}
	switch {
	case c.random && c.space == 0:
		return cand[rand.IntN(len(cand))], nil
	case c.random:
		var total uint64
		frees := make([]uint64, len(cand))
		for k, i := range cand {
			frees[k], _, _ = free(ctx, bs[i])
			total += frees[k]
		}
		if total == 0 {
			return cand[rand.IntN(len(cand))], nil
		}
		r := rand.Uint64N(total)
		for k, f := range frees {
			if r < f {
				return cand[k], nil
			}
			r -= f
		}
		return cand[len(cand)-1], nil
	case c.space != 0:
		best, bestV := -1, uint64(0)
		for _, i := range cand {
			avail, used, err := free(ctx, bs[i])
			if err != nil {
				continue
			}
			v := avail
			if c.used {
				v = used
			}
			if best < 0 || c.space > 0 && v > bestV || c.space < 0 && v < bestV {
				best, bestV = i, v
			}
		}
		if best < 0 {
			return -1, syscall.EIO
		}
		return best, nil
	}
	return cand[0], nil
}

// Each runs fn for i in [0, n), at once on every branch when parallel, and
// returns each one's error.
func Each(n int, parallel bool, fn func(i int) error) []error {
	errs := make([]error, n)
	if !parallel {
		for i := range errs {
			errs[i] = fn(i)
		}
		return errs
	}
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = fn(i) }()
	}
	wg.Wait()
	return errs
}

// All is the result of an operation that must succeed on every branch:
// the first error, nil if none.
func All(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Any is the result of an operation that succeeds if it succeeds on one
// branch: nil if one did; otherwise the most telling error, the first
// that is not ENOENT (a branch that lacks the object says least), else
// ENOENT.
func Any(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			return nil
		}
		if first == nil || errors.Is(first, syscall.ENOENT) && !errors.Is(err, syscall.ENOENT) {
			first = err
		}
	}
	return first
}

// Statfs sums the branches' statfs (as mergerfs does): blocks and files
// add up, in the first branch's block size; the name length is the
// smallest. Branches that fail are left out, unless all do.
func Statfs(ctx context.Context, fss []layer.FS) (layer.Statfs, error) {
	sts := make([]layer.Statfs, len(fss))
	errs := Each(len(fss), true, func(i int) (err error) {
		sts[i], err = fss[i].Statfs(ctx, "")
		return err
	})
	var sum layer.Statfs
	got := 0
	for i, st := range sts {
		if errs[i] != nil {
			continue
		}
		if got == 0 {
			sum.Bsize, sum.Frsize, sum.NameLen = st.Bsize, st.Frsize, st.NameLen
		}
		got++
		scale := func(n uint64) uint64 {
			if st.Bsize == sum.Bsize || sum.Bsize == 0 {
				return n
			}
			return n * uint64(st.Bsize) / uint64(sum.Bsize)
		}
		sum.Blocks += scale(st.Blocks)
		sum.Bfree += scale(st.Bfree)
		sum.Bavail += scale(st.Bavail)
		sum.Files += st.Files
		sum.Ffree += st.Ffree
		sum.NameLen = min(sum.NameLen, st.NameLen)
	}
	if got == 0 {
		return layer.Statfs{}, All(errs)
	}
	return sum, nil
}

// File is an open file of branch I of a fan-out layer with N branches: its
// attributes are tagged with the branch (layer.TagBranch), then given to
// Show, if set (a union's copy shows its original's identity).
type File struct {
	layer.BaseFile
	I, N int
	Show func(*layer.Attr)
}

// LendFd forwards the branch file's descriptor, as PassthroughFd does.
func (f *File) LendFd(fn func(fd int)) bool { return layer.LendFd(f.Lower, fn) }

func (f *File) tag(a *layer.Attr) {
	layer.TagBranch(a, f.I, f.N)
	if f.Show != nil {
		f.Show(a)
	}
}

func (f *File) Getattr(ctx context.Context) (layer.Attr, error) {
	a, err := f.Lower.Getattr(ctx)
	f.tag(&a)
	return a, err
}

func (f *File) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	a, err := f.Lower.Setattr(ctx, in)
	f.tag(&a)
	return a, err
}
