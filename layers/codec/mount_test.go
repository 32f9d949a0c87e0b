//go:build linux

package codec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// fsxOps is the number of model operations per codec through an in-process
// mount (CAIRN_FSX_OPS overrides every run; CAIRN_LONG=1 multiplies).
func fsxOps(t *testing.T, n int) int {
	if os.Getenv("CAIRN_LONG") == "1" {
		return 10 * n
	}
	// Under go test's default 10-minute timeout (test.sh gives 60), a
	// timed-out test process hangs on its own mounts: run fewer.
	if d, ok := t.Deadline(); ok && time.Until(d) < 15*time.Minute {
		t.Logf("less than 15 minutes before the test deadline: %d operations instead of %d (run with -timeout 60m for all)", n/5, n)
		return n / 5
	}
	return n
}

func fastLevel(name string) int {
	switch name {
	case "gzip", "zstd":
		return 1
	}
	return 0
}

// TestFsxMount runs the model on every codec at once: the runs wait on
// FUSE round trips more than they compute, so they overlap well (t.Run from
// several goroutines, whatever -parallel says).
func TestFsxMount(t *testing.T) {
	var wg sync.WaitGroup
	for _, name := range codecNames {
		wg.Go(func() {
			t.Run(name, func(t *testing.T) {
				// Small chunks: many chunk boundaries, cheap encodings (the
				// fastest levels: the model checks the engine, not the codec's
				// ratio), so that 100,000 operations per codec fit in CI with
				// the race detector.
				lower, fs := newStack(t, name, Options{ChunkSize: 4 << 10, FastTails: true, CompactMin: 128 << 10, Level: fastLevel(name)})
				m := mounttest.Mount(t, fs)
				if m.Server.Passthrough {
					t.Fatal("a codec stack must not use passthrough")
				}
				fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: fsxOps(t, 100000), Punch: true, MaxSize: 256 << 10, MaxLen: 16 << 10})
				// After unmounting, a fresh stack reads the same files.
				var files [][]byte
				for i := 0; i < 3; i++ {
					b, err := os.ReadFile(m.Path(fmt.Sprintf("fsx-%d", i)))
					if err != nil {
						t.Fatal(err)
					}
					files = append(files, b)
				}
				m.Unmount()
				layer.CloseStack(fs) // no fold of its own under the fresh stack
				fresh := newStackAt(t, lower, name, Options{})
				for i, want := range files {
					got, err := layer.ReadFile(context.Background(), fresh, "fsx-"+strconv.Itoa(i))
					if err != nil || !bytes.Equal(got, want) {
						t.Fatalf("fresh stack reads fsx-%d differently (%v): %d bytes, want %d", i, err, len(got), len(want))
					}
					rep, err := fresh.Check(context.Background(), "fsx-"+strconv.Itoa(i), CheckOnly)
					if err != nil || !rep.OK() {
						t.Fatalf("fsck of fsx-%d: %+v %v", i, rep, err)
					}
				}
			})
		})
	}
	wg.Wait()
}

// TestFsxDeltas runs the model where writes in the middle are deltas:
// files of up to 4 MiB in 16 KiB chunks, more than the engine keeps decoded
// (1 MiB), so that most writes land in chunks it has not decoded, writes
// of up to 8 KiB (deltas under half a chunk), a fold 5 ms after each last
// close, and every 200 operations a read through the engine itself (not
// the kernel's page cache) compared with the model.
func TestFsxDeltas(t *testing.T) {
	var wg sync.WaitGroup
	for _, name := range []string{"copy", "zstd"} {
		wg.Go(func() {
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				lower, fs := newStack(t, name, Options{ChunkSize: 16 << 10, FastTails: true, CompactMin: 256 << 10, FoldDelay: 5 * time.Millisecond, Level: fastLevel(name)})
				m := mounttest.Mount(t, fs)
				fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: fsxOps(t, 20000), Punch: true, MaxSize: 4 << 20, MaxLen: 8 << 10, CheckEvery: 200,
					Check: func(name string, want []byte) error {
						got, err := layer.ReadFile(ctx, fs, name)
						if err == nil && !bytes.Equal(got, want) {
							err = fmt.Errorf("the engine reads %d bytes, want %d, first difference at %d", len(got), len(want), firstDiff(got, want))
						}
						return err
					}})
				var files [][]byte
				for i := 0; i < 3; i++ {
					b, err := os.ReadFile(m.Path(fmt.Sprintf("fsx-%d", i)))
					if err != nil {
						t.Fatal(err)
					}
					files = append(files, b)
				}
				m.Unmount()
				layer.CloseStack(fs) // no fold of its own under the fresh stack
				fresh := newStackAt(t, lower, name, Options{})
				for i, want := range files {
					got, err := layer.ReadFile(ctx, fresh, "fsx-"+strconv.Itoa(i))
					if err != nil || !bytes.Equal(got, want) {
						t.Fatalf("fresh stack reads fsx-%d differently (%v): %d bytes, want %d", i, err, len(got), len(want))
					}
					rep, err := fresh.Check(ctx, "fsx-"+strconv.Itoa(i), CheckOnly)
					if err != nil || !rep.OK() {
						t.Fatalf("fsck of fsx-%d: %+v %v", i, rep, err)
					}
				}
			})
		})
	}
	wg.Wait()
}

// TestFsxMmapProcess runs the model with mmap against a cairn process.
func TestFsxMmapProcess(t *testing.T) {
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			lower := t.TempDir()
			p := mounttest.MountSpec(t, fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = %q\nover = \"base\"\nchunk_size = \"16KiB\"\n", lower, name))
			fsx.Run(t, fsx.Config{Dir: p.Dir, Ops: fsxOps(t, 5000), Mmap: true, Punch: true, MaxSize: 512 << 10})
			p.Unmount()
		})
	}
}

// TestSeekAndCopyRange: SEEK_DATA/SEEK_HOLE see chunk holes; a
// copy_file_range between files of the mount copies the bytes.
func TestSeekAndCopyRange(t *testing.T) {
	lower, fs := newStack(t, "zstd", Options{ChunkSize: 4096, FastTails: true, Level: 3})
	m := mounttest.Mount(t, fs)
	f, err := os.OpenFile(m.Path("s"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), 40960)
	fd := int(f.Fd())
	for _, c := range []struct {
		off    int64
		whence int
		want   int64
	}{{0, unix.SEEK_DATA, 0}, {0, unix.SEEK_HOLE, 4096}, {5000, unix.SEEK_DATA, 40960}, {40961, unix.SEEK_HOLE, 40964}} {
		if got, err := unix.Seek(fd, c.off, c.whence); err != nil || got != c.want {
			t.Errorf("lseek(%d, %d) = %d, %v; want %d", c.off, c.whence, got, err, c.want)
		}
	}
	g, err := os.OpenFile(m.Path("d"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 40964)
	copy(want, "head")
	copy(want[40960:], "tail")
	offIn, offOut := int64(0), int64(0)
	for offIn < int64(len(want)) {
		n, err := unix.CopyFileRange(fd, &offIn, int(g.Fd()), &offOut, len(want)-int(offIn), 0)
		if err != nil || n == 0 {
			t.Fatalf("copy_file_range: %d, %v", n, err)
		}
	}
	f.Close()
	g.Close()
	got, err := os.ReadFile(m.Path("d"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("copied file differs: %d bytes, %v", len(got), err)
	}
	if raw, _ := os.ReadFile(filepath.Join(lower, "d")); bytes.Contains(raw, want[:4096]) {
		t.Fatalf("the lower copy is not encoded")
	}
}

// Times set while a file has data pending (tar and cp -p set them on the
// open file, or by name before the release) stay set: the engine's own
// later writes must not move the lower file's mtime.
func TestTimesSurvivePendingWrites(t *testing.T) {
	for _, name := range []string{"gzip", "zstd"} {
		t.Run(name, func(t *testing.T) {
			lower, fs := newStack(t, name, Options{ChunkSize: 4096, FastTails: true, Level: 1})
			m := mounttest.Mount(t, fs)
			want := time.Date(2022, 9, 3, 6, 42, 0, 0, time.UTC)
			data := bytes.Repeat([]byte("grep source "), 1000)
			check := func(n string) {
				t.Helper()
				for _, p := range []string{m.Path(n), filepath.Join(lower, n)} {
					fi, err := os.Stat(p)
					if err != nil {
						t.Fatal(err)
					}
					if !fi.ModTime().Equal(want) {
						t.Errorf("%s: mtime %v, want %v", p, fi.ModTime(), want)
					}
				}
				got, err := os.ReadFile(m.Path(n))
				if err != nil || !bytes.Equal(got, data) {
					t.Errorf("%s: read back %d bytes, %v", n, len(got), err)
				}
			}
			// futimens on the open file, then close.
			f, err := os.Create(m.Path("a"))
			if err != nil {
				t.Fatal(err)
			}
			f.Write(data[:5000])
			f.Write(data[5000:]) // an append: a fast tail
			ts := []unix.Timespec{unix.NsecToTimespec(want.UnixNano()), unix.NsecToTimespec(want.UnixNano())}
			if err := unix.UtimesNanoAt(int(f.Fd()), "", ts, unix.AT_EMPTY_PATH); err != nil {
				t.Fatalf("futimens: %v", err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			check("a")
			// utimensat by name while another descriptor keeps it open.
			g, err := os.Create(m.Path("b"))
			if err != nil {
				t.Fatal(err)
			}
			g.Write(data[:7000])
			g.Write(data[7000:])
			if err := os.Chtimes(m.Path("b"), want, want); err != nil {
				t.Fatal(err)
			}
			if err := g.Close(); err != nil {
				t.Fatal(err)
			}
			check("b")
		})
	}
}

// getattrCounter counts the stat requests by path that reach the stack
// (LOOKUP and GETATTR without an open file).
type getattrCounter struct {
	layer.Base
	mu sync.Mutex
	n  map[string]int
}

func (c *getattrCounter) Getattr(ctx context.Context, path string) (layer.Attr, error) {
	c.mu.Lock()
	c.n[path]++
	c.mu.Unlock()
	return c.Lower.Getattr(ctx, path)
}

// TestReaddirplusAttrs: `ls -l` of a codec directory is served by
// READDIRPLUS: the attributes (logical sizes) come with the listing, and
// stat of the entries afterwards does not reach the stack again. Long cache
// times keep the test from depending on timing.
func TestReaddirplusAttrs(t *testing.T) {
	ctx := context.Background()
	lower, fs := newStack(t, "gzip", Options{FastTails: true})
	sizes := map[string]int{}
	if err := layer.MkdirAll(ctx, fs, "d", 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("d/f%d", i)
		sizes[name] = 1000 * i
		if err := layer.WriteFile(ctx, fs, name, bytes.Repeat([]byte("x"), 1000*i), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs.Close()
	// A fresh layer: sizes come from the files' headers, as after a mount.
	top := &getattrCounter{Base: layer.Base{Lower: newStackAt(t, lower, "gzip", Options{})}, n: map[string]int{}}
	m := mounttest.MountOpts(t, top, fusefs.Options{EntryTimeout: time.Hour, AttrTimeout: time.Hour})
	ents, err := os.ReadDir(m.Path("d"))
	if err != nil || len(ents) != len(sizes) {
		t.Fatalf("readdir: %d entries, %v", len(ents), err)
	}
	for _, e := range ents {
		st, err := os.Lstat(m.Path("d", e.Name()))
		if err != nil || st.Size() != int64(sizes["d/"+e.Name()]) {
			t.Fatalf("lstat %s: %v, %v; want size %d", e.Name(), st, err, sizes["d/"+e.Name()])
		}
	}
	top.mu.Lock()
	defer top.mu.Unlock()
	for p, n := range top.n {
		if _, file := sizes[p]; file {
			t.Errorf("%s: %d stat requests after READDIRPLUS gave its attributes", p, n)
		}
	}
}

// TestSharedClosedFileReleased: on a lower shared with other machines (a
// claim with layer.WithSharedClaim, cairn mount -shared), a closed file
// keeps no descriptor of its lower file open, once the kernel released its
// handle: to a network file system a descriptor kept open for writing is a
// writer that other clients wait on (CephFS's mixed caps; 16.2's ceph-fuse
// hung another client's read, docs/distributed.md). Without -shared the
// closed file's state keeps its descriptor (reopening it is cheap), which
// shows that the test sees one. Both read every byte again after.
func TestSharedClosedFileReleased(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprint("shared=", shared), func(t *testing.T) {
			lower, fs := newStack(t, "zstd", Options{ChunkSize: 4 << 10})
			ctx := context.Background()
			if shared {
				ctx = layer.WithSharedClaim(ctx)
			}
			if err := fs.Claim(ctx); err != nil {
				t.Fatal(err)
			}
			m := mounttest.Mount(t, fs)
			want := bytes.Repeat([]byte("closed, and let go of below\n"), 1000)
			if err := os.WriteFile(m.Path("f"), want, 0o644); err != nil {
				t.Fatal(err)
			}
			lf := filepath.Join(lower, "f")
			open := func() bool {
				ents, _ := os.ReadDir("/proc/self/fd")
				for _, e := range ents {
					if p, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && p == lf {
						return true
					}
				}
				return false
			}
			// The kernel releases the handle after close returns.
			deadline := time.Now().Add(5 * time.Second)
			for open() == shared && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := open(); got == shared {
				t.Fatalf("after close, the lower file open: %v, want %v", got, !shared)
			}
			got, err := os.ReadFile(m.Path("f"))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read again: %d bytes, %v; want %d", len(got), err, len(want))
			}
		})
	}
}

// TestSharedOneWriter: two clients of one shared lower (two stacks over
// one directory, each claimed shared, as two machines mounting a volume
// with cairn mount -shared): while one has a file open for writing, the
// other's open for writing is refused with EBUSY (both would append
// records at one log end); reading is not. Once the writer closes, the
// other may write, and the first one's handle, still open, is then refused
// in turn at its next write. Through real mounts, with system calls.
func TestSharedOneWriter(t *testing.T) {
	lower := t.TempDir()
	mount := func() *mounttest.Mounted {
		fs := newStackAt(t, lower, "zstd", Options{ChunkSize: 4 << 10})
		if err := fs.Claim(layer.WithSharedClaim(context.Background())); err != nil {
			t.Fatal(err)
		}
		return mounttest.MountOpts(t, fs, fusefs.Options{Shared: true})
	}
	a, b := mount(), mount()
	if err := os.WriteFile(a.Path("f"), []byte("first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fa, err := os.OpenFile(a.Path("f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	if _, err := fa.WriteString("by a\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.OpenFile(b.Path("f"), os.O_WRONLY, 0); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("b opens for writing while a writes: %v, want EBUSY", err)
	}
	if err := os.Truncate(b.Path("f"), 0); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("b truncates while a writes: %v, want EBUSY", err)
	}
	if got, err := os.ReadFile(b.Path("f")); err != nil || string(got) != "first\n" {
		t.Fatalf("b reads while a writes: %q, %v", got, err)
	}
	// a's close lets go: b may write at once.
	dup, err := syscall.Dup(int(fa.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Close(dup); err != nil { // a FLUSH of a's handle
		t.Fatal(err)
	}
	fb, err := os.OpenFile(b.Path("f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("b opens for writing after a's close: %v", err)
	}
	if _, err := fb.WriteString("by b\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := fa.WriteString("a again\n"); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("a writes through its open handle while b writes: %v, want EBUSY", err)
	}
	if err := fb.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(a.Path("f")); err != nil || string(got) != "first\nby a\nby b\n" {
		t.Fatalf("a reads after b's close: %q, %v", got, err)
	}
}
