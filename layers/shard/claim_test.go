//go:build linux

package shard_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/shard"
)

// TestClaimLockFile: the claim locks a regular file at the lower's root
// (which other clients of a network file system see, unlike the
// directory's lock), hidden through the mount whether the root is flat or
// sharded; a resharding of the root leaves it in place.
func TestClaimLockFile(t *testing.T) {
	lower := t.TempDir()
	spec := fmt.Sprintf(`mount = "top"
[layer.base]
type = "local"
path = %q
[layer.top]
type = "shard"
over = "base"
`, lower)
	p := mounttest.MountSpec(t, spec)
	names := []string{"a", "b", "c", "d", "e"}
	for _, n := range names {
		if err := os.WriteFile(p.Path(n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lock := filepath.Join(lower, shard.LockName)
	mounttest.LockFileHidden(t, p.Dir, shard.LockName, lock)
	// The root, resharded into 4 buckets by the daemon.
	sp := filepath.Join(t.TempDir(), "spec.toml")
	if err := os.WriteFile(sp, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mounttest.Binary(t), "reshard", "-q", "--layout", "hash 4", sp, p.Dir).CombinedOutput(); err != nil {
		t.Fatalf("cairn reshard: %v: %s", err, out)
	}
	ents, err := os.ReadDir(lower)
	if err != nil {
		t.Fatal(err)
	}
	buckets := 0
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), shard.DefaultPrefix):
			buckets++
		case e.Name() != shard.LockName:
			t.Fatalf("the sharded root holds %s besides the buckets and the lock file", e.Name())
		}
	}
	if buckets == 0 {
		t.Fatal("the root was not resharded")
	}
	mounttest.LockFileHidden(t, p.Dir, shard.LockName, lock)
	ents, err = os.ReadDir(p.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Fatalf("the sharded root lists %v, want %v", got, names)
	}
}
