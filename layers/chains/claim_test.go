package chains_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/chains"
)

// TestClaimLockFile: the claim locks a regular file at the lower's root
// (which other clients of a network file system see, unlike the
// directory's lock): hidden through the mount, and neither a file nor an
// unfinished conversion to fsck.
func TestClaimLockFile(t *testing.T) {
	d := t.TempDir()
	spec := fmt.Sprintf("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.top]\ntype = \"chains\"\nover = \"base\"\n[[rule]]\nlayer = \"top\"\nmatch = \"*.z\"\nchain = [\"zstd\"]\n", d)
	sp := filepath.Join(t.TempDir(), "spec.toml")
	if err := os.WriteFile(sp, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	p := mounttest.MountSpec(t, spec)
	if err := os.WriteFile(p.Path("f.z"), []byte(strings.Repeat("guarded ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := getChain(t, p.Path("f.z")); got != "zstd" {
		t.Fatalf("f.z's chain is %q", got)
	}
	mounttest.LockFileHidden(t, p.Dir, chains.LockName, filepath.Join(d, chains.LockName))
	p.Unmount()
	out, code := mounttest.Run(t, "fsck", sp)
	if code != 0 || !strings.Contains(out, "chains: 1 files, 1 guarded, 0 not readable, 0 unfinished conversions") {
		t.Fatalf("fsck: exit %d: %s", code, out)
	}
}
