//go:build linux

package replica_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/replica"
)

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestReplicaDiskTakenAway: a replica of two ext4 file systems on loop
// devices. Mid-workload the second disk is taken away: unmounted lazily (the
// daemon keeps it open), then its device shrinks to 1 MiB (the image
// truncated, losetup -c), so that every I/O beyond fails. The workload,
// which fsyncs each file, completes without an error; the replica is
// degraded.
func TestReplicaDiskTakenAway(t *testing.T) {
	mounttest.NeedRoot(t)
	work := t.TempDir()
	var dirs, loops, imgs []string
	for i := range 2 {
		img := filepath.Join(work, fmt.Sprintf("d%d.img", i))
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Truncate(img, 64<<20)
		loop := run(t, "losetup", "-f", "--show", img)
		t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
		dev := loop
		loops = append(loops, loop)
		imgs = append(imgs, img)
		run(t, "mkfs.ext4", "-q", "-F", dev)
		d := filepath.Join(work, fmt.Sprintf("m%d", i))
		os.Mkdir(d, 0o755)
		run(t, "mount", dev, d)
		t.Cleanup(func() { unix.Unmount(d, unix.MNT_DETACH) })
		dirs = append(dirs, d)
	}
	ls := locals(t, dirs)
	r := build(t, replica.Options{Policy: replica.RoundRobin, Timeout: 2 * time.Second}, ls...)
	m := mounttest.Mount(t, r)
	defer func() {
		m.Unmount()
		for _, l := range ls {
			l.Close()
		}
	}()
	sync := func(round int) {
		for i := range 20 {
			p := m.Path(fmt.Sprintf("r%d-%d", round, i))
			f, err := os.Create(p)
			if err == nil {
				_, err = f.Write([]byte(strings.Repeat("y", 4096)))
			}
			if err == nil {
				err = f.Sync()
			}
			if f != nil {
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err != nil {
				t.Fatalf("round %d, file %d: %v", round, i, err)
			}
			if b, err := os.ReadFile(p); err != nil || len(b) != 4096 {
				t.Fatalf("round %d, reading back file %d: %d bytes, %v", round, i, len(b), err)
			}
		}
	}
	sync(0)
	// Take the second disk away.
	if err := unix.Unmount(dirs[1], unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(imgs[1], 1<<20); err != nil {
		t.Fatal(err)
	}
	run(t, "losetup", "-c", loops[1])
	for round := 1; round <= 5 && r.Degraded() == 0; round++ {
		sync(round)
	}
	if r.Degraded() != 0b10 {
		t.Errorf("degraded %b after the disk was taken away, want 10", r.Degraded())
	}
	sync(9)
}
