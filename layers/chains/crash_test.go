package chains_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/chains"
)

// TestCrashDuringConversion kills the daemon (SIGKILL) while it converts a
// large file from one chain to another, at a random moment, and mounts
// again: the file reads as before, with the old chain or the new one (the
// new one if the setxattr returned), and the conversion's temporary file is
// gone.
func TestCrashDuringConversion(t *testing.T) {
	d, cdir := t.TempDir(), cryptDir(t)
	pf := filepath.Join(t.TempDir(), "pass")
	os.WriteFile(pf, []byte(pass+"\n"), 0o600)
	spec := fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = \"chains\"\nover = \"base\"\ncrypt_dir = %q\npassfile = %q\n", d, cdir, pf)
	p := mounttest.MountSpec(t, spec)
	specFile := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	want := make([]byte, 24<<20)
	for i := 0; i < len(want); i += 8 {
		v := r.Uint64()
		if i%4096 < 2048 {
			v &= 0x0f0f0f0f0f0f0f0f // half compressible
		}
		for j := 0; j < 8; j++ {
			want[i+j] = byte(v >> (8 * j))
		}
	}
	if err := os.WriteFile(p.Path("f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	// How long a conversion takes here: the kills fall in [0, 1.3 times
	// that), so that some land during a conversion and some after it.
	var span time.Duration
	for _, c := range []string{"gzip,crypt", ""} {
		start := time.Now()
		if err := setChain(p.Path("f"), c); err != nil {
			t.Fatal(err)
		}
		span = max(span, time.Since(start))
	}
	t.Logf("a conversion takes up to %v", span)
	cur := ""
	targets := []string{"gzip,crypt", "zstd", "", "copy,crypt", "lz4"}
	rounds := 6
	if os.Getenv("CAIRN_LONG") == "1" {
		rounds = 20
	}
	for round := 0; round < rounds; round++ {
		next := targets[round%len(targets)]
		if next == cur {
			next = "gzip"
		}
		done := make(chan error, 1)
		go func() { done <- setChain(p.Path("f"), next) }()
		if round%2 == 0 {
			// Kill during the conversion: once its new file has data.
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) && len(done) == 0 {
				ents, _ := os.ReadDir(filepath.Join(d, chains.TmpDir))
				if len(ents) > 0 {
					if fi, err := ents[0].Info(); err == nil && fi.Size() > int64(r.IntN(1<<20)) {
						break
					}
				}
				time.Sleep(time.Millisecond)
			}
		} else {
			time.Sleep(time.Duration(r.Int64N(int64(span) * 13 / 10)))
		}
		var returned error = unix.EINTR // not yet
		select {
		case err := <-done:
			returned = err
		default:
		}
		p.Kill()
		if returned == unix.EINTR {
			<-done
		}
		// fsck of the crashed lower: every guarded file reads back; an
		// unfinished conversion is repaired (removed).
		if out, err := exec.Command(mounttest.Binary(t), "fsck", "--repair", specFile).CombinedOutput(); err != nil {
			t.Fatalf("round %d: fsck --repair after the crash: %v\n%s", round, err, out)
		}
		p.Restart()
		got := getChain(t, p.Path("f"))
		if got != cur && got != next {
			t.Fatalf("round %d (%q -> %q): chain %q after the crash", round, cur, next, got)
		}
		if returned == nil && got != next {
			t.Fatalf("round %d: the conversion to %q returned, yet the chain is %q", round, next, got)
		}
		b, err := os.ReadFile(p.Path("f"))
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("round %d (%q -> %q, now %q): read %d bytes, %v", round, cur, next, got, len(b), err)
		}
		if ents, _ := os.ReadDir(filepath.Join(d, chains.TmpDir)); len(ents) != 0 {
			t.Fatalf("round %d: %d files left in %s", round, len(ents), chains.TmpDir)
		}
		t.Logf("round %d: %q -> %q: %q (returned: %v)", round, cur, next, got, returned)
		cur = got
	}
	p.Unmount()
	if out, err := exec.Command(mounttest.Binary(t), "fsck", specFile).CombinedOutput(); err != nil {
		t.Fatalf("fsck: %v\n%s", err, out)
	} else {
		t.Logf("fsck: %s", out)
	}
}
