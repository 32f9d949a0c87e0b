package codec

import (
	"bytes"
	"cairnfs.dev/cairn/layer"
	"context"
	"fmt"
	"golang.org/x/sys/unix"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

// Benchmarks through an in-process FUSE mount (the figures of the closing
// note of issue 5 come from these and bench/codec-tools.sh):
//
//	go test -run XXX -bench . -benchtime 2000x ./layers/codec/
//
// BenchmarkAppend: one iteration is open(O_APPEND), write(unit bytes),
// close, on a file that grows (a log written by `echo >>`). The stack is
// served by a `cairn mount -f` process, as it is in use, so that the
// server does not compete with the loop for the Go scheduler; the mount is
// private (no allow_other, no default_permissions). The file holds 1 MiB
// and half a chunk of text, so that appends land in a half-full chunk, as
// in a log of some size; it is cut back (untimed) every eighth of a chunk
// of appends, so that the figure does not depend on b.N. "none" is the
// local layer alone without passthrough: the cost of the FUSE round trips
// (open, write, flush, release), which no layer can go under.
//
// Appends through a descriptor kept open cost the same with and without
// fast tails: chunks are encoded when they are written out, at close, fsync
// or eviction, not at each write. CAIRN_BENCH_LEVEL=9 sets the level of the
// codecs that have one.
func BenchmarkAppend(b *testing.B) {
	type stack struct {
		name  string
		tails bool
	}
	stacks := []stack{{"none", false}}
	for _, name := range codecNames {
		stacks = append(stacks, stack{name, true}, stack{name, false})
	}
	for _, s := range stacks {
		for _, unit := range []int{10, 100, 1000} {
			sub := fmt.Sprintf("%s/tails=%v/%d", s.name, s.tails, unit)
			b.Run(sub, func(b *testing.B) {
				lower := b.TempDir()
				spec := fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n", lower)
				cs := int64(DefaultChunkSize)
				var extra []string
				if s.name == "none" {
					spec = strings.Replace(spec, "base", "top", 1)
					extra = append(extra, "--no-passthrough")
				} else {
					spec += fmt.Sprintf("[layer.top]\ntype = %q\nover = \"base\"\nfast_tails = %v\n", s.name, s.tails)
					for _, k := range kinds {
						if k.Name == s.name {
							cs = k.chunk()
							if l := os.Getenv("CAIRN_BENCH_LEVEL"); l != "" && k.HasLevel {
								spec += "level = " + l + "\n"
							}
						}
					}
				}
				m := mounttest.MountSpec(b, spec, append(extra, "--allow-other=false")...)
				p := m.Path("log")
				data := text(rand.New(rand.NewPCG(1, 1)), 1<<20+int(cs))
				start := int64(1<<20 + cs/2)
				if err := os.WriteFile(p, data[:start], 0o644); err != nil {
					b.Fatal(err)
				}
				size := start
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if size+int64(unit) > start+cs/8 {
						b.StopTimer()
						if err := os.Truncate(p, start); err != nil {
							b.Fatal(err)
						}
						size = start
						b.StartTimer()
					}
					f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := f.Write(data[size : size+int64(unit)]); err != nil {
						b.Fatal(err)
					}
					if err := f.Close(); err != nil {
						b.Fatal(err)
					}
					size += int64(unit)
				}
				b.StopTimer()
				got, err := os.ReadFile(p)
				if err != nil || !bytes.Equal(got, data[:size]) {
					b.Fatalf("the file reads back wrong (%v)", err)
				}
			})
		}
	}
}

// BenchmarkWriteMiddle: one iteration is open, a 4 KiB write at a random
// offset, close (which writes the changed chunk), in files of 1 MiB, 64 MiB
// and 1 GiB of text. CAIRN_BENCH_SIZES=1,64 limits the sizes (MiB).
func BenchmarkWriteMiddle(b *testing.B) {
	sizes := []int{1, 64, 1024}
	if s := os.Getenv("CAIRN_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range splitComma(s) {
			n, _ := strconv.Atoi(f)
			sizes = append(sizes, n)
		}
	}
	for _, name := range []string{"copy", "gzip", "zstd", "lz4"} {
		for _, mib := range sizes {
			b.Run(fmt.Sprintf("%s/%dMiB", name, mib), func(b *testing.B) {
				lower, fs := newStack(b, name, Options{FastTails: true})
				m := mounttest.Mount(b, fs)
				p := filepath.Join(m.Dir, "big")
				r := rand.New(rand.NewPCG(2, 2))
				block := text(r, 1<<20)
				f, err := os.Create(p)
				if err != nil {
					b.Fatal(err)
				}
				for i := 0; i < mib; i++ {
					block[r.IntN(len(block))]++
					if _, err := f.Write(block); err != nil {
						b.Fatal(err)
					}
				}
				f.Close()
				w := text(r, 4096)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					f, err := os.OpenFile(p, os.O_WRONLY, 0)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := f.WriteAt(w, r.Int64N(int64(mib)<<20-4096)); err != nil {
						b.Fatal(err)
					}
					f.Close()
				}
				b.StopTimer()
				st, _ := os.Stat(filepath.Join(lower, "big"))
				b.ReportMetric(float64(st.Size())/float64(int64(mib)<<20), "lower/logical")
			})
		}
	}
}

// BenchmarkReadMiddle: one iteration is open, a 4 KiB read at a random
// offset, close, in files of 64 MiB and 1 GiB of text (CAIRN_BENCH_SIZES as
// above) that were read whole once since the mount (warm), or not (each
// read decodes its chunk, unless an earlier one did).
func BenchmarkReadMiddle(b *testing.B) {
	sizes := []int{64, 1024}
	if s := os.Getenv("CAIRN_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range splitComma(s) {
			n, _ := strconv.Atoi(f)
			sizes = append(sizes, n)
		}
	}
	for _, name := range []string{"copy", "gzip", "zstd", "lz4"} {
		for _, mib := range sizes {
			for _, warm := range []bool{true, false} {
				b.Run(fmt.Sprintf("%s/%dMiB/warm=%v", name, mib, warm), func(b *testing.B) {
					_, fs := newStack(b, name, Options{FastTails: true})
					m := mounttest.Mount(b, fs)
					p := filepath.Join(m.Dir, "big")
					r := rand.New(rand.NewPCG(2, 2))
					block := text(r, 1<<20)
					f, err := os.Create(p)
					if err != nil {
						b.Fatal(err)
					}
					for i := 0; i < mib; i++ {
						block[r.IntN(len(block))]++
						if _, err := f.Write(block); err != nil {
							b.Fatal(err)
						}
					}
					f.Close()
					// A new mount: the kernel has none of the pages written.
					m.Unmount()
					m = mounttest.Mount(b, fs)
					p = filepath.Join(m.Dir, "big")
					if warm {
						if _, err := os.ReadFile(p); err != nil {
							b.Fatal(err)
						}
					}
					buf := make([]byte, 4096)
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						f, err := os.Open(p)
						if err != nil {
							b.Fatal(err)
						}
						if _, err := f.ReadAt(buf, r.Int64N(int64(mib)<<20-4096)); err != nil {
							b.Fatal(err)
						}
						f.Close()
					}
				})
			}
		}
	}
}

// BenchmarkCopy: one iteration copies a 32 MiB text file into the mount
// (write and close).
func BenchmarkCopy(b *testing.B) {
	data := text(rand.New(rand.NewPCG(3, 3)), 32<<20)
	for _, name := range codecNames {
		b.Run(name, func(b *testing.B) {
			lower, fs := newStack(b, name, Options{FastTails: true})
			m := mounttest.Mount(b, fs)
			b.SetBytes(int64(len(data)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p := filepath.Join(m.Dir, "f"+strconv.Itoa(i))
				if err := os.WriteFile(p, data, 0o644); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			st, _ := os.Stat(filepath.Join(lower, "f0"))
			b.ReportMetric(float64(st.Size())/float64(len(data)), "lower/logical")
		})
	}
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// BenchmarkAppendLayer: BenchmarkAppend without FUSE, on the layer itself:
// the engine's own cost of open(O_APPEND), write, flush and release.
func BenchmarkAppendLayer(b *testing.B) {
	ctx := context.Background()
	for _, name := range []string{"gzip", "zstd"} {
		for _, tails := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/tails=%v", name, tails), func(b *testing.B) {
				_, fs := newStack(b, name, Options{FastTails: tails})
				cs := int(fs.e.kind.chunk())
				data := text(rand.New(rand.NewPCG(1, 1)), 2*cs+cs/2)
				if err := layer.WriteFile(ctx, fs, "log", data, 0o644); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					f, err := fs.Open(ctx, "log", unix.O_WRONLY|unix.O_APPEND)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := f.WriteAt(ctx, data[:10], 0); err != nil {
						b.Fatal(err)
					}
					if err := f.Flush(ctx); err != nil {
						b.Fatal(err)
					}
					f.Release(ctx)
				}
			})
		}
	}
}
