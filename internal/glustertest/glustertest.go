// Package glustertest gives tests directories on a GlusterFS volume: a
// throwaway cluster of this host (test/gluster.sh: glusterd, a one-brick
// volume "one" and a two-brick distribute volume "two", in a temporary
// directory and a network namespace of their own), started by the first
// test that asks and stopped when the test binary ends (Main), and FUSE
// client mounts of its volumes, one per call, as separate machines would
// have them.
//
// On CI (CI=true) a missing GlusterFS fails the test: setup.sh installs
// glusterfs-server and glusterfs-client.
package glustertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/internal/dfstest"
	"cairnfs.dev/cairn/internal/mounttest"
)

var cluster = &dfstest.Cluster{Name: "GlusterFS", Script: "test/gluster.sh", Up: "start", Down: "stop"}

// Main runs the tests and then stops the cluster, if one was started:
// func TestMain(m *testing.M) { glustertest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the cluster (every client mount, glusterd and the bricks) and
// removes its directory. Main calls it.
func Stop() { cluster.Stop() }

// Need skips the test when GlusterFS is not installed or the test does not
// run as root; on CI it fails instead.
func Need(t testing.TB) {
	t.Helper()
	mounttest.Need(t)
	mounttest.NeedRoot(t)
	for _, c := range []string{"glusterd", "glusterfs", "gluster"} {
		if _, err := exec.LookPath(c); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("GlusterFS is required on CI but %s is missing (setup.sh installs glusterfs-server and glusterfs-client)", c)
			}
			t.Skipf("GlusterFS is not installed (no %s): apt-get install glusterfs-server glusterfs-client", c)
		}
	}
}

// start starts the cluster once per test binary.
func start(t testing.TB) (dir, script string) {
	t.Helper()
	Need(t)
	return cluster.Start(t)
}

// Shared are the glusterfs client's options for a lower that other clients
// change: no kernel caching of names, attributes or missing names (the
// client's defaults keep names and attributes 1 s, so that another client's
// append is not seen by a read at once: docs/distributed.md).
var Shared = []string{"--entry-timeout=0", "--attribute-timeout=0", "--negative-timeout=0", "--fopen-keep-cache=off"}

// Mount mounts volume vol ("one" or "two") with a new glusterfs FUSE client
// on a new directory and returns it; the client is unmounted when the test
// ends. Two calls give two clients of the same volume, each with its own
// caches, as two machines would have. opts are more options of the
// glusterfs client (Shared).
func Mount(t testing.TB, vol string, opts ...string) string {
	t.Helper()
	dir, script := start(t)
	mnt := filepath.Join(dir, "clients", fmt.Sprintf("%s-%d", vol, dfstest.Next()))
	cmd := exec.Command(script, "mount", dir, vol, mnt)
	cmd.Env = append(os.Environ(), "CAIRN_GLUSTER_CLIENT_OPTS="+strings.Join(opts, " "))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("test/gluster.sh mount %s: %v\n%s", vol, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(script, "umount", dir, mnt).CombinedOutput(); err != nil {
			t.Errorf("test/gluster.sh umount %s: %v\n%s", mnt, err, out)
		}
	})
	return mnt
}

// Dir returns a new, empty directory on volume vol through a new client
// mount: each test's files apart from the others' on the shared volume.
func Dir(t testing.TB, vol string) string {
	t.Helper()
	d := filepath.Join(Mount(t, vol), fmt.Sprintf("%s-%d", dfstest.Sanitize(t.Name()), dfstest.Next()))
	if err := os.Mkdir(d, 0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

// KillBricks kills volume vol's brick processes (SIGKILL): the servers of
// its files are gone, the clients stay mounted.
func KillBricks(t testing.TB, vol string) {
	t.Helper()
	dir, script := start(t)
	if out, err := exec.Command(script, "kill-bricks", dir, vol).CombinedOutput(); err != nil {
		t.Fatalf("test/gluster.sh kill-bricks %s: %v\n%s", vol, err, out)
	}
}

// StartBricks starts volume vol's dead bricks again.
func StartBricks(t testing.TB, vol string) {
	t.Helper()
	dir, script := start(t)
	if out, err := exec.Command(script, "start-bricks", dir, vol).CombinedOutput(); err != nil {
		t.Fatalf("test/gluster.sh start-bricks %s: %v\n%s", vol, err, out)
	}
}

// IsGluster says whether dir is on a GlusterFS FUSE mount.
func IsGluster(dir string) bool {
	var st syscall.Statfs_t
	// FUSE's magic; the mount table tells GlusterFS from others, but a
	// FUSE lower is what matters to the tests' callers.
	return syscall.Statfs(dir, &st) == nil && st.Type == 0x65735546
}
