//go:build linux

package replica_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/replica"
)

// TestClaimLockFile: the claim locks a regular file at each replica's
// root (which other clients of a network file system see, unlike the
// directory's lock): hidden through the mount, not a change made outside
// cairn to the seal's check when a mount makes it (a replica set sealed
// before lock files were), and neither copied nor removed by resync.
func TestClaimLockFile(t *testing.T) {
	mounttest.NeedRoot(t)
	a, b := t.TempDir(), t.TempDir()
	spec := `mount = "r"
[layer.r]
type = "replica"
over = ["a", "b"]
[layer.a]
type = "local"
path = "` + a + `"
[layer.b]
type = "local"
path = "` + b + `"
`
	p := mounttest.MountSpec(t, spec)
	specFile := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
	if err := os.WriteFile(p.Path("f"), []byte("f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{a, b} {
		mounttest.LockFileHidden(t, p.Dir, replica.LockName, filepath.Join(d, replica.LockName))
	}
	p.Unmount()
	// As if sealed without lock files (by a cairn before them): the next
	// mount makes them, and its check finds no change.
	for _, d := range []string{a, b} {
		removeKeepTimes(t, filepath.Join(d, replica.LockName))
	}
	mark := 0
	if l, err := os.ReadFile(p.Log); err == nil {
		mark = len(l)
	}
	p.Restart()
	for deadline := time.Now().Add(30 * time.Second); ; {
		l, _ := os.ReadFile(p.Log)
		log := string(l[mark:])
		if strings.Contains(log, "changed outside") || strings.Contains(log, "degraded") {
			t.Fatalf("a mount that made the lock files says:\n%s", log)
		}
		if strings.Count(log, "no change made outside cairn since the last unmount") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no check of the two replicas in the log:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, d := range []string{a, b} {
		mounttest.LockFileHidden(t, p.Dir, replica.LockName, filepath.Join(d, replica.LockName))
	}
	p.Unmount()
	// A full resync compares every object but the lock files.
	removeKeepTimes(t, filepath.Join(b, replica.LockName))
	out, code := mounttest.Run(t, "resync", "--full", specFile)
	if code != 0 || !strings.Contains(out, " 0 copied (0 bytes), 0 renamed, 0 removed") {
		t.Fatalf("cairn resync --full: exit %d: %s", code, out)
	}
	if _, err := os.Stat(filepath.Join(a, replica.LockName)); err != nil {
		t.Fatal(err)
	}
}

// removeKeepTimes removes file p, leaving its directory's times as they
// were (its ctime moves, which the seal does not record of a root).
func removeKeepTimes(t *testing.T, p string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Dir(p), &st); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Dir(p), ts, 0); err != nil {
		t.Fatal(err)
	}
}
