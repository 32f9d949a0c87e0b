package chains_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// BenchmarkOpen: the layer's own cost of open+release (in process, no
// FUSE) of an unguarded file and of files guarded by 1, 5 and 25 copy
// links, warm: MonA's Figure 6 without the kernel (bench/chains.sh
// measures it through a mount).
func BenchmarkOpen(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{0, 1, 5, 25} {
		b.Run(fmt.Sprintf("links=%d", n), func(b *testing.B) {
			rs := ""
			if n > 0 {
				rs = "**=" + strings.TrimSuffix(strings.Repeat("copy,", n), ",")
			}
			fs := stack(b, b.TempDir(), "", rs, nil)
			if err := layer.WriteFile(ctx, fs, "f", make([]byte, 4096), 0o644); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f, err := fs.Open(ctx, "f", unix.O_RDONLY)
				if err != nil {
					b.Fatal(err)
				}
				f.Release(ctx)
			}
		})
	}
}

// BenchmarkRead: open+read 64 KiB+release through the layer, in process.
func BenchmarkRead(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{0, 1, 5, 25} {
		b.Run(fmt.Sprintf("links=%d", n), func(b *testing.B) {
			rs := ""
			if n > 0 {
				rs = "**=" + strings.TrimSuffix(strings.Repeat("copy,", n), ",")
			}
			fs := stack(b, b.TempDir(), "", rs, nil)
			if err := layer.WriteFile(ctx, fs, "f", make([]byte, 64<<10), 0o644); err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 64<<10)
			b.SetBytes(64 << 10)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f, err := fs.Open(ctx, "f", unix.O_RDONLY)
				if err != nil {
					b.Fatal(err)
				}
				f.ReadAt(ctx, buf, 0)
				f.Release(ctx)
			}
		})
	}
}

// BenchmarkWrite: create, write 8 MiB in 128 KiB writes and release a file
// under a chain of one and of two codec links, in process (what each
// append's flush of the link below costs).
func BenchmarkWrite(b *testing.B) {
	ctx := context.Background()
	for _, ch := range []string{"copy", "zstd", "copy,copy", "gzip,zstd"} {
		b.Run(ch, func(b *testing.B) {
			fs := stack(b, b.TempDir(), "", "**="+ch, nil)
			buf := make([]byte, 128<<10)
			for i := range buf {
				buf[i] = byte(i * 7 % 251)
			}
			b.SetBytes(8 << 20)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f, _, err := fs.Create(ctx, "f", unix.O_RDWR|unix.O_TRUNC, 0o644)
				if err != nil {
					b.Fatal(err)
				}
				for off := int64(0); off < 8<<20; off += int64(len(buf)) {
					if _, err := f.WriteAt(ctx, buf, off); err != nil {
						b.Fatal(err)
					}
				}
				if err := f.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
