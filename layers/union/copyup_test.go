//go:build linux

package union_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUnionCopyUpLarge: a copy-up of a file of several MiB with a hole in
// the middle gives the same bytes and keeps the hole, when the branches
// are one file system (copied by copy_file_range) and when they are two of
// different kinds (tmpfs over the test's directory: copied by reads and
// writes).
func TestUnionCopyUpLarge(t *testing.T) {
	for _, c := range []struct {
		name  string
		upper func() string
	}{
		{"same fs", func() string { return t.TempDir() }},
		{"tmpfs upper", func() string { return smallFS(t, 64) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			upper, lower := c.upper(), t.TempDir()
			rng := rand.New(rand.NewPCG(1, 2))
			head, tail := make([]byte, 3<<20+123), make([]byte, 1<<20+4567)
			for i := range head {
				head[i] = byte(rng.Uint32())
			}
			for i := range tail {
				tail[i] = byte(rng.Uint32())
			}
			const gap = 8 << 20 // a hole from 4 MiB to 12 MiB
			f, err := os.Create(filepath.Join(lower, "big"))
			if err != nil {
				t.Fatal(err)
			}
			f.Write(head)
			f.WriteAt(tail, 4<<20+gap)
			f.Close()
			want, err := os.ReadFile(filepath.Join(lower, "big"))
			if err != nil {
				t.Fatal(err)
			}

			m := mountUnion(t, upper, lower)
			g, err := os.OpenFile(filepath.Join(m.Dir, "big"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			g.Close()
			up := filepath.Join(upper, "big")
			got, err := os.ReadFile(up)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("copy-up: %d bytes differ from the lower's %d", len(got), len(want))
			}
			if b := read(t, filepath.Join(m.Dir, "big")); b != string(want) {
				t.Fatal("the union does not read the copy as the original")
			}
			h, err := os.Open(up)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			hole, err := unix.Seek(int(h.Fd()), 0, unix.SEEK_HOLE)
			if err != nil || hole < int64(len(head)) || hole > 4<<20 {
				t.Fatalf("the copy's first hole is at %d (%v), want it between %d and %d", hole, err, len(head), 4<<20)
			}
			data, err := unix.Seek(int(h.Fd()), hole, unix.SEEK_DATA)
			if err != nil || data < 4<<20+gap-4096 || data > 4<<20+gap {
				t.Fatalf("the copy's data resumes at %d (%v), want %d", data, err, 4<<20+gap)
			}
		})
	}
}
