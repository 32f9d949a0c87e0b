//go:build linux

package fusefs_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/conformance"
	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

const uringParam = "/sys/module/fuse/parameters/enable_uring"

// enableURing turns the fuse module's enable_uring on for the test (the
// kernel reads it at each mount's INIT). Where it was off, it first checks
// that a mount asking for io_uring is refused, saying what to do, and that
// "auto" falls back to /dev/fuse. It turns it off again afterwards unless
// the suite runs over io_uring ($CAIRN_FUSE_TRANSPORT): other packages'
// mounts then need it on.
func enableURing(t testing.TB, lower string) {
	t.Helper()
	mounttest.NeedRoot(t)
	b, err := os.ReadFile(uringParam)
	if err != nil {
		t.Fatalf("this kernel has no FUSE over io_uring: %v", err)
	}
	if strings.TrimSpace(string(b)) == "Y" {
		t.Logf("%s is Y already: the refusal with N is not checked", uringParam)
		return
	}
	top := null.New(localTB(t, lower))
	_, err = fusefs.Mount(t.TempDir(), top, fusefs.Options{Transport: "uring"})
	if err == nil || !strings.Contains(err.Error(), "echo Y > "+uringParam) {
		t.Fatalf("mount over io_uring with enable_uring N: %v, want a refusal saying what to do", err)
	}
	m := mounttest.MountOpts(t, top, fusefs.Options{Transport: "auto"})
	if m.Server.Transport != "/dev/fuse" {
		t.Errorf("auto with enable_uring N is served by %s, want /dev/fuse", m.Server.Transport)
	}
	m.Unmount()
	if err := os.WriteFile(uringParam, []byte("Y"), 0); err != nil {
		t.Fatal(err)
	}
	if tr := os.Getenv("CAIRN_FUSE_TRANSPORT"); tr != "uring" && tr != "auto" {
		t.Cleanup(func() { os.WriteFile(uringParam, []byte("N"), 0) })
	}
}

// TestTransportIOUring serves a null stack over FUSE over io_uring: bytes in
// and out both ways (passthrough off, so that reads and writes go through
// the rings), directories, xattrs, renames, many requests at once (more
// than a queue's first entries), the fsx model, and the unmount.
func TestTransportIOUring(t *testing.T) {
	lower := t.TempDir()
	enableURing(t, lower)
	m := mounttest.MountOpts(t, null.New(localTB(t, lower)), fusefs.Options{Transport: "uring", AllowOther: true, NoPassthrough: true, AttrTimeout: -1})
	if m.Server.Transport != "io_uring" {
		t.Fatalf("served by %s, want io_uring", m.Server.Transport)
	}
	auto := mounttest.MountOpts(t, null.New(localTB(t, t.TempDir())), fusefs.Options{Transport: "auto"})
	if auto.Server.Transport != "io_uring" {
		t.Errorf("auto with enable_uring Y is served by %s, want io_uring", auto.Server.Transport)
	}

	// 3 MiB in writes of 1 MiB (the mount's max_write) and of odd sizes.
	data := make([]byte, 3<<20+12345)
	rand.Read(data)
	f, err := os.OpenFile(m.Path("big"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(data); {
		n := min(len(data)-off, 1<<20)
		if off > 0 && off < 2<<20 {
			n = min(n, 777)
		}
		if _, err := f.WriteAt(data[off:off+n], int64(off)); err != nil {
			t.Fatal(err)
		}
		off += n
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(lower + "/big"); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("lower big: %d bytes %v, want the %d written", len(b), err, len(data))
	}
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 0); n != len(data) || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes %v, not the bytes written", n, err)
	}
	f.Close()

	// A directory of 300 names (READDIRPLUS replies of many pages).
	os.Mkdir(m.Path("d"), 0o755)
	for i := 0; i < 300; i++ {
		if err := os.WriteFile(m.Path("d", fmt.Sprintf("name-%03d-%s", i, strings.Repeat("x", i%50))), []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if es, err := os.ReadDir(m.Path("d")); err != nil || len(es) != 300 {
		t.Fatalf("readdir: %d entries %v, want 300", len(es), err)
	}
	if err := unix.Setxattr(m.Path("big"), "user.k", []byte("value"), 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := unix.Getxattr(m.Path("big"), "user.k", buf); err != nil || string(buf[:n]) != "value" {
		t.Fatalf("getxattr: %q %v", buf[:n], err)
	}
	if n, err := unix.Listxattr(m.Path("big"), buf); err != nil || !strings.Contains(string(buf[:n]), "user.k") {
		t.Fatalf("listxattr: %q %v", buf[:n], err)
	}
	if _, err := unix.Getxattr(m.Path("big"), "user.none", buf); err != unix.ENODATA {
		t.Fatalf("getxattr of a missing name: %v, want ENODATA", err)
	}
	if err := os.Rename(m.Path("big"), m.Path("d", "big2")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lower + "/d/big2"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d/big2", m.Path("link")); err != nil {
		t.Fatal(err)
	}
	if s, err := os.Readlink(m.Path("link")); err != nil || s != "d/big2" {
		t.Fatalf("readlink: %q %v", s, err)
	}

	// Many callers at once, each stat a GETATTR (no attribute cache).
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				var st syscall.Stat_t
				name := m.Path("d", fmt.Sprintf("name-%03d-%s", i, strings.Repeat("x", i%50)))
				if err := syscall.Stat(name, &st); err != nil || st.Size != 1 {
					errs <- fmt.Errorf("stat %s: size %d %v", name, st.Size, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	os.Mkdir(m.Path("fsx"), 0o755)
	fsx.Run(t, fsx.Config{Dir: m.Path("fsx"), Files: 8, Ops: 2000, MaxSize: 256 << 10, MaxLen: 64 << 10})
	m.Unmount()
	auto.Unmount()
}

// TestConformanceOverIOUring runs the conformance suite (ext4 as the
// oracle, then the fsx models and the identity checks) over io_uring on the
// null stack (its files passed through) and the zstd stack (whose bytes all
// go through the rings).
func TestConformanceOverIOUring(t *testing.T) {
	enableURing(t, t.TempDir())
	t.Setenv("CAIRN_FUSE_TRANSPORT", "uring")
	conformanceStacks := []conformance.Stack{
		{Name: "null", Build: func(t testing.TB, d string) layer.FS { return null.New(localTB(t, d)) }, Plain: true},
		{Name: "zstd", Build: func(t testing.TB, d string) layer.FS {
			c, err := codec.New(localTB(t, d), "zstd", codec.Options{Level: 1})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, Limits: map[conformance.Limit]string{conformance.Holes: "codec stores whole chunks: SEEK_DATA/SEEK_HOLE and st_blocks show no holes"}},
	}
	for _, s := range conformanceStacks {
		t.Run(s.Name, func(t *testing.T) { conformance.Run(t, s) })
	}
}

func localTB(t testing.TB, d string) layer.FS {
	t.Helper()
	l, err := local.New(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkRequestCost times a request's round trip through a null stack
// over each transport, from one caller and from four at once: an fstat with
// no attribute cache is one GETATTR. "process" mounts with `cairn mount` in
// a process of its own (what a user runs); "inproc" serves the mount in the
// benchmark's own process, whose callers then share its Go scheduler with
// the server. As root:
//
//	go test -run '^$' -bench RequestCost -benchtime 100000x ./fusefs
//
// (it turns enable_uring on for the io_uring runs, and off again after).
func BenchmarkRequestCost(b *testing.B) {
	for _, where := range []string{"process", "inproc"} {
		for _, tr := range []string{"dev", "uring"} {
			for _, callers := range []int{1, 4} {
				b.Run(fmt.Sprintf("%s/%s/callers=%d", where, tr, callers), func(b *testing.B) {
					lower := b.TempDir()
					if tr == "uring" {
						enableURing(b, lower)
					}
					if err := os.WriteFile(lower+"/f", []byte("x"), 0o644); err != nil {
						b.Fatal(err)
					}
					var path string
					if where == "process" {
						spec := fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = \"null\"\nover = \"base\"\n", lower)
						path = mounttest.MountSpec(b, spec, "-transport", tr, "-attr-timeout", "-1s").Path("f")
					} else {
						path = mounttest.MountOpts(b, null.New(localTB(b, lower)), fusefs.Options{Transport: tr, AttrTimeout: -1}).Path("f")
					}
					f, err := os.Open(path)
					if err != nil {
						b.Fatal(err)
					}
					defer f.Close()
					fd := int(f.Fd())
					b.ResetTimer()
					var wg sync.WaitGroup
					for g := 0; g < callers; g++ {
						wg.Add(1)
						go func(n int) {
							defer wg.Done()
							var st unix.Stat_t
							for i := 0; i < n; i++ {
								if err := unix.Fstat(fd, &st); err != nil {
									b.Error(err)
									return
								}
							}
						}(b.N/callers + 1)
					}
					wg.Wait()
				})
			}
		}
	}
}
