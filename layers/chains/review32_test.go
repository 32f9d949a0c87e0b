package chains_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/chains"
)

// abortFUSE aborts the FUSE connection of the mount at dir (found in
// /proc/self/mountinfo, as a stat of a hung mount would hang), if fusectl
// is mounted.
func abortFUSE(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == dir {
			if _, minor, ok := strings.Cut(f[2], ":"); ok {
				os.WriteFile("/sys/fs/fuse/connections/"+minor+"/abort", []byte("1"), 0)
			}
		}
	}
}

// TestLinkOpenDuringRenames: opens and stats of a link (whose view opens
// its target through the layer) while renames run beside them. The view
// took the layer's swap lock for reading a second time, under the open's
// or the stat's: a rename waiting for the write lock between the two
// blocked the inner one, and the open, the rename and every later
// operation of the layer waited for ever.
func TestLinkOpenDuringRenames(t *testing.T) {
	d := t.TempDir()
	m := mounttest.Mount(t, stack(t, d, "", "", nil))
	report := data(20000)
	if err := os.WriteFile(m.Path("report.txt"), report, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("r.gz"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := setLinkX(m.Path("r.gz"), "report.txt:gzip"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	finished := make(chan struct{})
	watchdog := time.AfterFunc(30*time.Second, func() {
		// Free the test's own blocked system calls, so that the panic
		// ends the process (fusectl, if mounted).
		var st unix.Stat_t
		if unix.Stat(d, &st) == nil {
			abortFUSE(m.Dir)
		}
		panic("opens of a link and renames did not finish in 30 s: deadlock")
	})
	defer watchdog.Stop()
	go func() {
		defer close(finished)
		var wg sync.WaitGroup
		stop := time.Now().Add(2 * time.Second)
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(stop) {
					if w == 3 {
						os.Stat(m.Path("r.gz"))
						continue
					}
					b, err := os.ReadFile(m.Path("r.gz"))
					if err != nil {
						t.Errorf("read the link: %v", err)
						return
					}
					z, err := gzip.NewReader(bytes.NewReader(b))
					if err != nil {
						t.Errorf("the link's view: %v", err)
						return
					}
					if got, err := io.ReadAll(z); err != nil || !bytes.Equal(got, report) {
						t.Errorf("the link's view: %d bytes, %v", len(got), err)
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				from, to := m.Path("a"), m.Path("b")
				if i%2 == 1 {
					from, to = to, from
				}
				if err := os.Rename(from, to); err != nil {
					t.Errorf("rename: %v", err)
					return
				}
			}
		}()
		wg.Wait()
	}()
	<-finished
}

// TestFstatAfterConversion: a file held open while its chain changes (the
// conversion renames a new file over it) keeps its descriptor, as a file
// renamed over on ext4 does: fstat(2) and reads of it succeed, with the
// old file's bytes; the path shows the converted file.
func TestFstatAfterConversion(t *testing.T) {
	d := t.TempDir()
	m := mounttest.Mount(t, stack(t, d, "", "", nil))
	want := data(5000)
	if err := os.WriteFile(m.Path("f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []string{"zstd", ""} {
		f, err := os.Open(m.Path("f"))
		if err != nil {
			t.Fatal(err)
		}
		if err := setChain(m.Path("f"), ch); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // past the kernel's attribute cache
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Errorf("fstat of a file open across a conversion to %q: %v", ch, err)
		} else if st.Size != int64(len(want)) {
			t.Errorf("fstat: size %d, want %d", st.Size, len(want))
		}
		b := make([]byte, len(want)+1)
		if n, err := f.ReadAt(b, 0); n != len(want) || !bytes.Equal(b[:n], want) {
			t.Errorf("read of a file open across a conversion to %q: %d bytes, %v", ch, n, err)
		}
		f.Close()
		mustRead(t, m.Path("f"), want)
	}
}

// TestWriteDuringConversion: a file opened for writing while its
// conversion copies it (after the conversion waited for the writers it
// had) and written and closed: the write is in the file afterwards (or the
// conversion fails with EBUSY and leaves the file as it was). The
// conversion renamed its copy, made without the write, over the file.
func TestWriteDuringConversion(t *testing.T) {
	d := t.TempDir()
	m := mounttest.Mount(t, stack(t, d, "", "", nil))
	p := m.Path("f")
	want := data(32 << 20)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- setChain(p, "zstd") }()
	for i := 0; ; i++ {
		if ents, _ := os.ReadDir(filepath.Join(d, chains.TmpDir)); len(ents) > 0 {
			break
		}
		if i == 5000 {
			t.Fatal("no conversion under way")
		}
		time.Sleep(200 * time.Microsecond)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("WRITTEN DURING THE CONVERSION"), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	copy(want, "WRITTEN DURING THE CONVERSION")
	err = <-done
	if err != nil && err != unix.EBUSY {
		t.Fatalf("conversion: %v", err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("after the conversion (%v): the file starts %q, want %q", err, got[:29], want[:29])
	}
}
