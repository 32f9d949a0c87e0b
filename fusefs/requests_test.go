//go:build linux

package fusefs_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

// nullMount mounts a null stack over a fresh local directory (the lower).
func nullMount(t *testing.T) (string, *mounttest.Mounted) {
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	return lower, mounttest.Mount(t, null.New(l))
}

// delta returns the requests of each kind that fn made on m's server.
func delta(m *mounttest.Mounted, fn func()) map[string]uint64 {
	before := m.Server.RequestCounts()
	fn()
	after := m.Server.RequestCounts()
	d := map[string]uint64{}
	for k, n := range after {
		if n > before[k] {
			d[k] = n - before[k]
		}
	}
	return d
}

// TestNoFlushReadOnly: the close of a file opened read-only sends no
// FLUSH (FOPEN_NOFLUSH: its Flush does nothing, layer.CapNoFlush); the
// close of a file opened for writing still does (it may report a delayed
// write's error).
func TestNoFlushReadOnly(t *testing.T) {
	_, m := nullMount(t)
	os.WriteFile(m.Path("f"), []byte("data"), 0o644)
	d := delta(m, func() {
		for range 20 {
			if b, err := os.ReadFile(m.Path("f")); err != nil || string(b) != "data" {
				t.Fatalf("read %q, %v", b, err)
			}
		}
	})
	if d["FLUSH"] != 0 || d["OPEN"] != 20 {
		t.Errorf("20 read-only opens and closes: %v (want 20 OPEN, no FLUSH)", d)
	}
	d = delta(m, func() {
		for range 5 {
			f, err := os.OpenFile(m.Path("f"), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("more")
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if d["FLUSH"] != 5 {
		t.Errorf("5 opens for writing: %v (want 5 FLUSH)", d)
	}
}

// TestExclusiveLocal: a stack over a local directory is the only writer
// of it (layer.Exclusive): the kernel keeps names and attributes past the
// 1 s of a shared lower, so a stat after 1.5 s costs no request; with the
// local layer's shared option, it costs a LOOKUP or GETATTR again.
func TestExclusiveLocal(t *testing.T) {
	for _, shared := range []bool{false, true} {
		lower := t.TempDir()
		os.MkdirAll(filepath.Join(lower, "d"), 0o755)
		os.WriteFile(filepath.Join(lower, "d", "f"), []byte("x"), 0o644)
		l, err := local.New(lower)
		if err != nil {
			t.Fatal(err)
		}
		if shared {
			l.SetShared()
		}
		m := mounttest.Mount(t, null.New(l))
		if _, err := os.Stat(m.Path("d", "f")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		d := delta(m, func() {
			if _, err := os.Stat(m.Path("d", "f")); err != nil {
				t.Fatal(err)
			}
		})
		asked := d["LOOKUP"] + d["GETATTR"] + d["STATX"]
		if !shared && asked != 0 {
			t.Errorf("exclusive: a stat 1.5 s after the last made %v", d)
		}
		if shared && asked == 0 {
			t.Errorf("shared: a stat 1.5 s after the last made no request (%v): the kernel kept it past the 1 s timeout", d)
		}
	}
}

// TestFlushWithoutChange: the close of a descriptor of a new file through
// which nothing was written (a shell's redirection: open, dup2, close)
// leaves the kernel's attributes alone, so the fstat after it costs no
// GETATTR; a close after a write through a shared mapping still makes the
// kernel fetch them (the mtime it shows moves: TestMmapMtimeAtClose).
func TestFlushWithoutChange(t *testing.T) {
	_, m := nullMount(t)
	d := delta(m, func() {
		fd, err := syscall.Open(m.Path("f"), syscall.O_WRONLY|syscall.O_CREAT|syscall.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fd2, err := syscall.Dup(fd)
		if err != nil {
			t.Fatal(err)
		}
		syscall.Close(fd) // FLUSH
		var st syscall.Stat_t
		if err := syscall.Fstat(fd2, &st); err != nil {
			t.Fatal(err)
		}
		syscall.Close(fd2)
	})
	if d["GETATTR"] != 0 || d["CREATE"] != 1 || d["FLUSH"] != 2 {
		t.Errorf("create, dup, close, fstat, close: %v (want 1 CREATE, 2 FLUSH, no GETATTR)", d)
	}
}

// TestMmapMtimeAtClose: a write through a shared mapping changes the
// lower's mtime at the page fault, unseen by the kernel; after the close,
// a stat through the mount shows the new mtime (as generic/080 checks),
// whatever the attribute timeout. (This sequence passes without the
// frontend's notice at close too; TestMmapWriteTimes, xfs_io's, is the one
// that needs it.)
func TestMmapMtimeAtClose(t *testing.T) {
	lower, m := nullMount(t)
	old := time.Unix(1000000000, 0)
	f, b := mappedFile(t, m.Path("f"), old)
	mounttest.MapCopyIn(t, b, "written through the mapping")
	if err := unix.Msync(b, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	syscall.Munmap(b)
	f.Close()
	fi, err := os.Stat(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().After(old) {
		t.Errorf("after a write through a mapping and close, the mount shows mtime %v (the lower: %v)", fi.ModTime(), statMtime(t, filepath.Join(lower, "f")))
	}
}

// mappedFile makes p, 4096 bytes with mtime old, opens it for reading and
// writing and maps it shared.
func mappedFile(t *testing.T, p string, old time.Time) (*os.File, []byte) {
	t.Helper()
	if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	return f, b
}

func statMtime(t *testing.T, p string) time.Time {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.ModTime()
}

// TestNoGetattrAfterSetattr: the attributes a SETATTR replies with are
// kept for the attribute timeout like a GETATTR's: a stat after a chmod,
// a chown, a utimes or a truncate costs no request, and shows the change.
func TestNoGetattrAfterSetattr(t *testing.T) {
	_, m := nullMount(t)
	if err := os.WriteFile(m.Path("f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	// (The write left the kernel's size and mtime stale: it fetches them
	// once.)
	if _, err := os.Stat(m.Path("f")); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(1000000000, 0)
	for _, step := range []struct {
		name string
		do   func() error
		ok   func(os.FileInfo) bool
	}{
		{"chmod", func() error { return os.Chmod(m.Path("f"), 0o600) }, func(fi os.FileInfo) bool { return fi.Mode().Perm() == 0o600 }},
		{"chown", func() error { return os.Chown(m.Path("f"), 65534, 65534) }, func(fi os.FileInfo) bool { return fi.Sys().(*syscall.Stat_t).Uid == 65534 }},
		{"utimes", func() error { return os.Chtimes(m.Path("f"), old, old) }, func(fi os.FileInfo) bool { return fi.ModTime().Equal(old) }},
		{"truncate", func() error { return os.Truncate(m.Path("f"), 2) }, func(fi os.FileInfo) bool { return fi.Size() == 2 }},
	} {
		var fi os.FileInfo
		var err error
		d := delta(m, func() {
			if err := step.do(); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
			if fi, err = os.Stat(m.Path("f")); err != nil {
				t.Fatal(err)
			}
		})
		if !step.ok(fi) {
			t.Errorf("%s: the stat after it shows %v, %v", step.name, fi.Mode(), fi.Sys())
		}
		if d["GETATTR"]+d["STATX"] != 0 {
			t.Errorf("%s and a stat: %v (want no GETATTR)", step.name, d)
		}
	}
}

// TestMappedWriteWhileOpen: a program that keeps a file open and writes
// through a shared mapping of it (a database): the kernel, which keeps an
// exclusive stack's attributes for a day, is told within about a second
// (watchMapped), so a stat shows the new mtime before the file is closed.
func TestMappedWriteWhileOpen(t *testing.T) {
	lower, m := nullMount(t)
	old := time.Unix(1000000000, 0)
	f, b := mappedFile(t, m.Path("f"), old)
	defer syscall.Munmap(b)
	defer f.Close()
	if fi, err := os.Stat(m.Path("f")); err != nil || !fi.ModTime().Equal(old) {
		t.Fatalf("before the write: %v, %v", fi.ModTime(), err)
	}
	mounttest.MapCopyIn(t, b, "written through the mapping")
	deadline := time.Now().Add(10 * time.Second)
	for {
		fi, err := os.Stat(m.Path("f"))
		if err != nil {
			t.Fatal(err)
		}
		if fi.ModTime().After(old) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after a write through a mapping, the mount shows mtime %v (the lower: %v)", fi.ModTime(), statMtime(t, filepath.Join(lower, "f")))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBackingOpenSendsNoLowerFlush: handing a file to the kernel
// (passthrough) costs its lower no FLUSH. The descriptor registered as the
// backing file is lent, not duplicated: closing a duplicate of a file of a
// FUSE or network lower is a FLUSH round trip (GlusterFS: one per open).
// The stack here is a null stack over the mount of another (a FUSE lower);
// each open for writing sends that lower two FLUSHes: the upper's at the
// close (the lower's delayed write errors) and its last close at RELEASE.
func TestBackingOpenSendsNoLowerFlush(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644)
	ll, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The lower mount passes nothing through: the kernel refuses a backing
	// file on a mount that has backing files of its own (ELOOP).
	lowerMnt := mounttest.MountOpts(t, null.New(ll), fusefs.Options{NoPassthrough: true})
	l, err := local.New(lowerMnt.Path(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() }) // after the unmount: the lower mount is not busy
	m := mounttest.Mount(t, null.New(l))
	before := lowerMnt.Server.RequestCounts()
	up := delta(m, func() {
		for range 5 {
			f, err := os.OpenFile(m.Path("f"), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString("more"); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if up["OPEN"] != 5 || up["WRITE"] != 0 {
		t.Fatalf("upper mount: %v (want 5 OPEN, no WRITE: passed through)", up)
	}
	// The upper's RELEASEs (and so its last closes below) come after the
	// closes return: wait for the fifth, then for anything more.
	flushes := func() uint64 { return lowerMnt.Server.RequestCounts()["FLUSH"] - before["FLUSH"] }
	for end := time.Now().Add(5 * time.Second); flushes() < 10 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if n := flushes(); n != 10 {
		t.Errorf("5 opens for writing through a stack over a FUSE lower: the lower got %d FLUSH (want 10)", n)
	}
}
