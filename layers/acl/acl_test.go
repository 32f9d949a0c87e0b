//go:build linux

package acl_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/pathmatch"
)

var (
	alice = mounttest.User{Uid: 1001, Gid: 1001}
	bob   = mounttest.User{Uid: 1002, Gid: 1002, Groups: []uint32{1002, 1003}}
	carol = mounttest.User{Uid: 1004, Gid: 1003}
)

func set(t *testing.T, pats ...string) *pathmatch.Set {
	s, err := pathmatch.NewSet(pats, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tree makes the lower directory: everything open to everyone by the mode
// bits, so that what is refused is refused by the rules.
func tree(t *testing.T) string {
	lower := t.TempDir()
	os.Chmod(lower, 0o777)
	for _, d := range []string{"secret", "pub", "docs", "ro", "keep", "nocat", "bin"} {
		os.Mkdir(filepath.Join(lower, d), 0o777)
		os.Chmod(filepath.Join(lower, d), 0o777)
	}
	for name, data := range map[string]string{"secret/f": "top secret\n", "docs/a": "doc\n", "keep/f": "kept\n",
		"nocat/f": "no cat\n", "pub/x": "public\n", "pub/m": "mmmmmmmm"} {
		p := filepath.Join(lower, name)
		os.WriteFile(p, []byte(data), 0o666)
		os.Chmod(p, 0o666)
	}
	exe, err := os.ReadFile("/usr/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(lower, "bin/true"), exe, 0o755)
	return lower
}

func TestRulesThroughMount(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := tree(t)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	c := mounttest.CountIO(l) // the reads and writes that reach the daemon
	fs := acl.New(c, &acl.Rules{Default: true, List: []acl.Rule{
		{Uids: []uint32{1002}, Ops: acl.Read, Paths: set(t, "secret/")},
		{Gids: []uint32{1003}, Ops: acl.Write, Paths: set(t, "docs/")},
		{Uids: []uint32{1001}, Ops: acl.Create, Paths: set(t, "ro/")},
		{Ops: acl.Delete, Paths: set(t, "keep/")},
		{Uids: []uint32{1002}, Ops: acl.Setattr},
		{Procs: []string{"cat"}, Ops: acl.Read, Paths: set(t, "nocat/")},
		{Uids: []uint32{1001}, Ops: acl.Exec, Paths: set(t, "bin/")},
		{Uids: []uint32{1002}, Ops: acl.Xattr, Paths: set(t, "pub/")},
	}}, false, true)
	t.Cleanup(func() { layer.CloseStack(fs) })
	m := mounttest.Mount(t, fs)
	if !m.Server.Passthrough {
		t.Fatal("acl with fixed rules turned passthrough off")
	}
	defer func() {
		if c.Reads.Load() != 0 || c.Writes.Load() != 0 {
			t.Errorf("acl with fixed rules: %d reads and %d writes reached the daemon instead of passthrough", c.Reads.Load(), c.Writes.Load())
		}
	}()

	type step struct {
		who    mounttest.User
		script string
		ok     bool
		out    string // expected in the output
	}
	steps := []step{
		// read, and the routes to a file: symlink, rename, hard link
		{bob, "cat secret/f", false, "Permission denied"},
		{bob, "ls secret", false, "Permission denied"},
		{alice, "cat secret/f", true, "top secret"},
		{bob, "ln -s ../secret/f pub/l && cat pub/l", false, "Permission denied"},
		{alice, "cat pub/l", true, "top secret"},
		{bob, "mv secret/f pub/f", false, ""},
		{bob, "ln secret/f pub/h", false, "Invalid cross-device link"},
		{bob, "mv secret pub/s", false, ""},
		{alice, "mv secret/f secret/g && mv secret/g secret/f", true, ""},
		// write, by group (bob's supplementary group, carol's own)
		{bob, "echo x >> docs/a", false, "Permission denied"},
		{carol, "echo x >> docs/a", false, "Permission denied"},
		{carol, "cat docs/a", true, "doc"},
		{alice, "echo alice >> docs/a", true, ""},
		// create, delete
		{alice, "touch ro/new", false, "Permission denied"},
		{bob, "touch ro/new2 && rm ro/new2", true, ""},
		{alice, "rm keep/f", false, "Permission denied"},
		{bob, "rm -f keep/f", false, "Permission denied"},
		// setattr: EPERM
		{bob, "touch mine && chmod 600 mine", false, "Operation not permitted"},
		{alice, "touch hers && chmod 600 hers", true, ""},
		// by process name
		{alice, "cat nocat/f", false, "Permission denied"},
		{alice, "head nocat/f", true, "no cat"},
		// exec
		{alice, "./bin/true", false, "Permission denied"},
		{alice, "cat bin/true > /dev/null", true, ""},
		{bob, "./bin/true", true, ""},
		// xattr
		{bob, "setfattr -n user.x -v 1 pub/x", false, "Permission denied"},
		{alice, "setfattr -n user.x -v 1 pub/x && getfattr -n user.x pub/x", true, "user.x"},
		{bob, "getfattr -n user.x pub/x", false, "Permission denied"},
		{bob, "ls -l pub/x", true, "pub/x"}, // ls reads ACLs and labels: not refused
	}
	for _, s := range steps {
		out, err := s.who.Sh(t, m.Dir, s.script)
		if (err == nil) != s.ok || !strings.Contains(out, s.out) {
			t.Errorf("uid %d: %s: %v, %q; want ok=%v and %q", s.who.Uid, s.script, err, out, s.ok, s.out)
		}
	}

	// The lower directory: nothing refused happened.
	for _, p := range []string{"secret/f", "keep/f"} {
		if _, err := os.Stat(filepath.Join(lower, p)); err != nil {
			t.Errorf("lower %s: %v", p, err)
		}
	}
	// (mv of the directory falls back to a copy, which makes pub/s and
	// then cannot read what is in secret.)
	for _, p := range []string{"pub/f", "pub/h", "pub/s/f", "ro/new"} {
		if _, err := os.Lstat(filepath.Join(lower, p)); err == nil {
			t.Errorf("lower %s exists", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "docs/a")); string(b) != "doc\nalice\n" {
		t.Errorf("lower docs/a: %q", b)
	}
	if fi, _ := os.Stat(filepath.Join(lower, "mine")); fi == nil || fi.Mode().Perm() == 0o600 {
		t.Errorf("bob's chmod reached the lower: %v", fi)
	}

	// mmap of an open file, through passthrough.
	h := startHelper(t, alice, m.Dir)
	for _, c := range []string{"open pub/m 2", "mmap 8", "mset 0 MAPPED", "msync"} {
		if r := h.do(c); r != "ok" {
			t.Fatalf("alice: %s: %s", c, r)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "pub/m")); string(b) != "MAPPEDmm" {
		t.Errorf("lower pub/m after alice's mmap: %q", b)
	}
	if r := startHelper(t, bob, m.Dir).do("open secret/f 0"); r != "err EACCES" {
		t.Errorf("bob opening secret/f: %s", r)
	}
}

// TestReload changes the rules of a mounted stack (the spec, then SIGHUP)
// while a user holds a descriptor and a mapping: what the new rules take
// away is gone on the next read, write and write-back.
func TestReload(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	os.Chmod(lower, 0o777)
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = 'a'
	}
	os.WriteFile(filepath.Join(lower, "data"), data, 0o666)
	os.Chmod(filepath.Join(lower, "data"), 0o666)
	spec := func(action string) string {
		return `mount = "acl"
[layer.acl]
type = "acl"
over = "base"
reload = true
log_denials = true
[[rule]]
layer = "acl"
match = "data"
users = ["1002"]
ops = ["read", "write"]
action = "` + action + `"
[layer.base]
type = "local"
path = "` + lower + `"
`
	}
	p := mounttest.MountSpec(t, spec("allow"))
	h := startHelper(t, bob, p.Dir)
	for _, c := range []string{"open data 2", "write 0 bob", "mmap 4096", "mset 8 mapped", "msync"} {
		if r := h.do(c); r != "ok" {
			t.Fatalf("bob, allowed: %s: %s", c, r)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "data")); string(b[:16]) != "bobaaaaamappedaa" {
		t.Fatalf("lower after the allowed writes: %q", b[:16])
	}

	// Deny, reload.
	specFile := filepath.Join(filepath.Dir(p.Dir), "spec.toml")
	if err := os.WriteFile(specFile, []byte(spec("deny")), 0o644); err != nil {
		t.Fatal(err)
	}
	p.Cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, p.Log, "rules reloaded")

	for c, want := range map[string]string{
		"write 100 denied": "err EACCES",
		"read 3145728 4":   "err EACCES", // a part never read: not in the page cache
	} {
		if r := h.do(c); r != want {
			t.Errorf("bob after the reload: %s: %s, want %s", c, r, want)
		}
	}
	// The mapping: its page is read again (refused: SIGBUS) or, if still
	// cached, its write-back is refused.
	if r := h.do("mset 8 MAPPED"); r == "ok" {
		if r := h.do("msync"); r == "ok" {
			t.Errorf("msync of a mapping after its write was revoked: %s", r)
		}
	} else if r != "err SIGBUS" {
		t.Errorf("writing the mapping after the reload: %s", r)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "data")); string(b[:16]) != "bobaaaaamappedaa" || b[100] != 'a' {
		t.Errorf("lower after the refused writes: %q", b[:16])
	}
	if r := startHelper(t, bob, p.Dir).do("open data 0"); r != "err EACCES" {
		t.Errorf("bob opening after the reload: %s", r)
	}
	if log, _ := os.ReadFile(p.Log); !strings.Contains(string(log), "acl: denied") {
		t.Errorf("denials not logged:\n%s", log)
	}
}

// TestReloadNoPassthroughData runs the model checker through an acl layer
// whose files are not passed through (reload = true).
func TestReloadNoPassthroughData(t *testing.T) {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fs := acl.New(l, &acl.Rules{Default: true}, true, false)
	m := mounttest.Mount(t, fs)
	if m.Server.Passthrough {
		// Passthrough is per file: check a file refuses it.
		f, _, _ := fs.Create(t.Context(), "probe", os.O_RDWR, 0o644)
		if _, ok := f.PassthroughFd(); ok {
			t.Fatal("acl with reload = true offers passthrough")
		}
		f.Release(t.Context())
	}
	fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: 3000})
}

func waitLog(t *testing.T, path, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), what) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never logged %q:\n%s", what, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFixedRulesStay: with reload = false, SIGHUP leaves the rules alone
// (and says so in the log).
func TestFixedRulesStay(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	os.Chmod(lower, 0o777)
	os.WriteFile(filepath.Join(lower, "f"), []byte("x"), 0o644)
	spec := func(action string) string {
		return "mount = \"acl\"\n[layer.acl]\ntype = \"acl\"\nover = \"base\"\n" +
			"[[rule]]\nlayer = \"acl\"\nmatch = \"f\"\nops = [\"read\"]\naction = \"" + action + "\"\n" +
			"[layer.base]\ntype = \"local\"\npath = \"" + lower + "\"\n"
	}
	p := mounttest.MountSpec(t, spec("allow"))
	os.WriteFile(filepath.Join(filepath.Dir(p.Dir), "spec.toml"), []byte(spec("deny")), 0o644)
	p.Cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, p.Log, "rules not reloaded")
	if out, err := bob.Sh(t, p.Dir, "cat f"); err != nil || out != "x" {
		t.Fatalf("bob after a refused reload: %q, %v", out, err)
	}
}
