//go:build linux

package fusefs_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/chains"
	"cairnfs.dev/cairn/layers/fault"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
	"cairnfs.dev/cairn/layers/snoop"
)

// wbMount mounts a null stack over the directory lower with the writeback
// cache, its files served by the daemon (no passthrough: a passed-through
// file never reaches the cache); over is stacked between them if set.
func wbMount(t *testing.T, lower string, writeback bool, over func(layer.FS) layer.FS) *mounttest.Mounted {
	t.Helper()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	var top layer.FS = l
	if over != nil {
		top = over(top)
	}
	return mounttest.MountOpts(t, null.New(top), fusefs.Options{AllowOther: true, NoPassthrough: true, Writeback: writeback})
}

// TestWritebackRefused: the writeback cache only on an exclusive stack
// whose every layer takes it; the refusal says why.
func TestWritebackRefused(t *testing.T) {
	mounttest.Need(t)
	shared, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	shared.SetShared()
	excl, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sn, err := snoop.New(excl, snoop.Options{Output: "file", Log: filepath.Join(t.TempDir(), "log")})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := chains.New(excl, chains.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		top    layer.FS
		shared bool
		want   string
	}{
		{"shared lower", null.New(shared), false, "exclusive stack"},
		{"-shared", null.New(excl), true, "exclusive stack"},
		{"snoop", null.New(sn), false, "the snoop layer refuses"},
		{"acl", null.New(acl.New(excl, &acl.Rules{Default: true}, false, false)), false, "the acl layer refuses"},
		{"chains", null.New(ch), false, "the chains layer refuses"},
	} {
		_, err := fusefs.Mount(t.TempDir(), c.top, fusefs.Options{Writeback: true, Shared: c.shared})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: mount -writeback: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	if err := fusefs.WritebackRefused(null.New(excl), false); err != nil {
		t.Errorf("a null stack over a local directory: %v", err)
	}
}

// TestWritebackCounts: 4 KiB write(2)s reach the daemon as a few large
// WRITEs under the writeback cache, one each without it.
func TestWritebackCounts(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 256) // 4 KiB
	for _, wb := range []bool{false, true} {
		lower := t.TempDir()
		m := wbMount(t, lower, wb, nil)
		d := delta(m, func() {
			f, err := os.Create(m.Path("f"))
			if err != nil {
				t.Fatal(err)
			}
			for range 256 {
				if _, err := f.Write(data); err != nil {
					t.Fatal(err)
				}
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		})
		got, err := os.ReadFile(filepath.Join(lower, "f"))
		if err != nil || !bytes.Equal(got, bytes.Repeat(data, 256)) {
			t.Fatalf("writeback %v: the lower holds %d bytes (%v), want 1 MiB written", wb, len(got), err)
		}
		t.Logf("writeback %v: 256 writes of 4 KiB: %d WRITE requests", wb, d["WRITE"])
		if wb && d["WRITE"] > 8 || !wb && d["WRITE"] < 256 {
			t.Errorf("writeback %v: %d WRITE requests for 256 writes of 4 KiB", wb, d["WRITE"])
		}
	}
}

// TestWritebackWronlyPartial: writes of parts of pages through a file
// opened O_WRONLY: the kernel reads the rest of each page through that
// file (the daemon opened it O_RDWR below), and the bytes around them stay.
func TestWritebackWronlyPartial(t *testing.T) {
	lower := t.TempDir()
	want := make([]byte, 3*4096+100)
	for i := range want {
		want[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(lower, "f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	m := wbMount(t, lower, true, nil)
	d := delta(m, func() {
		f, err := os.OpenFile(m.Path("f"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []struct {
			off int64
			s   string
		}{{5, "abc"}, {4090, "across a page"}, {9000, "x"}, {int64(len(want)) - 3, "past the end"}, {20000, "after a hole"}} {
			if _, err := f.WriteAt([]byte(w.s), w.off); err != nil {
				t.Fatal(err)
			}
			if end := int(w.off) + len(w.s); end > len(want) {
				want = append(want, make([]byte, end-len(want))...)
			}
			copy(want[w.off:], w.s)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	})
	if d["READ"] == 0 {
		t.Errorf("no READ for partial pages of a file opened O_WRONLY (requests: %v): is the cache on?", d)
	}
	for _, p := range []string{m.Path("f"), filepath.Join(lower, "f")} {
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes (%v), differ from the %d written", p, len(got), err, len(want))
		}
	}
}

// TestWritebackAppend: two descriptors opened O_APPEND take turns; each
// write lands at the end, after the other's (the kernel places them, the
// daemon writes where it is told).
func TestWritebackAppend(t *testing.T) {
	lower := t.TempDir()
	want := []byte("start\n")
	os.WriteFile(filepath.Join(lower, "log"), want, 0o644)
	m := wbMount(t, lower, true, nil)
	var fs [2]*os.File
	for i := range fs {
		f, err := os.OpenFile(m.Path("log"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		fs[i] = f
	}
	for i := range 300 {
		s := fmt.Sprintf("%d:%s\n", i, strings.Repeat("y", i%50))
		if _, err := fs[i%2].WriteString(s); err != nil {
			t.Fatal(err)
		}
		want = append(want, s...)
		if i == 150 {
			if err := fs[0].Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range fs {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{m.Path("log"), filepath.Join(lower, "log")} {
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes (%v), want the %d appended in turn", p, len(got), err, len(want))
		}
	}
}

// TestWritebackAppendOnly: a lower file that is append-only (chattr +a),
// which may not be opened for writing without O_APPEND, is opened with it
// and served with direct I/O: appends work, other writes fail as on ext4.
func TestWritebackAppendOnly(t *testing.T) {
	lower := t.TempDir() // ext4 here: it keeps FS_APPEND_FL
	p := filepath.Join(lower, "a")
	os.WriteFile(p, []byte("one\n"), 0o644)
	if err := setFlags(p, fsAppendFl); err != nil {
		t.Fatalf("chattr +a on the lower (%s): %v", lower, err)
	}
	t.Cleanup(func() { setFlags(p, 0) })
	m := wbMount(t, lower, true, nil)
	if _, err := os.OpenFile(m.Path("a"), os.O_WRONLY, 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("open O_WRONLY of an append-only file: %v, want EPERM", err)
	}
	f, err := os.OpenFile(m.Path("a"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"two\n", "three\n"} {
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(p); string(got) != "one\ntwo\nthree\n" {
		t.Errorf("append-only file holds %q", got)
	}
}

// fsAppendFl is FS_APPEND_FL (chattr +a), which x/sys/unix does not name.
const fsAppendFl = 0x20

// TestWritebackErrorAtFsyncClose: with the cache, the lower's errors on
// the bytes written show at fsync(2) or close(2), not write(2), and are
// never lost: ENOSPC of a 16 MiB tmpfs filled by 24 MiB, EIO of a fault
// layer that fails every write. Each is reported once: at fsync, or at
// the close when no fsync came first.
func TestWritebackErrorAtFsyncClose(t *testing.T) {
	mounttest.NeedRoot(t)
	eio := func(l layer.FS) layer.FS {
		return fault.New(l, fault.Rules{{Names: []string{"write"}, Errno: syscall.EIO}}, false, false)
	}
	for _, c := range []struct {
		name  string
		size  int
		errno syscall.Errno
		over  func(layer.FS) layer.FS
	}{
		{"ENOSPC", 24 << 20, syscall.ENOSPC, nil},
		{"EIO", 1 << 20, syscall.EIO, eio},
	} {
		for _, fsync := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fsync=%v", c.name, fsync), func(t *testing.T) {
				lower := mounttest.TmpfsSize(t, "", "16m")
				m := wbMount(t, lower, true, c.over)
				f, err := os.Create(m.Path("big"))
				if err != nil {
					t.Fatal(err)
				}
				chunk := bytes.Repeat([]byte{'z'}, 1<<20)
				at := ""
				for i := 0; i < c.size; i += len(chunk) {
					if _, err := f.Write(chunk); err != nil {
						at = "write"
						if !errors.Is(err, c.errno) {
							t.Errorf("write: %v, want %v", err, c.errno)
						}
						break
					}
				}
				if at == "" && fsync {
					if err := f.Sync(); err != nil {
						at = "fsync"
						if !errors.Is(err, c.errno) {
							t.Errorf("fsync: %v, want %v", err, c.errno)
						}
					}
				}
				if err := f.Close(); err != nil {
					if at != "" {
						t.Errorf("close after the error was reported at %s: %v, want it reported once", at, err)
					}
					at = "close"
					if !errors.Is(err, c.errno) {
						t.Errorf("close: %v, want %v", err, c.errno)
					}
				}
				want := "close"
				if fsync {
					want = "fsync"
				}
				if at != want {
					t.Errorf("%v reported at %q, want at %s", c.errno, at, want)
				}
				// The mount works on once there is room.
				m.WaitReleased(t)
				if err := os.Remove(m.Path("big")); err != nil {
					t.Fatal(err)
				}
				if c.over == nil {
					if err := os.WriteFile(m.Path("small"), []byte("fits"), 0o644); err != nil {
						t.Errorf("a small file after the disk was freed: %v", err)
					}
				}
			})
		}
	}
}

// writebackSpec is a spec of the stack kind over lower with the
// writeback cache.
func writebackSpec(kind string, lowers ...string) string {
	s := "mount = \"top\"\nwriteback = true\n"
	switch kind {
	case "replica", "union":
		s += fmt.Sprintf("[layer.top]\ntype = %q\nover = [\"a\", \"b\"]\n[layer.a]\ntype = \"local\"\npath = %q\n[layer.b]\ntype = \"local\"\npath = %q\n", kind, lowers[0], lowers[1])
	default:
		s += fmt.Sprintf("[layer.top]\ntype = %q\nover = \"a\"\n[layer.a]\ntype = \"local\"\npath = %q\n", kind, lowers[0])
	}
	return s
}

// TestWritebackFsx runs the model (with mmap and hole punching) over
// writeback mounts of a replica of two, of a codec, of a union and of a
// shard layer, served by a cairn process; the replicas then hold the same
// bytes.
func TestWritebackFsx(t *testing.T) {
	for _, kind := range []string{"replica", "zstd", "union", "shard"} {
		t.Run(kind, func(t *testing.T) {
			lowers := []string{t.TempDir(), t.TempDir()}
			p := mounttest.MountSpec(t, writebackSpec(kind, lowers...))
			if log, _ := os.ReadFile(p.Log); !bytes.Contains(log, []byte("writeback=true")) {
				t.Fatalf("the daemon does not say it mounted with the writeback cache:\n%s", log)
			}
			fsx.Run(t, fsx.Config{Dir: p.Dir, Ops: 5000, Mmap: true, Punch: true, MaxSize: 512 << 10})
			p.Unmount()
			if kind == "replica" {
				for i := range 3 {
					name := fmt.Sprintf("fsx-%d", i)
					a, errA := os.ReadFile(filepath.Join(lowers[0], name))
					b, errB := os.ReadFile(filepath.Join(lowers[1], name))
					if errA != nil || errB != nil || !bytes.Equal(a, b) {
						t.Errorf("%s: the replicas differ (%d and %d bytes; %v %v)", name, len(a), len(b), errA, errB)
					}
				}
			}
		})
	}
}

// TestWritebackMmap: bytes written through a shared mapping reach the
// lower at msync, and at munmap and close.
func TestWritebackMmap(t *testing.T) {
	lowers := []string{t.TempDir(), t.TempDir()}
	p := mounttest.MountSpec(t, writebackSpec("replica", lowers...))
	want := bytes.Repeat([]byte("m"), 3*4096+10)
	if err := os.WriteFile(p.Path("f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p.Path("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	mounttest.MapCopyIn(t, b[100:], "first")
	copy(want[100:], "first")
	if err := unix.Msync(b, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	for _, l := range lowers {
		if got, _ := os.ReadFile(filepath.Join(l, "f")); !bytes.Equal(got, want) {
			t.Errorf("%s after msync: the bytes written through the mapping are not there", l)
		}
	}
	mounttest.MapCopyIn(t, b[3*4096+2:], "second")
	copy(want[3*4096+2:], "second")
	if err := unix.Munmap(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, l := range lowers {
		if got, _ := os.ReadFile(filepath.Join(l, "f")); !bytes.Equal(got, want) {
			t.Errorf("%s after munmap and close: the bytes written through the mapping are not there", l)
		}
	}
}

// TestWritebackKill: what was fsync'ed before the daemon was killed
// (kill -9) is there after a new mount; what was not may be lost with the
// kernel's cache, as on a machine that crashes, and the files stay whole.
func TestWritebackKill(t *testing.T) {
	for _, kind := range []string{"replica", "zstd"} {
		t.Run(kind, func(t *testing.T) {
			lowers := []string{t.TempDir(), t.TempDir()}
			p := mounttest.MountSpec(t, writebackSpec(kind, lowers...))
			synced := bytes.Repeat([]byte("fsync'ed\n"), 100000)
			f, err := os.Create(p.Path("synced"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(synced); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			// More writes, to this file and another, left in the cache.
			if _, err := f.WriteAt([]byte("later"), 3); err != nil {
				t.Fatal(err)
			}
			g, err := os.Create(p.Path("unsynced"))
			if err != nil {
				t.Fatal(err)
			}
			g.Write(bytes.Repeat([]byte("u"), 1<<20))
			p.Kill()
			f.Close()
			g.Close()
			p.Restart()
			got, err := os.ReadFile(p.Path("synced"))
			if err != nil {
				t.Fatal(err)
			}
			// The write after the fsync may or may not have reached
			// the lower before the kill.
			alt := append([]byte(nil), synced...)
			copy(alt[3:], "later")
			if !bytes.Equal(got, synced) && !bytes.Equal(got, alt) {
				t.Errorf("the fsync'ed file after kill -9 and a new mount: %d bytes, want the %d fsync'ed", len(got), len(synced))
			}
			if _, err := os.ReadFile(p.Path("unsynced")); err != nil {
				t.Errorf("the file not fsync'ed cannot be read after kill -9 and a new mount: %v", err)
			}
		})
	}
}

// TestWritebackSeekData: SEEK_DATA and SEEK_HOLE never call a hole the
// bytes still in the kernel's cache (the lower has none of them yet).
func TestWritebackSeekData(t *testing.T) {
	lower := t.TempDir()
	m := wbMount(t, lower, true, nil)
	f, err := os.Create(m.Path("sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(bytes.Repeat([]byte{1}, 4096), 1<<20); err != nil {
		t.Fatal(err)
	}
	data, err := unix.Seek(int(f.Fd()), 0, unix.SEEK_DATA)
	if err != nil || data > 1<<20 {
		t.Errorf("SEEK_DATA from 0: %d, %v; want at most 1 MiB, where the bytes are", data, err)
	}
	hole, err := unix.Seek(int(f.Fd()), 1<<20, unix.SEEK_HOLE)
	if err != nil || hole != 1<<20+4096 {
		t.Errorf("SEEK_HOLE from 1 MiB: %d, %v; want the end, 1 MiB + 4 KiB", hole, err)
	}
}

// TestWritebackNoPassthrough: the kernel passes no file through on a
// mount with the writeback cache; the mount says so, and serves the files
// a null stack would pass through itself, without asking the kernel for
// backing files it would refuse.
func TestWritebackNoPassthrough(t *testing.T) {
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	m := mounttest.MountOpts(t, null.New(l), fusefs.Options{Writeback: true})
	if m.Server.Passthrough {
		t.Errorf("a writeback mount says its files may be passed through")
	}
	d := delta(m, func() {
		if err := os.WriteFile(m.Path("f"), bytes.Repeat([]byte("w"), 64<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if d["WRITE"] == 0 {
		t.Errorf("no WRITE reached the daemon (requests %v): was the file passed through?", d)
	}
}

// TestWritebackCopyRange: copy_file_range from a file whose bytes are
// still in the kernel's cache copies them (the kernel writes both ranges
// back before it asks the daemon).
func TestWritebackCopyRange(t *testing.T) {
	lower := t.TempDir()
	m := wbMount(t, lower, true, nil)
	src, err := os.Create(m.Path("src"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(m.Path("dst"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	want := bytes.Repeat([]byte("copy me "), 4096)
	if _, err := src.Write(want); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.Write([]byte("old bytes, to be overwritten")); err != nil {
		t.Fatal(err)
	}
	var off0, off1 int64
	for done := 0; done < len(want); {
		n, err := unix.CopyFileRange(int(src.Fd()), &off0, int(dst.Fd()), &off1, len(want)-done, 0)
		if err != nil || n == 0 {
			t.Fatalf("copy_file_range: %d, %v", n, err)
		}
		done += n
	}
	got := make([]byte, len(want)+10)
	n, _ := dst.ReadAt(got, 0)
	if !bytes.Equal(got[:n], want) {
		t.Errorf("the copy holds %d bytes, not the %d written and still cached", n, len(want))
	}
}

// TestWritebackTmpfile: a file made with O_TMPFILE|O_WRONLY is written
// through the cache (the kernel reads partial pages through it), then
// named with linkat.
func TestWritebackTmpfile(t *testing.T) {
	lower := t.TempDir()
	m := wbMount(t, lower, true, nil)
	fd, err := unix.Open(m.Dir, unix.O_TMPFILE|unix.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("t"), 10000)
	if _, err := unix.Pwrite(fd, want, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, []byte("mid"), 5000); err != nil {
		t.Fatal(err)
	}
	copy(want[5000:], "mid")
	if err := unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.AT_FDCWD, m.Path("named"), unix.AT_SYMLINK_FOLLOW); err != nil {
		t.Fatal(err)
	}
	if err := unix.Close(fd); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{m.Path("named"), filepath.Join(lower, "named")} {
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes (%v), want the %d written", p, len(got), err, len(want))
		}
	}
}

// TestWritebackReopen: an open of a file whose pages are dirty keeps them
// (FOPEN_KEEP_CACHE): without it the kernel wrote each page back in a
// WRITE of its own before the open (2048 WRITEs for 8 MiB).
func TestWritebackReopen(t *testing.T) {
	lower := t.TempDir()
	m := wbMount(t, lower, true, nil)
	f, err := os.Create(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := bytes.Repeat([]byte("0123456789abcdef"), 8<<16) // 8 MiB
	for i := 0; i < len(want); i += 4096 {
		if _, err := f.Write(want[i : i+4096]); err != nil {
			t.Fatal(err)
		}
	}
	var got []byte
	d := delta(m, func() {
		got, err = os.ReadFile(m.Path("f"))
	})
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("a second open reads %d bytes (%v), want the %d written", len(got), err, len(want))
	}
	if d["WRITE"] > 16 {
		t.Errorf("an open of a file with 8 MiB dirty cost %d WRITEs (requests %v)", d["WRITE"], d)
	}
}
