//go:build linux

package codec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/faultfs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// faultStack builds name over a fault layer over a local directory; the
// stack is closed when the test ends.
func faultStack(t *testing.T, dir, name string, o Options) (*faultfs.FS, *FS) {
	t.Helper()
	ff, fs := openFaultStack(t, dir, name, o)
	t.Cleanup(func() { layer.CloseStack(fs) })
	return ff, fs
}

// openFaultStack is faultStack for the caller to close (layer.CloseStack).
func openFaultStack(t *testing.T, dir, name string, o Options) (*faultfs.FS, *FS) {
	t.Helper()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ff := faultfs.New(l)
	if o.Level == 0 {
		o.Level = levelOf(name)
	}
	fs, err := New(ff, name, o)
	if err != nil {
		t.Fatal(err)
	}
	return ff, fs
}

// writeSynced writes content to a new file name in a few pieces (a whole
// write, a rewrite in the middle, small appends: chunk and delta records),
// fsyncs it and closes it. It returns the first error.
func writeSynced(ctx context.Context, fs *FS, name string, content []byte) error {
	f, _, err := fs.Create(ctx, name, unix.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer f.Release(ctx)
	body := len(content) * 3 / 4
	steps := []func() error{
		func() error { _, err := f.WriteAt(ctx, content[:body], 0); return err },
		func() error { return f.Flush(ctx) },
		func() error { _, err := f.WriteAt(ctx, content[body/3:body/2], int64(body/3)); return err },
		func() error { return f.Flush(ctx) },
	}
	for off := body; off < len(content); off += 700 {
		off := off
		steps = append(steps,
			func() error {
				_, err := f.WriteAt(ctx, content[off:min(off+700, len(content))], int64(off))
				return err
			},
			func() error { return f.Flush(ctx) })
	}
	steps = append(steps, func() error { return f.Fsync(ctx, false) })
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// checkAfterRestart opens the files of dir on a fresh stack: each synced
// file reads as it was fsync'ed, every other file reads without error, and
// fsck finds nothing wrong.
func checkAfterRestart(t *testing.T, dir, name string, synced map[string][]byte, others []string) {
	t.Helper()
	ctx := context.Background()
	fresh := newStackAt(t, dir, name, Options{})
	for p, want := range synced {
		got, err := layer.ReadFile(ctx, fresh, p)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: fsync'ed file after the restart: %d bytes (%v), want %d; first diff %d", p, len(got), err, len(want), firstDiff(got, want))
		}
	}
	for _, p := range others {
		if _, err := layer.ReadFile(ctx, fresh, p); err != nil {
			t.Fatalf("%s: a file whose write failed is unreadable after the restart: %v", p, err)
		}
	}
	for p := range synced {
		others = append(others, p)
	}
	for _, p := range others {
		rep, err := fresh.Check(ctx, p, CheckOnly)
		if err != nil || !rep.OK() {
			t.Fatalf("fsck after the restart: %s, %v", rep.String(), err)
		}
	}
}

// TestFullDisk writes files until the lower disk is full, fsyncing each:
// every write, close or fsync that cannot store its records fails with
// ENOSPC, what was fsync'ed before survives a restart byte for byte, an
// in-place rewrite and a truncation of an fsync'ed file on the full disk
// fail without harming it, every file stays readable, and fsck agrees.
func TestFullDisk(t *testing.T) {
	ctx := context.Background()
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			for _, space := range []int64{50, 130, 2000, 9000, 30000, 61000, 120000} {
				dir := t.TempDir()
				ff, fs := faultStack(t, dir, name, Options{ChunkSize: 4096, FastTails: true, CompactMin: 16 << 10})
				r := rand.New(rand.NewPCG(uint64(space), 3))
				ff.Set(faultfs.Faults{NoSpace: true, SpaceLeft: space})
				synced := map[string][]byte{}
				var others []string
				var failed error
				for i := 0; failed == nil; i++ {
					p := fmt.Sprintf("f%d", i)
					content := text(r, 3000+r.IntN(12000))
					if failed = writeSynced(ctx, fs, p, content); failed == nil {
						synced[p] = content
					} else {
						others = append(others, p)
					}
				}
				if !errors.Is(failed, syscall.ENOSPC) {
					t.Fatalf("space %d: the write that filled the disk failed with %v, want ENOSPC", space, failed)
				}
				// On the full disk: an in-place rewrite and a truncation of an
				// fsync'ed file fail, and so does its fsync.
				for p, want := range synced {
					f, err := fs.Open(ctx, p, unix.O_RDWR)
					if err != nil {
						t.Fatalf("space %d: open %s on the full disk: %v", space, p, err)
					}
					f.WriteAt(ctx, bytes.Repeat([]byte("X"), 5000), 100)
					if err := f.Fsync(ctx, false); !errors.Is(err, syscall.ENOSPC) {
						t.Fatalf("space %d: fsync of a rewrite on the full disk: %v, want ENOSPC", space, err)
					}
					if _, err := f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 10}); !errors.Is(err, syscall.ENOSPC) {
						t.Fatalf("space %d: truncate on the full disk: %v, want ENOSPC", space, err)
					}
					if err := f.Release(ctx); !errors.Is(err, syscall.ENOSPC) {
						t.Fatalf("space %d: last close of a rewrite on the full disk: %v, want ENOSPC", space, err)
					}
					_ = want
					break
				}
				fs.Close()
				checkAfterRestart(t, dir, name, synced, others)
			}
		})
	}
}

// TestShortWritesFail: a lower that stores only part of a write and says
// nothing (as a raw pwrite may) makes every write of records fail with
// EIO; what was fsync'ed before survives.
func TestShortWritesFail(t *testing.T) {
	ctx := context.Background()
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			ff, fs := faultStack(t, dir, name, Options{ChunkSize: 4096, FastTails: true})
			r := rand.New(rand.NewPCG(1, 4))
			want := text(r, 20000)
			if err := writeSynced(ctx, fs, "good", want); err != nil {
				t.Fatal(err)
			}
			ff.Set(faultfs.Faults{ShortWrites: true})
			if err := writeSynced(ctx, fs, "bad", text(r, 20000)); layer.Errno(err) != syscall.EIO {
				t.Fatalf("writing over short writes: %v, want EIO", err)
			}
			f, err := fs.Open(ctx, "good", unix.O_RDWR)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt(ctx, text(r, 9000), 3000)
			if err := f.Fsync(ctx, false); layer.Errno(err) != syscall.EIO {
				t.Fatalf("fsync of a rewrite over short writes: %v, want EIO", err)
			}
			f.Release(ctx)
			fs.Close()
			checkAfterRestart(t, dir, name, map[string][]byte{"good": want}, []string{"bad"})
		})
	}
}

// TestFullDiskMount is the reproduction of a full disk through the kernel:
// a stack over a small tmpfs, files written (and closed) until the disk is
// full, then each file whose close succeeded fsync'ed, an unmount and a
// remount: every file whose fsync succeeded reads back as written, the
// others read without error, and fsck agrees.
func TestFullDiskMount(t *testing.T) {
	mounttest.NeedRoot(t)
	for _, name := range []string{"zstd", "gzip", "lz4"} {
		t.Run(name, func(t *testing.T) {
			lower := t.TempDir()
			if err := unix.Mount("tmpfs", lower, "tmpfs", 0, "size=4m"); err != nil {
				t.Fatalf("mounting a small tmpfs: %v", err)
			}
			t.Cleanup(func() { unix.Unmount(lower, unix.MNT_DETACH) })
			p := mounttest.MountSpec(t, fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = %q\nover = \"base\"\nchunk_size = \"64KiB\"\n", lower, name))
			r := rand.New(rand.NewPCG(7, 7))
			written := map[string][]byte{}
			var others []string
			var failed error
			for i := 0; failed == nil && i < 1000; i++ {
				fn := fmt.Sprintf("f%d", i)
				content := make([]byte, 50000+r.IntN(300000))
				for j := range content { // incompressible: the disk fills
					content[j] = byte(r.Uint32())
				}
				failed = func() error {
					fd, err := os.OpenFile(p.Path(fn), os.O_RDWR|os.O_CREATE, 0o644)
					if err != nil {
						return err
					}
					defer fd.Close()
					for off := 0; off < len(content); off += 100000 {
						if _, err := fd.WriteAt(content[off:min(off+100000, len(content))], int64(off)); err != nil {
							return err
						}
					}
					return fd.Close()
				}()
				if failed == nil {
					written[fn] = content
				} else {
					others = append(others, fn)
				}
			}
			if !errors.Is(failed, syscall.ENOSPC) {
				t.Fatalf("the write that filled the disk: %v, want ENOSPC", failed)
			}
			synced := map[string][]byte{}
			for fn, content := range written {
				fd, err := os.OpenFile(p.Path(fn), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := fd.Sync(); err == nil {
					synced[fn] = content
				} else if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fsync of %s on the full disk: %v, want success or ENOSPC", fn, err)
				} else {
					others = append(others, fn)
				}
				fd.Close()
			}
			if len(synced) < 5 {
				t.Fatalf("only %d files fsync'ed before the disk was full", len(synced))
			}
			p.Unmount()
			p.Restart()
			for fn, want := range synced {
				got, err := os.ReadFile(p.Path(fn))
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("%s: fsync'ed: %d bytes (%v) after the remount, want %d", fn, len(got), err, len(want))
				}
			}
			for _, fn := range others {
				if _, err := os.ReadFile(p.Path(fn)); err != nil {
					t.Fatalf("%s: the file whose write failed is unreadable: %v", fn, err)
				}
			}
			p.Unmount()
			out, code := mounttest.Run(t, "fsck", filepath.Join(filepath.Dir(p.Dir), "spec.toml"))
			if code != 0 {
				t.Fatalf("fsck: exit %d\n%s", code, out)
			}
			t.Logf("%d files written, %d fsync'ed before the disk was full (then %v); fsck:\n%s", len(written), len(synced), failed, out)
		})
	}
}

// TestReadErrors: a read error of the lower at any point of opening or
// reading gives EIO (or the right bytes, when the failed read was not
// needed), never other bytes.
func TestReadErrors(t *testing.T) {
	ctx := context.Background()
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			_, fs := faultStack(t, dir, name, Options{ChunkSize: 4096, FastTails: true})
			want := smallSample(t, fs, "f")
			fs.Close()
			failed := 0
			for n := 1; n < 40; n++ {
				ff, fresh := openFaultStack(t, dir, name, Options{Logger: quiet})
				ff.Set(faultfs.Faults{FailRead: n})
				got, err := layer.ReadFile(ctx, fresh, "f")
				switch {
				case err != nil && layer.Errno(err) != syscall.EIO:
					t.Fatalf("read %d failing: %v, want EIO", n, err)
				case err != nil:
					failed++
				case !bytes.Equal(got, want):
					t.Fatalf("read %d failing: %d bytes and no error, want %d (first difference %d)", n, len(got), len(want), firstDiff(got, want))
				}
				layer.CloseStack(fresh)
			}
			if failed == 0 {
				t.Fatal("no failed read reached the application")
			}
		})
	}
}

// TestCrashPoints stops every write at a chosen byte (a torn write, then
// nothing: what a crash leaves) during a workload of writes, in-place
// rewrites of fsync'ed data, truncations, closes and compactions, for many
// crash points: a fresh stack then reads every file without error, every
// fsync'ed byte not written since is there, and fsck finds nothing wrong.
func TestCrashPoints(t *testing.T) {
	ctx := context.Background()
	points := 25
	if os.Getenv("CAIRN_LONG") == "1" {
		points = 400
	}
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			// The workload's size without a crash, to spread the points.
			total := func() int64 {
				dir := t.TempDir()
				ff, fs := faultStack(t, dir, name, Options{ChunkSize: 4096, FastTails: true, CompactMin: 8 << 10, Logger: quiet})
				crashWorkload(ctx, fs, nil)
				return ff.Written()
			}()
			r := rand.New(rand.NewPCG(uint64(len(name)), 5))
			for i := 0; i < points; i++ {
				at := 1 + r.Int64N(total)
				dir := t.TempDir()
				ff, fs := openFaultStack(t, dir, name, Options{ChunkSize: 4096, FastTails: true, CompactMin: 8 << 10, Logger: quiet})
				ff.Set(faultfs.Faults{CrashAfter: at})
				files := map[string]*crashFile{}
				crashWorkload(ctx, fs, files)
				if !ff.Crashed() {
					t.Fatalf("crash point %d of %d not reached", at, total)
				}
				_, fresh := openFaultStack(t, dir, name, Options{Logger: quiet})
				for p, f := range files {
					got, err := layer.ReadFile(ctx, fresh, p)
					if errors.Is(err, syscall.ENOENT) && len(f.synced) == 0 {
						continue
					}
					if err != nil {
						t.Fatalf("crash at byte %d of %d: %s: %v", at, total, p, err)
					}
					if len(got) < f.minLen {
						t.Fatalf("crash at byte %d of %d: %s: %d bytes, %d were fsync'ed (and not truncated since)", at, total, p, len(got), f.minLen)
					}
					for j := range f.synced {
						if !f.touched[j] && (j >= len(got) || got[j] != f.synced[j]) {
							t.Fatalf("crash at byte %d of %d: %s: byte %d is %q, %q was fsync'ed", at, total, p, j, got[j], f.synced[j])
						}
					}
					rep, err := fresh.Check(ctx, p, CheckOnly)
					if err != nil || len(rep.Problems) > 0 || len(rep.Damaged) > 0 || rep.Lost != "" {
						t.Fatalf("crash at byte %d of %d: fsck: %s, %v", at, total, rep.String(), err)
					}
				}
				layer.CloseStack(fs)
				layer.CloseStack(fresh)
			}
		})
	}
}

// crashWorkload runs a fixed sequence of operations on three files,
// keeping in files (if not nil) what each fsync acknowledged; it stops at
// the first error (the crash).
func crashWorkload(ctx context.Context, fs *FS, files map[string]*crashFile) {
	r := rand.New(rand.NewPCG(17, 18))
	get := func(p string) *crashFile {
		if files == nil {
			return &crashFile{}
		}
		if files[p] == nil {
			files[p] = &crashFile{name: p}
		}
		return files[p]
	}
	for round := 0; round < 6; round++ {
		for i := 0; i < 3; i++ {
			p := fmt.Sprintf("c%d", i)
			cf := get(p)
			f, err := fs.Open(ctx, p, unix.O_RDWR|unix.O_CREAT)
			if err != nil {
				f, _, err = fs.Create(ctx, p, unix.O_RDWR, 0o644)
			}
			if err != nil {
				return
			}
			ok := func() bool {
				defer f.Release(ctx)
				for op := 0; op < 12; op++ {
					switch k := r.IntN(10); {
					case k < 4: // new data, or an append
						off := r.IntN(60 << 10)
						if k == 0 {
							off = len(cf.current)
						}
						b := text(r, 1+r.IntN(9000))
						cf.write(off, b) // before: it may land
						if _, err := f.WriteAt(ctx, b, int64(off)); err != nil {
							return false
						}
					case k < 7 && len(cf.synced) > 0: // an in-place rewrite of fsync'ed data
						off := r.IntN(len(cf.synced))
						b := bytes.ToUpper(text(r, 1+r.IntN(min(600, len(cf.synced)-off))))
						cf.write(off, b)
						if _, err := f.WriteAt(ctx, b, int64(off)); err != nil {
							return false
						}
					case k < 8:
						n := r.IntN(len(cf.current) + 2000)
						if n < len(cf.current) {
							for j := n; j < len(cf.current) && j < len(cf.touched); j++ {
								cf.touched[j] = true
							}
							cf.minLen = min(cf.minLen, n)
							cf.current = cf.current[:n]
						} else {
							cf.current = append(cf.current, make([]byte, n-len(cf.current))...)
						}
						if _, err := f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(n)}); err != nil {
							return false
						}
					default:
						if err := f.Fsync(ctx, false); err != nil {
							return false
						}
						cf.sync()
					}
				}
				if err := f.Fsync(ctx, false); err != nil {
					return false
				}
				cf.sync()
				return true
			}()
			if !ok {
				return
			}
		}
	}
}
