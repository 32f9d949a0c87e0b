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
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairn/internal/mounttest"
	"cairn/layer"
	"cairn/layers/chains"
	"cairn/layers/local"
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
	time.Sleep(time.Second)
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
	// Closed links hold nothing (the kernel releases a file a little
	// after close returns).
	for i := 0; fs.ViewBytes() != 0; i++ {
		if i == 200 {
			t.Fatalf("%d bytes still held with no link open", fs.ViewBytes())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
