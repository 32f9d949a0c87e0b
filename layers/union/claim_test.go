//go:build linux

package union_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestClaimLockFile: the claim locks a regular file of the upper branch,
// in the index's directory (which other clients of a network file system
// see, unlike the directory's lock): hidden through the mount, left alone
// by fsck, and the times of the branch's root stay as they were.
func TestClaimLockFile(t *testing.T) {
	up, lo := t.TempDir(), t.TempDir()
	lowerTree(t, lo)
	before, err := os.Stat(up)
	if err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(t.TempDir(), "spec.toml")
	write(t, spec, `mount = "u"
[layer.u]
type = "union"
over = ["up", "lo"]
[layer.up]
type = "local"
path = "`+up+`"
[layer.lo]
type = "local"
path = "`+lo+`"
`)
	p := mounttest.MountSpec(t, read(t, spec))
	if after, err := os.Stat(up); err != nil || !after.ModTime().Equal(before.ModTime()) {
		t.Fatalf("the upper branch's mtime went from %v to %v (%v)", before.ModTime(), after.ModTime(), err)
	}
	write(t, p.Path("new"), "new\n")
	mounttest.LockFileHidden(t, p.Dir, ".cairn-union-index/lock", filepath.Join(up, ".cairn-union-index", "lock"))
	if out, code := mounttest.Run(t, "fsck", spec); code != 5 || !strings.Contains(out, "in use by another cairn process") {
		t.Fatalf("fsck of the mounted union: exit %d: %s", code, out)
	}
	p.Unmount()
	if out, code := mounttest.Run(t, "fsck", spec); code != 0 || strings.Contains(out, "lock") {
		t.Fatalf("fsck: exit %d: %s", code, out)
	}
}
