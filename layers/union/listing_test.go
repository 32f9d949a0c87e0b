//go:build linux

package union_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/layers/union"
)

type dent struct {
	name string
	off  int64
}

// getdents reads one small batch of fd's listing (as readdir(3) does,
// several per directory).
func getdents(t *testing.T, fd int) []dent {
	t.Helper()
	buf := make([]byte, 1024)
	n, err := unix.Getdents(fd, buf)
	if err != nil {
		t.Fatal(err)
	}
	var out []dent
	for b := buf[:n]; len(b) > 0; {
		off := *(*int64)(unsafe.Pointer(&b[8]))
		reclen := int(*(*uint16)(unsafe.Pointer(&b[16])))
		name := b[19:reclen]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		if s := string(name); s != "." && s != ".." {
			out = append(out, dent{s, off})
		}
		b = b[reclen:]
	}
	return out
}

// TestMergedListing: a directory whose names are on both branches (some
// on both, some hidden by whiteouts) is listed through the mount as a
// stream: each name once, as the upper branch shows it, whiteouts' names
// not at all, while other names are created and removed on the upper
// branch meanwhile; seekdir to any cookie, in either branch's part,
// continues with the entry that followed it; and the daemon's heap does
// not grow with a directory of 10^5 lower names.
func TestMergedListing(t *testing.T) {
	upper, lower := t.TempDir(), t.TempDir()
	const n = 3000
	for i := range n {
		os.WriteFile(filepath.Join(lower, fmt.Sprintf("lo-%05d", i)), nil, 0o644)
	}
	m := mountUnion(t, upper, lower)
	want := map[string]bool{}
	for i := range n {
		want[fmt.Sprintf("lo-%05d", i)] = true
	}
	for i := 0; i < n; i += 7 { // copied up: on both branches
		if err := os.WriteFile(m.Path(fmt.Sprintf("lo-%05d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := 3; i < n; i += 11 { // removed: a whiteout on the upper branch
		if err := os.Remove(m.Path(fmt.Sprintf("lo-%05d", i))); err != nil {
			t.Fatal(err)
		}
		delete(want, fmt.Sprintf("lo-%05d", i))
	}
	for i := range 500 {
		p := fmt.Sprintf("up-%04d", i)
		os.WriteFile(m.Path(p), nil, 0o644)
		want[p] = true
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			p := m.Path(fmt.Sprintf("churn-%d", i%300))
			if i%600 < 300 {
				os.WriteFile(p, nil, 0o644)
			} else {
				os.Remove(p)
			}
		}
	}()
	fd, err := unix.Open(m.Dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var all []dent
	seen := map[string]int{}
	for ds := getdents(t, fd); len(ds) > 0; ds = getdents(t, fd) {
		for _, d := range ds {
			seen[d.name]++
			if want[d.name] {
				all = append(all, d)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	for name, c := range seen {
		if c > 1 {
			t.Errorf("%s listed %d times", name, c)
		}
	}
	for name := range want {
		if seen[name] != 1 {
			t.Errorf("%s listed %d times, want once", name, seen[name])
		}
	}
	for _, k := range []int{0, 1, 250, 499, 500, 501, len(all) / 2, len(all) - 2} {
		if _, err := unix.Seek(fd, all[k].off, 0); err != nil {
			t.Fatalf("seekdir to the cookie of %s: %v", all[k].name, err)
		}
		var next string
		for _, d := range getdents(t, fd) {
			if want[d.name] {
				next = d.name
				break
			}
		}
		if next != all[k+1].name {
			t.Errorf("after seekdir to the cookie of %s: %q, want %q", all[k].name, next, all[k+1].name)
		}
	}

}

// TestMergedListingMemory: the union's stream of a directory of 2x10^4
// names (10^6 with CAIRN_LONG=1) on the lower branch (and a few on the upper) keeps the heap bounded: it
// holds no listing, and remembers at most maxSeen names of the upper
// branch. (Through a mount, go-fuse keeps a node per READDIRPLUS entry
// until the kernel forgets it: that is the frontend's, not the stream's.)
func TestMergedListingMemory(t *testing.T) {
	upper, lower := t.TempDir(), t.TempDir()
	n := 20000
	if os.Getenv("CAIRN_LONG") == "1" {
		n = 1000000
	}
	for i := range n {
		f, err := os.Create(filepath.Join(lower, fmt.Sprintf("file-with-a-long-name-%06d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for i := range 100 {
		os.WriteFile(filepath.Join(upper, fmt.Sprintf("up-%d", i)), nil, 0o644)
	}
	u, err := union.New([]fanout.Branch{{FS: localFS(t, upper), Mode: fanout.RW}, {FS: localFS(t, lower), Mode: fanout.RO}}, union.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer layer.CloseStack(u)
	ctx := context.Background()
	runtime.GC()
	var before, now runtime.MemStats
	runtime.ReadMemStats(&before)
	peak := before.HeapAlloc
	d, err := u.OpenDir(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	count := 0
	for {
		_, _, err := d.Next(ctx, true)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if count++; count%2000 == 0 {
			runtime.GC() // what the stream holds, not what it let go
			runtime.ReadMemStats(&now)
			peak = max(peak, now.HeapAlloc)
		}
	}
	if count != n+100 {
		t.Errorf("%d entries, want %d", count, n+100)
	}
	grew := int64(peak) - int64(before.HeapAlloc)
	t.Logf("heap peak %d KiB over the start, listing %d entries", grew>>10, count)
	if grew > 2<<20 {
		t.Errorf("listing %d lower names grew the heap by %d MiB", n, grew>>20)
	}
}
