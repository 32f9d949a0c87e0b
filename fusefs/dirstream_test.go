//go:build linux

package fusefs_test

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

type dent struct {
	name string
	off  int64
}

// readBatch reads one batch from fd (a small buffer: many READDIRs).
func readBatch(t *testing.T, fd int) []dent {
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
		out = append(out, dent{string(name), off})
		b = b[reclen:]
	}
	return out
}

// TestDirStreamChurn: a listing through the mount that goes on while other
// names are created and removed lists every name that exists throughout
// exactly once, and no name twice (POSIX readdir); seekdir to a cookie
// telldir gave continues with the entry that followed it, as on ext4.
func TestDirStreamChurn(t *testing.T) {
	mounttest.Need(t)
	for _, name := range []string{"null", "crypt", "zstd"} {
		t.Run(name, func(t *testing.T) { churn(t, mountStack(t, name).m) })
	}
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, null.New(l))
	// telldir/seekdir: the mount and ext4 alike.
	oracle := t.TempDir()
	for i := 0; i < 300; i++ {
		os.WriteFile(fmt.Sprintf("%s/f%03d", oracle, i), nil, 0o644)
		os.WriteFile(m.Path(fmt.Sprintf("f%03d", i)), nil, 0o644)
	}
	for _, dirp := range []string{oracle, m.Dir} {
		fd, err := unix.Open(dirp, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		var all []dent
		for ds := readBatch(t, fd); len(ds) > 0; ds = readBatch(t, fd) {
			all = append(all, ds...)
		}
		for _, k := range []int{0, 1, 2, 7, len(all) / 2, len(all) - 2} {
			if _, err := unix.Seek(fd, all[k].off, 0); err != nil {
				t.Fatalf("%s: seekdir to the cookie of %s: %v", dirp, all[k].name, err)
			}
			if ds := readBatch(t, fd); len(ds) == 0 || ds[0].name != all[k+1].name {
				t.Errorf("%s: after seekdir to the cookie of %s, %v; want %s", dirp, all[k].name, ds[:min(len(ds), 1)], all[k+1].name)
			}
		}
		unix.Seek(fd, 0, 0)
		if ds := readBatch(t, fd); len(ds) == 0 || ds[0].name != all[0].name {
			t.Errorf("%s: rewinddir does not start again", dirp)
		}
		unix.Close(fd)
	}
}

// churn lists m's root three times while names come and go.
func churn(t *testing.T, m *mounttest.Mounted) {
	const stable = 2000
	for i := 0; i < stable; i++ {
		if err := os.WriteFile(m.Path(fmt.Sprintf("stable-%04d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			p := m.Path(fmt.Sprintf("churn-%d", i%500))
			if i%1000 < 500 {
				os.WriteFile(p, nil, 0o644)
			} else {
				os.Remove(p)
			}
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()
	for round := 0; round < 3; round++ {
		fd, err := unix.Open(m.Dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]int{}
		for {
			ds := readBatch(t, fd)
			if len(ds) == 0 {
				break
			}
			for _, d := range ds {
				seen[d.name]++
			}
		}
		unix.Close(fd)
		for name, n := range seen {
			if n > 1 {
				t.Errorf("round %d: %s listed %d times", round, name, n)
			}
		}
		for i := 0; i < stable; i++ {
			if n := seen[fmt.Sprintf("stable-%04d", i)]; n != 1 {
				t.Fatalf("round %d: stable-%04d listed %d times", round, i, n)
			}
		}
		if seen["."] != 1 || seen[".."] != 1 {
			t.Errorf("round %d: . and .. listed %d and %d times", round, seen["."], seen[".."])
		}
	}
}
