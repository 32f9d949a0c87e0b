package dfstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Cluster is a throwaway cluster of this host that a script of the
// repository runs (test/gluster.sh, test/ceph.sh), in a state directory of
// its own: started by the first test that asks (Start), stopped when the
// test binary ends (Stop, from the package's Main). glustertest and
// cephtest each keep one.
type Cluster struct {
	Name   string // "GlusterFS", for messages
	Script string // the script, from the repository's root: "test/gluster.sh"
	Up     string // the script's commands that start and stop the cluster
	Down   string

	mu      sync.Mutex
	dir     string // the state directory, "" until started
	script  string // Script's path
	err     error
	started bool
}

// Start starts the cluster once per test binary, and gives its state
// directory and the script's path.
func (c *Cluster) Start(t testing.TB) (dir, script string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started {
		c.started = true
		c.err = func() error {
			s, err := repoFile(c.Script)
			if err != nil {
				return err
			}
			// Not t.TempDir: the cluster outlives the test that starts it.
			d, err := os.MkdirTemp("", "cairn-"+strings.ToLower(c.Name)+"-")
			if err != nil {
				return err
			}
			os.Chmod(d, 0o755) // other users reach the mounts below it
			if out, err := exec.Command(s, c.Up, d).CombinedOutput(); err != nil {
				exec.Command(s, c.Down, d).Run()
				return fmt.Errorf("%s %s: %v\n%s", c.Script, c.Up, err, out)
			}
			c.dir, c.script = d, s
			return nil
		}()
	}
	if c.err != nil {
		t.Fatal(c.err)
	}
	if c.dir == "" {
		t.Fatalf("the %s cluster was stopped", c.Name)
	}
	return c.dir, c.script
}

// Stop stops the cluster, if it was started, and removes its directory.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir == "" {
		return
	}
	if out, err := exec.Command(c.script, c.Down, c.dir).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the %s cluster in %s: %v\n%s", c.Name, c.dir, err, out)
	}
	c.dir = ""
}

var seq struct {
	sync.Mutex
	n int
}

// Next is a number not given before in this test binary: for mountpoints
// and directories.
func Next() int {
	seq.Lock()
	defer seq.Unlock()
	seq.n++
	return seq.n
}

// Sanitize makes a test's name a file name.
func Sanitize(s string) string {
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
