//go:build linux

package pack

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
)

// TestCrash kills the daemon (SIGKILL) while small files are written,
// fsync'ed, rewritten, appended to and removed, and packed in the
// background 1 ms after their release (the kills land in packing batches,
// unpacks and compactions), and checks after a restart that every file
// reads back as it was at its last fsync, or as the operation under way at
// the kill made it: never other bytes, never EIO. Then fsck --repair
// leaves nothing to report. Over pack:DIR and zstd,pack:DIR. CAIRN_LONG=1
// runs 30 crashes per stack instead of 4; CAIRN_CRASH_SEED=N replays the
// operations (not the moments of the kills).
func TestCrash(t *testing.T) {
	rounds := 4
	if os.Getenv("CAIRN_LONG") == "1" {
		rounds = 30
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CAIRN_CRASH_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (CAIRN_CRASH_SEED=%d replays it)", seed, seed)
	for si, top := range []string{"", "zstd"} {
		t.Run("pack"+map[string]string{"": "", "zstd": "-under-zstd"}[top], func(t *testing.T) {
			lower := t.TempDir()
			spec := fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.pack]\ntype = \"pack\"\nover = \"base\"\ndelay = \"1ms\"\ncompact_min = \"2KiB\"\n", lower)
			if top != "" {
				spec += "[layer.top]\ntype = \"zstd\"\nover = \"pack\"\nfold_delay = \"1ms\"\n"
			} else {
				spec = "mount = \"pack\"\n" + spec[len("mount = \"top\"\n"):]
			}
			p := mounttest.MountSpec(t, spec)
			specFile := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
			r := rand.New(rand.NewPCG(seed, uint64(si)))
			// want: each file's bytes at its last fsync (nil: removed);
			// maybe: what the operation under way at the kill would make.
			want := map[string][]byte{}
			for _, d := range []string{"a", "b", "c"} {
				os.Mkdir(p.Path(d), 0o755)
			}
			for round := range rounds {
				type change struct {
					name  string
					b     []byte
					gone  bool
					trunc bool // an O_TRUNC rewrite: empty in between
				}
				pending := make(chan change, 1)
				done := make(chan struct{})
				wr := rand.New(rand.NewPCG(r.Uint64(), 3))
				go func() {
					defer close(done)
					for {
						name := fmt.Sprintf("%s/f%d", []string{"a", "b", "c"}[wr.IntN(3)], wr.IntN(40))
						old, exists := want[name]
						var b []byte
						var err error
						switch k := wr.IntN(10); {
						case k < 5 || !exists:
							b = bytes.Repeat([]byte(fmt.Sprintf("%s r%d %d|", name, round, wr.IntN(1e6))), 1+wr.IntN(150))
							pending <- change{name: name, b: b, trunc: true}
							err = writeSync(p.Path(name), b, os.O_TRUNC)
						case k < 8:
							add := []byte(fmt.Sprintf("+%d", wr.IntN(1e6)))
							b = append(bytes.Clone(old), add...)
							pending <- change{name: name, b: b}
							err = writeSync(p.Path(name), add, os.O_APPEND)
						default:
							pending <- change{name: name, gone: true}
							err = os.Remove(p.Path(name))
						}
						if err != nil {
							return // the daemon is gone
						}
						c := <-pending
						if c.gone {
							delete(want, c.name)
						} else {
							want[c.name] = c.b
						}
						if wr.IntN(4) == 0 {
							time.Sleep(time.Duration(wr.IntN(3000)) * time.Microsecond) // let packing run
						}
					}
				}()
				time.Sleep(time.Duration(50+r.IntN(300)) * time.Millisecond)
				p.Kill()
				<-done
				var maybe *change
				select {
				case c := <-pending:
					maybe = &c
				default:
				}
				p.Restart()
				for name, b := range want {
					got, err := os.ReadFile(p.Path(name))
					if maybe != nil && maybe.name == name {
						if maybe.gone && errors.Is(err, os.ErrNotExist) {
							delete(want, name)
							continue
						}
						if !maybe.gone && err == nil && (bytes.Equal(got, maybe.b) || maybe.trunc && len(got) == 0) {
							want[name] = got
							continue
						}
					}
					if err != nil || !bytes.Equal(got, b) {
						t.Fatalf("round %d: %s: %d bytes, %v after the crash; %d bytes were fsync'ed (%q, got %q)", round, name, len(got), err, len(b), b[:min(len(b), 30)], got[:min(len(got), 30)])
					}
				}
				if maybe != nil && !maybe.gone {
					if _, ok := want[maybe.name]; !ok {
						// A new file under way: absent, empty, or whole.
						got, err := os.ReadFile(p.Path(maybe.name))
						if err == nil && len(got) > 0 && !bytes.Equal(got, maybe.b) {
							t.Fatalf("round %d: %s, created at the kill, reads %q", round, maybe.name, got)
						}
						if err == nil {
							want[maybe.name] = got
						}
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
			p.Unmount()
			out, err := exec.Command(mounttest.Binary(t), "fsck", "--repair", specFile).CombinedOutput()
			if err != nil {
				t.Fatalf("fsck --repair after the crashes: %v\n%s", err, out)
			}
			out, err = exec.Command(mounttest.Binary(t), "fsck", specFile).CombinedOutput()
			if err != nil {
				t.Fatalf("fsck after the repair: %v\n%s", err, out)
			}
			p.Restart()
			for name, b := range want {
				if got, err := os.ReadFile(p.Path(name)); err != nil || !bytes.Equal(got, b) {
					t.Fatalf("after fsck: %s: %q, %v; want %q", name, got, err, b)
				}
			}
			packed := 0
			filepath.WalkDir(lower, func(path string, d os.DirEntry, err error) error {
				if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() && st.Size() == 0 {
					if _, ok := lowerRefNoFail(path); ok {
						packed++
					}
				}
				return nil
			})
			t.Logf("%d crashes survived, %d files, %d packed at the end", rounds, len(want), packed)
		})
	}
}

// writeSync writes b to path (flag: O_TRUNC or O_APPEND) and fsyncs it.
func writeSync(path string, b []byte, flag int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|flag, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// TestShared: a mount with -shared packs nothing (another machine may have
// the file open), reads what an earlier mount packed, and unpacks it when
// it is written.
func TestShared(t *testing.T) {
	lower := t.TempDir()
	spec := fmt.Sprintf("mount = \"pack\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.pack]\ntype = \"pack\"\nover = \"base\"\ndelay = \"1ms\"\n", lower)
	p := mounttest.MountSpec(t, spec)
	if err := os.WriteFile(p.Path("old"), []byte("packed before"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitPacked(t, filepath.Join(lower, "old"))
	p.Unmount()
	p2 := mounttest.MountSpec(t, spec, "-shared")
	if err := os.WriteFile(p2.Path("new"), []byte("not packed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p2.Path("old")); err != nil || string(b) != "packed before" {
		t.Fatalf("a packed file through a shared mount: %q, %v", b, err)
	}
	f, err := os.OpenFile(p2.Path("old"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte(", then written"))
	f.Close()
	time.Sleep(300 * time.Millisecond)
	for name, want := range map[string]string{"new": "not packed", "old": "packed before, then written"} {
		if b, err := os.ReadFile(filepath.Join(lower, name)); err != nil || string(b) != want {
			t.Fatalf("lower %s: %q, %v (want %q, unpacked)", name, b, err, want)
		}
		if _, ok := lowerRef(t, filepath.Join(lower, name)); ok {
			t.Fatalf("lower %s carries a ref", name)
		}
	}
}

// TestFsxMmapProcess runs the model with mmap against a pack mount served
// by a cairn process, packing 1 ms after a file is left alone, with and
// without passthrough.
func TestFsxMmapProcess(t *testing.T) {
	for _, extra := range [][]string{nil, {"--no-passthrough"}} {
		lower := t.TempDir()
		spec := fmt.Sprintf("mount = \"pack\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.pack]\ntype = \"pack\"\nover = \"base\"\ndelay = \"1ms\"\nmax_size = \"64KiB\"\n", lower)
		p := mounttest.MountSpec(t, spec, extra...)
		fsx.Run(t, fsx.Config{Dir: p.Dir, Ops: 4000, Mmap: true, Punch: true, MaxSize: 48 << 10, MaxLen: 8 << 10})
		p.Unmount()
		packed := 0
		ents, _ := os.ReadDir(lower)
		for _, e := range ents {
			if _, ok := lowerRefNoFail(filepath.Join(lower, e.Name())); ok {
				packed++
			}
		}
		t.Logf("%v: %d files packed at the end", extra, packed)
	}
}
