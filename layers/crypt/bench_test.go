package crypt

import (
	"context"
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkRandomWrite4K: aligned 4 KiB writes at random places of a
// 64 MiB file, in-process, with and without the journal of in-place
// rewrites (docs/crypt.md):
// nice -n 19 go test -run '^$' -bench RandomWrite4K -benchtime 20000x ./layers/crypt
func BenchmarkRandomWrite4K(b *testing.B) {
	b.Run("journal", func(b *testing.B) { randomWrites(b, Options{}) })
	b.Run("nojournal", func(b *testing.B) { randomWrites(b, Options{NoJournal: true}) })
}

func randomWrites(b *testing.B, o Options) {
	dir, _ := newVolume(b, InitParams{})
	l, err := openLocal(b, dir)
	if err != nil {
		b.Fatal(err)
	}
	fs, err := Unlock(context.Background(), l, testPass, false, o)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	f, _, err := fs.Create(ctx, "f", unix.O_RDWR, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Release(ctx)
	const size = 64 << 20
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.WriteAt(ctx, buf, off); err != nil {
			b.Fatal(err)
		}
	}
	r := rand.New(rand.NewPCG(1, 1))
	p := make([]byte, 4096)
	b.SetBytes(int64(len(p)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := f.WriteAt(ctx, p, int64(r.IntN(size/4096))*4096); err != nil {
			b.Fatal(err)
		}
	}
}
