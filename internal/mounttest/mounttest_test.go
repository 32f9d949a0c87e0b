package mounttest_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// mounted reports whether dir is a mountpoint of this process's namespace.
func mounted(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

// TestMountUnmount: Mount serves the stack on a new directory that other
// users may reach, Unmount removes it and may be called again.
func TestMountUnmount(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	os.WriteFile(filepath.Join(lower, "f"), []byte("lower"), 0o644)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := mounttest.CountIO(l)
	m := mounttest.MountOpts(t, c, fusefs.Options{AllowOther: true, NoPassthrough: true})
	if !mounted(t, m.Dir) {
		t.Fatalf("%s is not a mountpoint", m.Dir)
	}
	if m.Path("a", "b") != m.Dir+"/a/b" {
		t.Fatalf("Path: %s", m.Path("a", "b"))
	}
	if b, err := os.ReadFile(m.Path("f")); err != nil || string(b) != "lower" {
		t.Fatalf("read through the mount: %q %v", b, err)
	}
	if err := os.WriteFile(m.Path("g"), []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	// CountIO saw the read and the write, with their bytes.
	if c.Reads.Load() == 0 || c.ReadBytes.Load() != 5 || c.Writes.Load() != 1 || c.WriteBytes.Load() != 5 {
		t.Fatalf("counted %d reads (%d bytes), %d writes (%d bytes)", c.Reads.Load(), c.ReadBytes.Load(), c.Writes.Load(), c.WriteBytes.Load())
	}
	if fi, err := os.Stat(m.Dir); err != nil || fi.Mode().Perm()&0o005 != 0o005 {
		t.Fatalf("mountpoint: %v %v", fi.Mode(), err)
	}
	out, err := mounttest.User{Uid: 65534, Gid: 65534}.Sh(t, m.Dir, "cat f")
	if err != nil || out != "lower" {
		t.Fatalf("another user through allow_other: %q %v", out, err)
	}
	m.Unmount()
	if mounted(t, m.Dir) {
		m.Server.Unmount() // do not leave it behind
		t.Fatal("still mounted after Unmount")
	}
	m.Unmount() // again: nothing happens
	if b, err := os.ReadFile(filepath.Join(lower, "g")); err != nil || string(b) != "12345" {
		t.Fatalf("lower after unmount: %q %v", b, err)
	}
}

// TestUser: commands run with the user's identity and groups, and Sh runs
// in the directory it is given.
func TestUser(t *testing.T) {
	mounttest.NeedRoot(t)
	u := mounttest.User{Uid: 65534, Gid: 65534, Groups: []uint32{65534, 4242}}
	out, err := u.Command("id", "-u").Output()
	if err != nil || strings.TrimSpace(string(out)) != "65534" {
		t.Fatalf("id -u: %q %v", out, err)
	}
	out, err = u.Command("id", "-G").Output()
	if err != nil || !strings.Contains(string(out), "4242") {
		t.Fatalf("id -G: %q %v", out, err)
	}
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	got, err := u.Sh(t, dir, "pwd; exit 3")
	if strings.TrimSpace(got) != dir || err == nil {
		t.Fatalf("Sh: %q %v", got, err)
	}
	if got, err := (mounttest.User{Uid: 65534, Gid: 65534}).Sh(t, dir, "touch x"); err == nil {
		t.Fatalf("a user wrote in root's 0755 directory: %q", got)
	}
}

// TestProcessMount: MountSpec mounts with a cairn process, Kill crashes it,
// Restart mounts again, and Run gives the command's output and exit code.
func TestProcessMount(t *testing.T) {
	lower := t.TempDir()
	p := mounttest.MountSpec(t, "mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = "+strconv.Quote(lower)+
		"\n[layer.top]\ntype = \"null\"\nover = \"base\"\n")
	if err := os.WriteFile(p.Path("f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "f")); string(b) != "x" {
		t.Fatalf("lower: %q", b)
	}
	pid := p.Cmd.Process.Pid
	p.Kill()
	if mounted(t, p.Dir) {
		t.Fatal("still mounted after Kill")
	}
	p.Restart()
	if p.Cmd.Process.Pid == pid {
		t.Fatal("Restart did not start a new process")
	}
	if b, err := os.ReadFile(p.Path("f")); err != nil || string(b) != "x" {
		t.Fatalf("after restart: %q %v", b, err)
	}
	p.Unmount()
	if mounted(t, p.Dir) {
		t.Fatal("still mounted after Unmount")
	}
	out, code := mounttest.Run(t, "check", "null:"+lower)
	if code != 0 {
		t.Fatalf("cairn check: %d %s", code, out)
	}
	if out, code := mounttest.Run(t, "no-such-command"); code == 0 {
		t.Fatalf("an unknown command exited 0: %s", out)
	}
}

// TestCountIOPassesThrough: CountIO changes nothing: the stack keeps
// passthrough, and the files keep their descriptors.
func TestCountIOPassesThrough(t *testing.T) {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := mounttest.CountIO(l)
	if layer.StackChanges(c) != 0 {
		t.Fatalf("changes %v", layer.StackChanges(c))
	}
	f, _, err := c.Create(context.Background(), "f", os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(context.Background())
	if _, ok := f.PassthroughFd(); !ok {
		t.Fatal("a counted file refuses passthrough")
	}
}
