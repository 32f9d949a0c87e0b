//go:build linux

package chains_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/chains"
	"cairnfs.dev/cairn/layers/local"
)

// smallTmpfs mounts a tmpfs of size bytes on a new directory, for a lower
// that fills up.
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	mounttest.NeedRoot(t)
	d := t.TempDir()
	if err := syscall.Mount("cairn-test", d, "tmpfs", 0, "size="+size+",mode=0755"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(d, 0); err != nil {
			syscall.Unmount(d, syscall.MNT_DETACH)
		}
	})
	return d
}

// fsckClean runs the layer's fsck over a fresh stack on d and fails the
// test for each file it reports.
func fsckClean(t *testing.T, d string) {
	t.Helper()
	ctx := context.Background()
	fs := stack(t, d, "", "", nil)
	if err := fs.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	sum, err := fs.Fsck(ctx, layer.CheckOnly, func(int, int, string) {}, func(r layer.FileReport) {
		if !r.OK {
			t.Errorf("fsck: %s", r.Text)
		}
	})
	if err != nil || sum.Bad != 0 {
		t.Errorf("fsck: %+v, %v", sum, err)
	}
	fs.Close()
}

// TestNestedChainFull: a file under a chain of two codec links (gzip over
// zstd) written until its lower, a small tmpfs, is full: the application
// gets ENOSPC; afterwards fsck is clean and the file reads without error,
// as a prefix of what was written that holds at least what fsync
// acknowledged. (The outer link's records were accepted into the inner
// link's memory and failed only when the inner one wrote them out, after
// the outer one had put them in its index: fsck then found a corrupt
// chunk, and reading stopped with EIO.)
func TestNestedChainFull(t *testing.T) {
	for _, tc := range []struct {
		chain string
		sync  bool // fsync after each MiB
	}{{"gzip,zstd", false}, {"gzip,zstd", true}, {"zstd,zstd,copy", false}} {
		ch := tc.chain
		t.Run(fmt.Sprintf("%s-sync=%v", strings.ReplaceAll(ch, ",", "-"), tc.sync), func(t *testing.T) {
			d := smallTmpfs(t, "4m")
			fs := stack(t, d, "", "", nil)
			m := mounttest.Mount(t, fs)
			p := m.Path("g")
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := setChain(p, ch); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			all := make([]byte, 12<<20)
			for i := range all {
				all[i] = byte(r.Uint32())
			}
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			var synced, off int
			var werr error
			for off < len(all) {
				n, err := f.Write(all[off : off+1<<20])
				off += n
				if err != nil {
					werr = err
					break
				}
				if tc.sync {
					if err := f.Sync(); err != nil {
						werr = err
						break
					}
					synced = off
				}
			}
			cerr := f.Close()
			if !errors.Is(werr, unix.ENOSPC) {
				t.Errorf("writing %d bytes to a %s file on a 4 MiB lower: %v (close: %v), want ENOSPC", off, ch, werr, cerr)
			}
			if tc.sync && synced == 0 {
				t.Fatalf("nothing was acknowledged by fsync before the disk filled (%d written)", off)
			}
			m.Unmount()
			fs.Close() // its links write out what they hold; the cleanup closes the rest
			fsckClean(t, d)
			m = mounttest.Mount(t, stack(t, d, "", "", nil))
			got, err := os.ReadFile(m.Path("g"))
			if err != nil {
				t.Errorf("reading the file after ENOSPC: %d bytes, %v", len(got), err)
			}
			if len(got) < synced || !bytes.Equal(got, all[:len(got)]) {
				t.Errorf("after ENOSPC the file reads %d bytes (a prefix: %v); %d were acknowledged by fsync", len(got), bytes.Equal(got, all[:min(len(got), len(all))]), synced)
			}
			if c := getChain(t, m.Path("g")); c != ch {
				t.Errorf("chain %q, want %q", c, ch)
			}
		})
	}
}

// TestLinkTargetTooLong: a link target longer than a path, or with a name
// longer than a name, is ENAMETOOLONG (it used to reach the lower's xattr
// size limit: ENOSPC on ext4).
func TestLinkTargetTooLong(t *testing.T) {
	m := mounttest.Mount(t, stack(t, t.TempDir(), "", "", nil))
	p := m.Path("l")
	os.WriteFile(p, nil, 0o644)
	long := strings.Repeat("d/", 2500) + "t"
	for v, want := range map[string]error{
		long + ":gzip":                         unix.ENAMETOOLONG,
		strings.Repeat("x", 256) + ":gzip":     unix.ENAMETOOLONG,
		"d/" + strings.Repeat("x", 256) + ":x": unix.ENAMETOOLONG,
		strings.Repeat("x", 255) + ":gzip":     nil,
	} {
		if err := setLinkX(p, v); !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Errorf("link to a target of %d bytes: %v, want %v", len(v), err, want)
		}
	}
}

// TestReadKeepsMtime: under a chain of two codec links, a read after a
// write and close changes no time: neither its close nor the stack's
// letting go of the file later (unmount here) writes the header the top
// link left in the link below. (That header stayed in the link below
// until the next close of the file, a read's, and moved mtime then.)
func TestReadKeepsMtime(t *testing.T) {
	d := t.TempDir()
	fs := stack(t, d, "", "*.zg=zstd,gzip", nil)
	m := mounttest.Mount(t, fs)
	p := m.Path("f.zg")
	var want []byte
	for i := 1; i <= 20000; i++ {
		want = fmt.Appendf(want, "%d\n", i)
	}
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	mtime := func(p string) unix.Timespec {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st.Mtim
	}
	// The kernel releases the file a little after close(2) returns, and
	// the release writes (the top link's header, the settle): let it land.
	// Times have nanoseconds: any later write moves them.
	m.WaitReleased(t)
	before, lower := mtime(p), mtime(filepath.Join(d, "f.zg"))
	mustRead(t, p, want)
	if got := mtime(p); got != before {
		t.Errorf("mtime through the mount moved from %v to %v after a read", before, got)
	}
	m.Unmount()
	fs.Close()
	if got := mtime(filepath.Join(d, "f.zg")); got != lower {
		t.Errorf("mtime of the lower file moved from %v to %v after a read and unmount", lower, got)
	}
}

// TestViewBudget: the views of open transformation links hold at most the
// layer's budget together, however many are open: an open that does not
// fit waits, then fails with ENOMEM; a close makes room. (Each open held
// up to 256 MiB until its close: N opens, N times that.)
func TestViewBudget(t *testing.T) {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const budget = 1 << 20
	fs, err := chains.New(l, chains.Options{ViewBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	m := mounttest.Mount(t, fs)
	target := data(400 << 10)
	os.WriteFile(m.Path("t"), target, 0o644)
	for i := range 8 {
		p := m.Path(fmt.Sprint("l", i))
		os.WriteFile(p, nil, 0o644)
		if err := setLinkX(p, "t:stored"); err != nil {
			t.Fatal(err)
		}
	}
	var open []*os.File
	for i := range 2 {
		f, err := os.Open(m.Path(fmt.Sprint("l", i)))
		if err != nil {
			t.Fatalf("open of link %d: %v", i, err)
		}
		open = append(open, f)
	}
	if n := fs.ViewBytes(); n != 2*int64(len(target)) {
		t.Errorf("two open links hold %d bytes, want %d", n, 2*len(target))
	}
	if _, err := os.Open(m.Path("l2")); !errors.Is(err, unix.ENOMEM) {
		t.Errorf("a third open of a link beyond the budget: %v, want ENOMEM", err)
	}
	open[0].Close()
	f, err := os.Open(m.Path("l2"))
	if err != nil {
		t.Fatalf("an open after a close made room: %v", err)
	}
	got := make([]byte, len(target)+1)
	if n, _ := f.ReadAt(got, 0); !bytes.Equal(got[:n], target) {
		t.Errorf("the link reads %d bytes, not its target", n)
	}
	f.Close()
	open[1].Close()
	// Many at once: the bytes held never pass the budget; every open
	// either reads its view or fails with ENOMEM.
	stop := make(chan struct{})
	var peak int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			peak = max(peak, fs.ViewBytes())
		}
	}()
	errs := make(chan error, 8)
	for i := range 8 {
		go func() {
			var err error
			for range 5 {
				b, rerr := os.ReadFile(m.Path(fmt.Sprint("l", i)))
				if rerr != nil && !errors.Is(rerr, unix.ENOMEM) || rerr == nil && !bytes.Equal(b, target) {
					err = fmt.Errorf("link %d: %d bytes, %v", i, len(b), rerr)
				}
			}
			errs <- err
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(stop)
	<-done
	if peak > budget {
		t.Errorf("the views held %d bytes at once, more than the budget of %d", peak, budget)
	}
	// Closed links hold nothing once released (the kernel releases a
	// file a little after close returns).
	m.WaitReleased(t)
	if n := fs.ViewBytes(); n != 0 {
		t.Fatalf("%d bytes still held with no link open", n)
	}
}

// TestReleaseAfterRename: a file under a chain of two links is closed
// after another file, of another chain, was renamed over its name (a
// release through FUSE comes after the close(2), so after whatever the
// application did next). The release settles the closed file's links; it
// did that by path, and so loaded the other file into an engine of the
// wrong chain, which compacted it behind its own engine's back: reading it
// then failed with EIO ("record at N is not the one the index names").
// Found by TestModel (CAIRN_FSX_SEED=1795674739417310407).
func TestReleaseAfterRename(t *testing.T) {
	d := t.TempDir()
	fs := stack(t, d, "", "a=copy,gzip;b=uuencode", nil)
	ctx := context.Background()
	create := func(p string) layer.File {
		f, _, err := fs.Create(ctx, p, unix.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	write := func(f layer.File, b []byte, off int64) {
		if n, err := f.WriteAt(ctx, b, off); err != nil || n != len(b) {
			t.Fatalf("write: %d, %v", n, err)
		}
		if err := f.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fa := create("a")
	write(fa, data(100<<10), 0)
	// b: overwritten several times, so that most of its log is dead (what
	// a compaction would rewrite), and still open, so its header is stale.
	// (more dead bytes than the codec's compaction threshold, 1 MiB).
	fb := create("b")
	want := data(256 << 10)
	for i := range 6 {
		want[i] ^= 0xff
		write(fb, want, 0)
	}
	if err := fs.Rename(ctx, "b", "a", 0); err != nil {
		t.Fatal(err)
	}
	if err := fa.Release(ctx); err != nil {
		t.Fatal(err)
	}
	check := func(f layer.File) {
		t.Helper()
		got := make([]byte, len(want)+1)
		n, err := f.ReadAt(ctx, got, 0)
		if n != len(want) || !bytes.Equal(got[:n], want) {
			t.Fatalf("read %d bytes (%v), want the %d written", n, err, len(want))
		}
	}
	check(fb)
	tail := data(1000)
	write(fb, tail, int64(len(want)))
	want = append(want, tail...)
	check(fb)
	if err := fb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	f, err := fs.Open(ctx, "a", unix.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	check(f)
	f.Release(ctx)
	layer.CloseStack(fs)
	fsckClean(t, d)
}

// TestConvertUnderLoad: while one process changes the chains of two files
// and swaps their names (renameat2 RENAME_EXCHANGE and plain renames),
// others read and stat them through the mount: every read gives one of the
// two files' bytes whole, every size is one of theirs, and afterwards fsck
// finds the lower clean. (An operation that read one file's chain and then
// acted, by path, on the other would load it into an engine of the wrong
// chain; the kernel failed an open with EIO when it reached a node whose
// file a conversion had replaced, and read it as the other file.) An open
// or a stat that loses the race against two conversions in a row may fail
// with ESTALE, as on NFS: the kernel looks the name up again once.
func TestConvertUnderLoad(t *testing.T) {
	d := t.TempDir()
	fs := stack(t, d, "", "", nil)
	m := mounttest.Mount(t, fs)
	x, y := data(300<<10), bytes.Repeat([]byte("cairn "), 50<<10)
	for n, b := range map[string][]byte{"x": x, "y": y} {
		if err := os.WriteFile(m.Path(n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	errs := make(chan error, 16)
	done := make(chan struct{})
	var stale atomic.Int64
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				p := m.Path([]string{"x", "y"}[(i+w)%2])
				if w == 2 {
					var st unix.Stat_t
					if err := unix.Stat(p, &st); err == unix.ESTALE {
						stale.Add(1)
						continue
					} else if err != nil {
						errs <- fmt.Errorf("stat: %w", err)
						return
					}
					if st.Size != int64(len(x)) && st.Size != int64(len(y)) {
						errs <- fmt.Errorf("stat %s: size %d, neither file's", p, st.Size)
						return
					}
					continue
				}
				b, err := os.ReadFile(p)
				if errors.Is(err, unix.ESTALE) {
					stale.Add(1)
					continue
				} else if err != nil {
					errs <- fmt.Errorf("read: %w", err)
					return
				}
				if !bytes.Equal(b, x) && !bytes.Equal(b, y) {
					errs <- fmt.Errorf("read %s: %d bytes, neither file's", p, len(b))
					return
				}
			}
		}()
	}
	choices := []string{"", "zstd", "gzip", "copy,zstd,lz4", "uuencode", "lz4,copy"}
	r := rand.New(rand.NewPCG(1, 2))
	ops := 0
	for time.Now().Before(deadline) && len(errs) == 0 {
		switch r.IntN(3) {
		case 0:
			if err := unix.Renameat2(unix.AT_FDCWD, m.Path("x"), unix.AT_FDCWD, m.Path("y"), layer.RenameExchange); err != nil {
				t.Fatal(err)
			}
		default:
			n := []string{"x", "y"}[r.IntN(2)]
			if err := setChain(m.Path(n), choices[r.IntN(len(choices))]); err != nil && err != unix.EBUSY {
				t.Fatalf("setfattr %s: %v", n, err)
			}
		}
		ops++
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d conversions and swaps; %d opens and stats lost the race (ESTALE)", ops, stale.Load())
	m.Unmount()
	layer.CloseStack(fs)
	fsckClean(t, d)
}
