//go:build linux

package codec

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// crashFile is one file of the crash test: its content as last fsync'ed,
// and which bytes were written after that fsync (they may or may not have
// survived).
type crashFile struct {
	name    string
	synced  []byte
	current []byte
	touched []bool
	minLen  int // the shortest a truncation since the fsync made it
}

func (c *crashFile) write(off int, p []byte) {
	if end := off + len(p); end > len(c.current) {
		c.current = append(c.current, make([]byte, end-len(c.current))...)
	}
	copy(c.current[off:], p)
	for i := off; i < off+len(p); i++ {
		if i < len(c.touched) {
			c.touched[i] = true
		}
	}
}

func (c *crashFile) sync() {
	c.synced = bytes.Clone(c.current)
	c.touched = make([]bool, len(c.synced))
	c.minLen = len(c.synced)
}

// TestCrash kills the daemon (SIGKILL) while it serves random writes (new
// data, appends, and in-place rewrites of fsync'ed data; releases every ten
// writes, each followed by a fold of the file's fast tails 1 ms later), and
// checks after a restart
// that every fsync'ed byte that was not rewritten since is there, and that
// fsck finds the files consistent. CAIRN_LONG=1 runs 30 crashes per codec
// instead of 3. The seed is logged; CAIRN_CRASH_SEED=N replays the same
// operations (the moment of each kill is timing, so a replay is close, not
// exact).
func TestCrash(t *testing.T) {
	rounds := 3
	if os.Getenv("CAIRN_LONG") == "1" {
		rounds = 30
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CAIRN_CRASH_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CAIRN_CRASH_SEED=%q: %v", v, err)
		}
	}
	t.Logf("seed %d (CAIRN_CRASH_SEED=%d replays it)", seed, seed)
	for ci, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			lower := t.TempDir()
			// Folds 1 ms after a release: the kills land in them too.
			spec := fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = %q\nover = \"base\"\nchunk_size = \"4KiB\"\nfold_delay = \"1ms\"\n", lower, name)
			p := mounttest.MountSpec(t, spec)
			specFile := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
			r := rand.New(rand.NewPCG(seed, uint64(ci)))
			rewrites := 0
			files := make([]*crashFile, 3)
			for i := range files {
				files[i] = &crashFile{name: fmt.Sprintf("c%d", i)}
			}
			for round := 0; round < rounds; round++ {
				// A synced phase: writes, truncates, appends, then fsync.
				fds := make([]*os.File, len(files))
				for i, f := range files {
					fd, err := os.OpenFile(p.Path(f.name), os.O_RDWR|os.O_CREATE, 0o644)
					if err != nil {
						t.Fatal(err)
					}
					fds[i] = fd
				}
				for op := 0; op < 300; op++ {
					i := r.IntN(len(files))
					f, fd := files[i], fds[i]
					switch k := r.IntN(10); {
					case k < 7:
						off := r.IntN(300 << 10)
						if k == 0 {
							off = len(f.current)
						}
						b := text(r, 1+r.IntN(20000))
						if _, err := fd.WriteAt(b, int64(off)); err != nil {
							t.Fatal(err)
						}
						f.write(off, b)
					case k < 8:
						n := r.IntN(len(f.current) + 1000)
						if err := fd.Truncate(int64(n)); err != nil {
							t.Fatal(err)
						}
						if n < len(f.current) {
							f.current = f.current[:n]
						} else {
							f.current = append(f.current, make([]byte, n-len(f.current))...)
						}
					default:
						if err := fd.Sync(); err != nil {
							t.Fatal(err)
						}
						f.sync()
					}
				}
				for i, f := range files {
					if err := fds[i].Sync(); err != nil {
						t.Fatal(err)
					}
					f.sync()
				}
				// An unsynced phase of writes only, killed at a random moment.
				done := make(chan struct{})
				wait := time.Duration(5+r.IntN(200)) * time.Millisecond
				r := rand.New(rand.NewPCG(r.Uint64(), 2)) // the writer's own
				go func() {
					defer close(done)
					for op := 0; ; op++ {
						i := r.IntN(len(files))
						f := files[i]
						off := r.IntN(400 << 10)
						b := text(r, 1+r.IntN(20000))
						if op%2 == 0 && len(f.synced) > 0 {
							// An in-place rewrite of fsync'ed data: the rest of
							// its chunk must survive whatever the kill tears.
							off = r.IntN(len(f.synced))
							b = text(r, 1+r.IntN(min(512, len(f.synced)-off)))
							rewrites++
						}
						if op%3 == 1 {
							// An append: a fast tail, folded after the
							// file's next release.
							off = len(f.current)
						}
						f.write(off, b) // before: it may land
						if _, err := fds[i].WriteAt(b, int64(off)); err != nil {
							return // the daemon is gone
						}
						if op%10 == 9 {
							fds[i].Close() // a release: header, maybe compaction, then a fold
							fd, err := os.OpenFile(p.Path(f.name), os.O_RDWR, 0)
							if err != nil {
								return
							}
							fds[i] = fd
						}
					}
				}()
				time.Sleep(wait)
				p.Kill()
				<-done
				for _, fd := range fds {
					fd.Close()
				}
				// fsck of the crashed stack: consistent (maybe with a log
				// tail to replay), nothing damaged.
				out, err := exec.Command(mounttest.Binary(t), "fsck", specFile).CombinedOutput()
				if err != nil {
					t.Fatalf("fsck after the crash: %v\n%s", err, out)
				}
				p.Restart()
				for _, f := range files {
					got, err := os.ReadFile(p.Path(f.name))
					if err != nil {
						t.Fatal(err)
					}
					if len(got) < len(f.synced) {
						t.Fatalf("round %d: %s: %d bytes after the crash, %d were fsync'ed", round, f.name, len(got), len(f.synced))
					}
					for i := range f.synced {
						if !f.touched[i] && got[i] != f.synced[i] {
							t.Fatalf("round %d: %s: byte %d is %#x after the crash, %#x was fsync'ed", round, f.name, i, got[i], f.synced[i])
						}
					}
					f.current = got
					f.sync()
				}
			}
			p.Unmount()
			out, err := exec.Command(mounttest.Binary(t), "fsck", specFile).CombinedOutput()
			if err != nil {
				t.Fatalf("fsck after unmount: %v\n%s", err, out)
			}
			t.Logf("%d crashes survived (%d in-place rewrites of fsync'ed data under way); fsck:\n%s", rounds, rewrites, out)
		})
	}
}

// TestFsckCommand: `cairn fsck` reports a lost index (exit 1), --repair
// rebuilds it (exit 0); a flipped bit stays reported as damage, --repair
// refuses to drop it (exit 1, nothing changed), --repair --force keeps a
// copy in lost+found, drops the chunk and says so (exit 6), and fsck is
// clean afterwards.
func TestFsckCommand(t *testing.T) {
	lower := t.TempDir()
	fs := newStackAt(t, lower, "gzip", Options{ChunkSize: 4096, FastTails: true})
	if err := os.Mkdir(filepath.Join(lower, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeSample(t, fs, "d/f", 3)
	fs.Close()
	spec := filepath.Join(t.TempDir(), "s.toml")
	os.WriteFile(spec, []byte(fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = \"gzip\"\nover = \"base\"\n", lower)), 0o644)
	fsck := func(args ...string) (string, int) {
		return mounttest.Run(t, append([]string{"fsck"}, append(args, spec)...)...)
	}
	if out, code := fsck(); code != 0 {
		t.Fatalf("fsck of a good stack: exit %d\n%s", code, out)
	}
	p := filepath.Join(lower, "d/f")
	raw, _ := os.ReadFile(p)
	clear(raw[:headerSize])
	os.WriteFile(p, raw, 0o644)
	if out, code := fsck(); code != 1 || !bytes.Contains([]byte(out), []byte("header unreadable")) {
		t.Fatalf("fsck of a lost header: exit %d\n%s", code, out)
	}
	if out, code := fsck("--repair"); code != 0 || !bytes.Contains([]byte(out), []byte("repaired")) {
		t.Fatalf("fsck --repair: exit %d\n%s", code, out)
	}
	if out, code := fsck("-q"); code != 0 || bytes.Contains([]byte(out), []byte("problem:")) {
		t.Fatalf("fsck after repair: exit %d\n%s", code, out)
	}
	raw, _ = os.ReadFile(p)
	raw[headerSize+recHdrSize+5] ^= 4 // the first record's payload
	os.WriteFile(p, raw, 0o644)
	if out, code := fsck("--repair"); code != 1 || !strings.Contains(out, "damaged chunks") || !strings.Contains(out, "not repaired") {
		t.Fatalf("fsck --repair of a flipped bit: exit %d, want 1 and a refusal\n%s", code, out)
	}
	if now, _ := os.ReadFile(p); !bytes.Equal(now, raw) {
		t.Fatal("fsck --repair changed a file it refused to repair")
	}
	if out, code := mounttest.Run(t, "fsck", "--force", spec); code != 2 {
		t.Fatalf("fsck --force without --repair: exit %d, want 2\n%s", code, out)
	}
	out, code := fsck("--repair", "--force")
	if code != 6 || !strings.Contains(out, "chunk 0 (bytes 0 to 4096, damaged): 4096 bytes dropped") || !strings.Contains(out, "lost+found/d_f.") {
		t.Fatalf("fsck --repair --force of a flipped bit: exit %d, want 6, the chunk dropped and the copy\n%s", code, out)
	}
	kept, _ := filepath.Glob(filepath.Join(lower, "lost+found", "d_f.*"))
	if len(kept) != 1 {
		t.Fatalf("lost+found holds %v", kept)
	}
	if b, _ := os.ReadFile(kept[0]); !bytes.Equal(b, raw) {
		t.Fatal("the copy in lost+found is not the file as it was")
	}
	if out, code := fsck(); code != 0 || strings.Contains(out, "lost+found") {
		t.Fatalf("fsck after the forced repair: exit %d, want 0 and lost+found not checked\n%s", code, out)
	}
}

// TestFsckMounted: fsck refuses a stack that a daemon serves (exit 5, one
// line saying to unmount), a second mount of it is refused too, and fsck
// works again after the unmount.
func TestFsckMounted(t *testing.T) {
	lower := t.TempDir()
	p := mounttest.MountSpec(t, fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = \"zstd\"\nover = \"base\"\n", lower))
	if err := os.WriteFile(p.Path("f"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
	run := func(args ...string) (string, int) { return mounttest.Run(t, args...) }
	out, code := run("fsck", spec)
	if code != 5 || !strings.Contains(out, "unmount it first") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("fsck of a mounted stack: exit %d, want 5 and one line\n%s", code, out)
	}
	mnt2 := t.TempDir()
	out, code = run("mount", spec, mnt2)
	if code == 0 {
		syscall.Unmount(mnt2, syscall.MNT_DETACH)
	}
	if code != 4 || !strings.Contains(out, "in use") {
		t.Fatalf("second mount of a mounted stack: exit %d, want 4\n%s", code, out)
	}
	p.Unmount()
	if out, code := run("fsck", spec); code != 0 || !strings.Contains(out, "1 files checked") {
		t.Fatalf("fsck after unmount: exit %d\n%s", code, out)
	}
}
