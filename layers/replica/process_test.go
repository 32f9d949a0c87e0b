//go:build linux

package replica_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestResyncCommand: through cairn mount and cairn resync. The second
// replica's fault layer starts failing (the spec changed, SIGHUP)
// mid-workload; the application sees no error; the next mount reports the
// replica degraded; cairn resync copies what changed, and a cairn resync
// killed with SIGKILL midway is resumed by the next.
func TestResyncCommand(t *testing.T) {
	mounttest.NeedRoot(t)
	a, b := t.TempDir(), t.TempDir()
	specOf := func(rules string) string {
		return `mount = "r"
[layer.r]
type = "replica"
over = ["a", "fb"]
timeout = "2s"
[layer.a]
type = "local"
path = "` + a + `"
[layer.fb]
type = "fault"
over = "b"
reload = true
log = true
[layer.b]
type = "local"
path = "` + b + `"
` + rules
	}
	p := mounttest.MountSpec(t, specOf(""))
	write := func(round, n int) {
		t.Helper()
		for i := range n {
			dir := p.Path(fmt.Sprintf("d%d", i%10))
			os.MkdirAll(dir, 0o755)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("r%d-%d", round, i)), []byte(strings.Repeat("x", 100+i)), 0o644); err != nil {
				t.Fatalf("round %d, file %d: %v", round, i, err)
			}
		}
	}
	write(0, 100)
	specFile := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
	os.WriteFile(specFile, []byte(specOf(`[[rule]]
layer = "fb"
match = "**"
errno = "EIO"
`)), 0o644)
	p.Cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(20 * time.Second)
	for round := 1; ; round++ {
		write(round, 100)
		if log, _ := os.ReadFile(p.Log); strings.Contains(string(log), "replica: a replica fails and is degraded") {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(p.Log)
			t.Fatalf("replica 2 never degraded:\n%s", log)
		}
	}
	write(99, 2000)
	p.Unmount()
	os.WriteFile(specFile, []byte(specOf("")), 0o644)

	// A mount reports it.
	p.Restart()
	p.Unmount()
	if log, _ := os.ReadFile(p.Log); !strings.Contains(string(log), "a replica is degraded (it missed changes): run 'cairn resync SPEC'") {
		t.Errorf("the mount did not report the degraded replica:\n%s", log)
	}

	// A resync killed midway, then one to the end.
	cmd := exec.Command(mounttest.Binary(t), "resync", specFile)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	out, code := mounttest.Run(t, "resync", specFile)
	if code != 0 || !strings.Contains(out, "replicas degraded now: none") {
		t.Fatalf("cairn resync: exit %d\n%s", code, out)
	}
	t.Logf("after the kill: %s", out)
	same(t, a, b)
	out, code = mounttest.Run(t, "resync", specFile)
	if code != 0 || !strings.Contains(out, " 0 copied") {
		t.Errorf("a second cairn resync: exit %d\n%s", code, out)
	}
}
