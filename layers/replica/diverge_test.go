//go:build linux

package replica_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/replica"
)

// TestReplicaChangedOutside: replicas changed directly (not through cairn)
// while unmounted are found at the next mount, reported with what to run,
// and degraded, and no read returns their changed bytes; cairn resync makes
// them copies again; an untouched remount finds nothing; a mount after
// kill -9 says that it cannot tell; cairn resync alone reports it too.
func TestReplicaChangedOutside(t *testing.T) {
	mounttest.NeedRoot(t)
	a, b := t.TempDir(), t.TempDir()
	p := mounttest.MountSpec(t, `mount = "r"
[layer.r]
type = "replica"
over = ["a", "b"]
[layer.a]
type = "local"
path = "`+a+`"
[layer.b]
type = "local"
path = "`+b+`"
`)
	specFile := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
	// Large enough to be balanced: half of its opens would go to replica 2.
	big := bytes.Repeat([]byte("0123456789abcdef"), 16<<10)
	if err := os.MkdirAll(p.Path("d/e"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"big": big, "d/f": []byte("f\n"), "d/e/g": []byte("g\n"), "h": []byte("h\n")} {
		if err := os.WriteFile(p.Path(name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p.Unmount()

	logText := func() string { l, _ := os.ReadFile(p.Log); return string(l) }
	// await waits for n lines saying s in the log after mark.
	await := func(mark int, s string, n int) string {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; {
			l := logText()[mark:]
			if strings.Count(l, s) >= n {
				return l
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %d lines %q in the log:\n%s", n, s, l)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	readBig := func(want []byte) {
		t.Helper()
		for range 8 {
			got, err := os.ReadFile(p.Path("big"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("big read %d bytes beginning %q, not the unchanged replica's", len(got), got[:min(16, len(got))])
			}
		}
	}
	resync := func(want ...string) {
		t.Helper()
		out, code := mounttest.Run(t, "resync", specFile)
		if code != 0 || !strings.Contains(out, "replicas degraded now: none") {
			t.Fatalf("cairn resync: exit %d\n%s", code, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("cairn resync does not say %q:\n%s", w, out)
			}
		}
		same(t, a, b)
	}
	clean := func() {
		t.Helper()
		mark := len(logText())
		p.Restart()
		l := await(mark, "no change made outside cairn since the last unmount", 2)
		readBig(big)
		p.Unmount()
		for _, bad := range []string{"changed outside", "degraded", "no seal"} {
			if strings.Contains(l, bad) {
				t.Errorf("an untouched remount says %q:\n%s", bad, l)
			}
		}
	}
	clean()

	for _, c := range []struct {
		name    string
		dir     string // the replica changed
		change  func(dir string) error
		path    string // the first change the check finds
		replica string
	}{
		{"append", b, func(d string) error { return appendTo(filepath.Join(d, "big"), "tail") }, "/big", "replica 2"},
		{"overwrite", b, func(d string) error { return writeAt(filepath.Join(d, "big"), "XXXX", 0) }, "/big", "replica 2"},
		{"new file", b, func(d string) error { return os.WriteFile(filepath.Join(d, "d/e/new"), []byte("n"), 0o644) }, "/d/e", "replica 2"},
		{"unlink", b, func(d string) error { return os.Remove(filepath.Join(d, "d/f")) }, "/d", "replica 2"},
		{"chmod", b, func(d string) error { return os.Chmod(filepath.Join(d, "h"), 0o600) }, "/h", "replica 2"},
		{"rename", b, func(d string) error { return os.Rename(filepath.Join(d, "d/e/g"), filepath.Join(d, "d/e/g2")) }, "/d/e", "replica 2"},
		{"root chmod", b, func(d string) error { return os.Chmod(d, 0o751) }, "its root directory's attributes", "replica 2"},
		{"primary overwritten", a, func(d string) error { return writeAt(filepath.Join(d, "big"), "YYYY", 100) }, "/big", "the primary replica was changed outside cairn"},
	} {
		t.Logf("%s on %s", c.name, c.replica)
		if err := c.change(c.dir); err != nil {
			t.Fatal(err)
		}
		mark := len(logText())
		p.Restart()
		if c.dir == b {
			readBig(big) // while the check runs (reads stay on the primary), and after
		}
		l := await(mark, "changed outside cairn while unmounted", 1)
		readBig(big)
		p.Unmount()
		for _, w := range []string{c.replica, c.path, "run 'cairn resync SPEC'"} {
			if !strings.Contains(l, w) {
				t.Errorf("%s: the mount's report does not say %q:\n%s", c.name, w, l)
			}
		}
		resync()
		clean()
	}

	// cairn resync alone reports it.
	if err := os.Truncate(filepath.Join(b, "d/e/g"), 0); err != nil {
		t.Fatal(err)
	}
	resync("changed outside cairn while unmounted: replica 2", "/d/e/g")
	clean()

	// After kill -9 there is no seal: the next mount says so.
	p.Restart()
	p.Kill()
	mark := len(logText())
	p.Restart()
	if !strings.Contains(await(mark, "mounted", 1), "has no seal") {
		t.Errorf("the mount after kill -9 does not say that the replicas have no seal:\n%s", logText()[mark:])
	}
	p.Unmount()
	clean()
}

func appendTo(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(s)
	return err
}

func writeAt(path, s string, off int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt([]byte(s), off)
	return err
}

// gatedDirs holds the listing of one directory until its gate opens.
type gatedDirs struct {
	layer.Base
	gate <-chan struct{}
	path string
}

func (g *gatedDirs) OpenDir(ctx context.Context, p string) (layer.Dir, error) {
	if p == g.path {
		<-g.gate
	}
	return layer.OpenDir(ctx, g.Lower, p)
}

// TestReplicaReadsWaitForTheCheck: while the check of a replica changed
// outside cairn is under way (held in a listing), no read goes to it, so
// none returns its changed bytes, though every file is balanced; once the
// check finds the change, the replica is degraded.
func TestReplicaReadsWaitForTheCheck(t *testing.T) {
	dirs := lowers(t, 2)
	o := replica.Options{Policy: replica.RoundRobin, Verify: true}
	r0 := build(t, o, locals(t, dirs)...)
	m := mounttest.Mount(t, r0)
	want := bytes.Repeat([]byte("0123456789abcdef"), 16<<10)
	if err := os.Mkdir(m.Path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("d/big"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	m.Unmount()
	r0.Close()
	if err := writeAt(filepath.Join(dirs[1], "d/big"), "XXXX", 0); err != nil {
		t.Fatal(err)
	}

	gate := make(chan struct{})
	r := build(t, o, localFS(t, dirs[0]), &gatedDirs{Base: layer.Base{Lower: localFS(t, dirs[1])}, gate: gate, path: "d"})
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	m = mounttest.Mount(t, r)
	read := func() {
		t.Helper()
		for range 8 {
			got, err := os.ReadFile(m.Path("d/big"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("d/big read %d bytes beginning %q, not replica 1's", len(got), got[:min(16, len(got))])
			}
		}
	}
	read()
	if d := r.Degraded(); d != 0 {
		t.Fatalf("degraded %b before the check got to the change", d)
	}
	release()
	for deadline := time.Now().Add(10 * time.Second); r.Degraded() != 1<<1; {
		if time.Now().After(deadline) {
			t.Fatalf("replica 2 not degraded after its check: degraded %b", r.Degraded())
		}
		time.Sleep(10 * time.Millisecond)
	}
	read()
}
