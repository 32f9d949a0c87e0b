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
	"sync"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

var cluster struct {
	mu      sync.Mutex
	dir     string // the state directory, "" until started
	script  string
	err     error
	started bool
}

// Main runs the tests and then stops the cluster, if one was started:
// func TestMain(m *testing.M) { glustertest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the cluster (every client mount, glusterd and the bricks) and
// removes its directory. Main calls it.
func Stop() {
	cluster.mu.Lock()
	defer cluster.mu.Unlock()
	if cluster.dir == "" {
		return
	}
	if out, err := exec.Command(cluster.script, "stop", cluster.dir).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "glustertest: stopping the cluster in %s: %v\n%s", cluster.dir, err, out)
	}
	cluster.dir = ""
}

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
	cluster.mu.Lock()
	defer cluster.mu.Unlock()
	if !cluster.started {
		cluster.started = true
		cluster.err = func() error {
			s, err := repoFile("test/gluster.sh")
			if err != nil {
				return err
			}
			// Not t.TempDir: the cluster outlives the test that starts it.
			d, err := os.MkdirTemp("", "cairn-gluster-")
			if err != nil {
				return err
			}
			os.Chmod(d, 0o755) // other users reach the mounts below it
			if out, err := exec.Command(s, "start", d).CombinedOutput(); err != nil {
				exec.Command(s, "stop", d).Run()
				return fmt.Errorf("test/gluster.sh start: %v\n%s", err, out)
			}
			cluster.dir, cluster.script = d, s
			return nil
		}()
	}
	if cluster.err != nil {
		t.Fatal(cluster.err)
	}
	if cluster.dir == "" {
		t.Fatal("the GlusterFS cluster was stopped")
	}
	return cluster.dir, cluster.script
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
	mnt := filepath.Join(dir, "clients", fmt.Sprintf("%s-%d", vol, next()))
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
	d := filepath.Join(Mount(t, vol), fmt.Sprintf("%s-%d", sanitize(t.Name()), next()))
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

var seq struct {
	sync.Mutex
	n int
}

func next() int {
	seq.Lock()
	defer seq.Unlock()
	seq.n++
	return seq.n
}

func sanitize(s string) string {
	return strings.NewReplacer("/", "-", " ", "_").Replace(s)
}

// repoFile finds a file of the repository from the test's directory (go
// test runs in the package's directory, somewhere below go.mod's).
func repoFile(rel string) (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, rel), nil
		}
		p := filepath.Dir(d)
		if p == d {
			return "", fmt.Errorf("no go.mod above the test's directory: cannot find %s", rel)
		}
		d = p
	}
}
