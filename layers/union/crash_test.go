package union_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestUnionCopyUpCrash kills the daemon (kill -9) while it copies a large
// file up, at random moments, and mounts again: the file reads as the
// original (or as its whole copy), the read-only branch is intact, and no
// half copy shows, in the merged view or under the file's name in the
// upper branch. A write after the crashes copies it up for good, and a
// listing removes what the crashes left.
func TestUnionCopyUpCrash(t *testing.T) {
	up, lo := t.TempDir(), t.TempDir()
	big := make([]byte, 96<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(big); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			big[i+k] = byte(v >> (8 * k))
		}
	}
	if err := os.WriteFile(filepath.Join(lo, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(big)
	spec := fmt.Sprintf(`mount = "u"
[layer.u]
type = "union"
over = ["up", "lo"]
[layer.up]
type = "local"
path = %q
[layer.lo]
type = "local"
path = %q
`, up, lo)
	p := mounttest.MountSpec(t, spec)
	rounds, interrupted := 6, 0
	for i := 0; i < rounds; i++ {
		done := make(chan error, 1)
		go func() {
			f, err := os.OpenFile(p.Path("big"), os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				f.Close()
			}
			done <- err
		}()
		time.Sleep(time.Duration(5+r.IntN(150)) * time.Millisecond)
		p.Kill()
		<-done
		p.Restart()
		if left, _ := os.ReadDir(up); len(left) > 0 && strings.HasPrefix(left[0].Name(), ".cairn-union-tmp.") {
			interrupted++
		}
		got, err := os.ReadFile(p.Path("big"))
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if sha256.Sum256(got) != want {
			t.Fatalf("round %d: the file reads %d bytes, not the original", i, len(got))
		}
		if b, err := os.ReadFile(filepath.Join(up, "big")); err == nil && !bytes.Equal(b, big) {
			t.Fatalf("round %d: a half copy under the file's name in the upper branch (%d bytes)", i, len(b))
		}
	}
	t.Logf("%d of %d kills interrupted a copy-up", interrupted, rounds)
	if b, _ := os.ReadFile(filepath.Join(lo, "big")); sha256.Sum256(b) != want {
		t.Fatal("the read-only branch changed")
	}
	f, err := os.OpenFile(p.Path("big"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("end"))
	f.Close()
	if b, err := os.ReadFile(filepath.Join(up, "big")); err != nil || !bytes.Equal(b, append(big, "end"...)) {
		t.Fatalf("the copy-up after the crashes: %d bytes, %v", len(b), err)
	}
	ents, err := os.ReadDir(p.Dir)
	if err != nil || len(ents) != 1 {
		t.Fatalf("listing after the crashes: %v %v", ents, err)
	}
	left, _ := os.ReadDir(up)
	for _, e := range left {
		if strings.HasPrefix(e.Name(), ".cairn-union-tmp.") {
			t.Errorf("left in the upper branch after a listing: %s", e.Name())
		}
	}
}
