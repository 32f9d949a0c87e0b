package codec

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"cairn/internal/mounttest"
)

// Benchmarks through an in-process FUSE mount (the figures of the closing
// note of issue 5 come from these and bench/codec-tools.sh):
//
//	go test -run XXX -bench . -benchtime 2000x ./layers/codec/
//
// BenchmarkAppend: one iteration is open(O_APPEND), write(unit bytes),
// close, on a file that grows (a log written by `echo >>`). Appends through
// a descriptor kept open cost the same with and without fast tails: chunks
// are encoded when they are written out, at close, fsync or eviction, not
// at each write.
func BenchmarkAppend(b *testing.B) {
	for _, name := range codecNames {
		for _, tails := range []bool{true, false} {
			for _, unit := range []int{10, 100, 1000} {
				b.Run(fmt.Sprintf("%s/tails=%v/%d", name, tails, unit), func(b *testing.B) {
					_, fs := newStack(b, name, Options{FastTails: tails})
					m := mounttest.Mount(b, fs)
					p := filepath.Join(m.Dir, "log")
					data := text(rand.New(rand.NewPCG(1, 1)), 1<<20)
					// A file of 1 MiB and half a chunk: appends land in a
					// half-full chunk, as in a log of some size.
					if err := os.WriteFile(p, append(data, data[:DefaultChunkSize/2]...), 0o644); err != nil {
						b.Fatal(err)
					}
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
						if err != nil {
							b.Fatal(err)
						}
						o := (i * unit) % (len(data) - unit)
						if _, err := f.Write(data[o : o+unit]); err != nil {
							b.Fatal(err)
						}
						f.Close()
					}
				})
			}
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
