package glustertest_test

import (
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/glustertest"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/null"
)

func inoOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// GlusterFS's inode numbers are above 2^48, so the mount cannot show them
// under its own namespace bits (fusefs/ino.go) and hashes the identity.
// Two hard links keep one st_ino while the kernel forgets and looks them up
// again (a serial number kept while the kernel knew the object came apart
// between a FORGET and a racing LOOKUP), and the numbers are the same after
// a remount, whatever order the names are met in.
func TestInodeNumbersAboveTheNamespace(t *testing.T) {
	dir := glustertest.Dir(t, "one")
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Ino < 1<<48 {
		t.Fatalf("the GlusterFS directory's inode number %d fits in 48 bits: this test needs one that does not", st.Ino)
	}
	mount := func() *mounttest.Mounted {
		fs := null.New(localFS(t, dir))
		t.Cleanup(func() { layer.CloseStack(fs) })
		return mounttest.Mount(t, fs)
	}
	m := mount()
	for _, n := range []string{"a", "c"} {
		if err := os.WriteFile(m.Path(n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(m.Path("a"), m.Path("b")); err != nil {
		t.Fatal(err)
	}
	a, c := inoOf(t, m.Path("a")), inoOf(t, m.Path("c"))
	if a == c || inoOf(t, m.Path("b")) != a {
		t.Fatalf("st_ino: a %x, b %x, c %x", a, inoOf(t, m.Path("b")), c)
	}

	// Lookups of both names race the kernel's forgetting of the node. A few
	// drops only: drop_caches is the whole machine's, and other packages'
	// tests running beside this one count on their caches.
	for round := 0; round < 5; round++ {
		var wg sync.WaitGroup
		var got [2]uint64
		wg.Add(1)
		go func() {
			defer wg.Done()
			os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0)
		}()
		for i, n := range []string{"a", "b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var st syscall.Stat_t
				if syscall.Stat(m.Path(n), &st) == nil {
					got[i] = st.Ino
				}
			}()
		}
		wg.Wait()
		if got[0] != a || got[1] != a {
			t.Fatalf("two hard links apart while the kernel forgets: a %x, b %x, first %x", got[0], got[1], a)
		}
		time.Sleep(50 * time.Millisecond)
	}

	m.Unmount()
	m = mount()
	if cc, aa := inoOf(t, m.Path("c")), inoOf(t, m.Path("b")); cc != c || aa != a {
		t.Fatalf("after a remount: c %x (was %x), b %x (a was %x)", cc, c, aa, a)
	}
}
