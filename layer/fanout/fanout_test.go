package fanout

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/layer"
)

// fake is a branch with some directories and some free space.
type fake struct {
	layer.NotImplemented
	dirs  map[string]bool
	avail uint64
	bsize uint32
	err   error
}

func (f *fake) Getattr(_ context.Context, p string) (layer.Attr, error) {
	if f.dirs[p] {
		return layer.Attr{Mode: syscall.S_IFDIR | 0o755}, nil
	}
	return layer.Attr{}, syscall.ENOENT
}

func (f *fake) Statfs(context.Context, string) (layer.Statfs, error) {
	if f.err != nil {
		return layer.Statfs{}, f.err
	}
	return layer.Statfs{Blocks: 1000, Bfree: f.avail, Bavail: f.avail, Files: 10, Ffree: 5, Bsize: f.bsize, NameLen: 255}, nil
}

func TestPolicies(t *testing.T) {
	ctx := context.Background()
	root := map[string]bool{"": true}
	withD := map[string]bool{"": true, "d": true}
	bs := []Branch{
		{FS: &fake{dirs: withD, avail: 900, bsize: 4096}, Mode: RO}, // never chosen
		{FS: &fake{dirs: root, avail: 100, bsize: 4096}, Mode: RW},
		{FS: &fake{dirs: withD, avail: 50, bsize: 4096}, Mode: RW},
		{FS: &fake{dirs: withD, avail: 500, bsize: 4096}, Mode: RW},
		{FS: &fake{dirs: withD, avail: 800, bsize: 4096}, Mode: NC}, // never chosen
	}
	for _, c := range []struct {
		policy, path string
		want         int
		err          error
	}{
		{"ff", "d/x", 1, nil},
		{"epff", "d/x", 2, nil},
		{"epff", "e/x", -1, syscall.ENOENT},
		{"mfs", "d/x", 3, nil},
		{"lfs", "d/x", 2, nil},
		{"epmfs", "d/x", 3, nil},
		{"epmfs", "x", 3, nil},
		{"eplfs", "d/x", 2, nil},
		{"lus", "d/x", 3, nil}, // used: 900, 950, 500 blocks
	} {
		p, err := PolicyByName(c.policy)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Create(ctx, bs, c.path)
		if got != c.want || !errors.Is(err, c.err) && err != c.err {
			t.Errorf("%s for %s: %d %v, want %d %v", c.policy, c.path, got, err, c.want, c.err)
		}
	}
	p, _ := PolicyByName("rand")
	for i := 0; i < 50; i++ {
		if got, err := p.Create(ctx, bs, "x"); err != nil || bs[got].Mode != RW {
			t.Fatalf("rand chose %d (%v), not an RW branch", got, err)
		}
	}
	if _, err := p.Create(ctx, bs[:1], "x"); err != syscall.EROFS {
		t.Errorf("no RW branch: %v, want EROFS", err)
	}
	if _, err := PolicyByName("lpfrd"); err == nil {
		t.Error("an unknown policy name was taken")
	}
	// pfrd: as likely as the share of free space (100, 50, 500 of 650).
	p, _ = PolicyByName("pfrd")
	n := map[int]int{}
	for i := 0; i < 2000; i++ {
		got, err := p.Create(ctx, bs, "x")
		if err != nil {
			t.Fatal(err)
		}
		n[got]++
	}
	if n[3] < n[1] || n[1] < n[2] || n[0] != 0 || n[4] != 0 {
		t.Errorf("pfrd chose %v", n)
	}
	// A branch under its minimum free space gets nothing; all under it:
	// ENOSPC.
	mf := append([]Branch(nil), bs...)
	mf[3].MinFree = 501 * 4096
	if got, _ := Policies["mfs"].Create(ctx, mf, "d/x"); got != 1 {
		t.Errorf("mfs with branch 3 under its minimum: %d", got)
	}
	for i := range mf {
		mf[i].MinFree = 1 << 40
	}
	if _, err := Policies["ff"].Create(ctx, mf, "x"); err != syscall.ENOSPC {
		t.Errorf("every branch under its minimum: %v, want ENOSPC", err)
	}
	if m, err := ParseMode("nc"); err != nil || m != NC {
		t.Errorf("ParseMode(nc) = %v %v", m, err)
	}
}

func TestCombine(t *testing.T) {
	e := func(errs ...error) []error { return errs }
	if All(e(nil, nil)) != nil || All(e(nil, syscall.EIO, syscall.ENOSPC)) != syscall.EIO {
		t.Error("All: want the first error")
	}
	if Any(e(syscall.ENOENT, nil)) != nil {
		t.Error("Any: one success is success")
	}
	if Any(e(syscall.ENOENT, syscall.EACCES, syscall.EIO)) != syscall.EACCES {
		t.Error("Any: want the first error that is not ENOENT")
	}
	if Any(e(syscall.ENOENT, syscall.ENOENT)) != syscall.ENOENT {
		t.Error("Any: ENOENT everywhere is ENOENT")
	}
	n := 0
	errs := Each(3, false, func(i int) error { n += i; return nil })
	if n != 3 || len(errs) != 3 {
		t.Error("Each in order ran the wrong calls")
	}
	errs = Each(8, true, func(i int) error {
		if i == 5 {
			return syscall.EIO
		}
		return nil
	})
	if errs[5] != syscall.EIO || All(errs) != syscall.EIO {
		t.Errorf("Each in parallel: %v", errs)
	}
}

func TestStatfs(t *testing.T) {
	ctx := context.Background()
	st, err := Statfs(ctx, []layer.FS{
		&fake{avail: 100, bsize: 4096},
		&fake{avail: 10, bsize: 8192},
		&fake{err: syscall.EIO},
	})
	if err != nil || st.Bsize != 4096 || st.Blocks != 1000+2000 || st.Bavail != 100+20 || st.Files != 20 {
		t.Errorf("summed statfs %+v %v", st, err)
	}
	if _, err := Statfs(ctx, []layer.FS{&fake{err: syscall.EIO}}); err != syscall.EIO {
		t.Errorf("every branch failing: %v, want EIO", err)
	}
}

func (f *fake) Lowers() []layer.FS     { return nil }
func (f *fake) Changes() layer.Changes { return 0 }
func (f *fake) Close() error           { return nil }
