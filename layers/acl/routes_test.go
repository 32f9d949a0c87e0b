//go:build linux

package acl_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/local"
)

// nobody is the second user of these tests: uid 65534 through a mount with
// allow_other.
var nobody = mounttest.User{Uid: 65534, Gid: 65534}

// mountRules mounts an acl layer with rules over the tree of tree(t).
func mountRules(t *testing.T, rules ...acl.Rule) (lower string, m *mounttest.Mounted) {
	t.Helper()
	mounttest.NeedRoot(t)
	lower = tree(t)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	fs := acl.New(l, &acl.Rules{Default: true, List: rules}, false, true)
	t.Cleanup(func() { layer.CloseStack(fs) })
	return lower, mounttest.Mount(t, fs)
}

func readLower(t *testing.T, lower, name string) string {
	b, err := os.ReadFile(filepath.Join(lower, name))
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return string(b)
}

// TestRenameIsDeleteAndCreate: a rename is a removal from the source
// directory and a creation in the target one, and replacing a file is a
// write of it: a user who may not create in a directory cannot plant a file
// there by renaming it in, one who may not write a file cannot replace it,
// one who may not delete cannot move a file out, with rename(2) and with
// renameat2's RENAME_EXCHANGE and RENAME_NOREPLACE.
func TestRenameIsDeleteAndCreate(t *testing.T) {
	lower, m := mountRules(t,
		acl.Rule{Uids: []uint32{nobody.Uid}, Ops: acl.Create, Paths: set(t, "ro/"), Where: "no create in ro"},
		acl.Rule{Uids: []uint32{nobody.Uid}, Ops: acl.Delete, Paths: set(t, "keep/"), Where: "no delete in keep"},
		acl.Rule{Uids: []uint32{nobody.Uid}, Ops: acl.Write, Paths: set(t, "docs/"), Where: "no write in docs"},
	)
	steps := []struct {
		script string
		ok     bool
		out    string
	}{
		{"echo planted > pub/p1 && mv pub/p1 ro/p1", false, "Permission denied"},
		{"echo evil > pub/p2 && mv -f pub/p2 docs/a", false, "Permission denied"},
		{"echo evil > docs/new", false, "Permission denied"}, // (create is allowed, the write is not)
		{"mv keep/f pub/f", false, ""},
		{"echo fine > pub/p3 && mv pub/p3 pub/p4 && cat pub/p4", true, "fine"},
		{"echo fine > docs/p5", false, ""},
		{"touch pub/p6 && mv pub/p6 docs/p6", true, ""}, // a new name in docs: create, allowed
	}
	for _, s := range steps {
		out, err := nobody.Sh(t, m.Dir, s.script)
		if (err == nil) != s.ok || !strings.Contains(out, s.out) {
			t.Errorf("uid %d: %s: %v, %q; want ok=%v and %q", nobody.Uid, s.script, err, out, s.ok, s.out)
		}
	}
	h := startHelper(t, nobody, m.Dir)
	os.WriteFile(filepath.Join(lower, "pub/x1"), []byte("x1\n"), 0o666)
	for _, c := range []struct{ cmd, want string }{
		{fmt.Sprintf("rename2 pub/x1 docs/a %d", layer.RenameExchange), "err EACCES"},
		{fmt.Sprintf("rename2 pub/x1 keep/f %d", layer.RenameExchange), "err EACCES"},
		{fmt.Sprintf("rename2 pub/x1 ro/x1 %d", layer.RenameNoreplace), "err EACCES"},
		{fmt.Sprintf("rename2 pub/x1 pub/x2 %d", layer.RenameNoreplace), "ok"},
	} {
		if got := h.do(c.cmd); got != c.want {
			t.Errorf("uid %d: %s: %s, want %s", nobody.Uid, c.cmd, got, c.want)
		}
	}
	// The rules are nobody's: root renames freely.
	if err := os.Rename(filepath.Join(m.Dir, "pub/x2"), filepath.Join(m.Dir, "ro/x2")); err != nil {
		t.Errorf("root: %v", err)
	}

	// The lower directory: nothing refused happened.
	for name, want := range map[string]string{"docs/a": "doc\n", "keep/f": "kept\n", "pub/p4": "fine\n", "ro/x2": "x1\n"} {
		if got := readLower(t, lower, name); got != want {
			t.Errorf("lower %s: %q, want %q", name, got, want)
		}
	}
	for _, name := range []string{"ro/p1", "ro/x1", "pub/f", "pub/x1"} {
		if _, err := os.Lstat(filepath.Join(lower, name)); err == nil {
			t.Errorf("lower %s exists", name)
		}
	}
}

// TestProcsByExecutable: a procs rule matches the program the kernel ran
// (/proc/PID/exe), not the name a process gives itself: a copy of another
// program named cat, and a process that renames itself cat with prctl, are
// not cat; cat is.
func TestProcsByExecutable(t *testing.T) {
	lower, m := mountRules(t,
		acl.Rule{Allow: true, Procs: []string{"cat"}, Ops: acl.Read, Paths: set(t, "secret/"), Where: "cat may read"},
		acl.Rule{Ops: acl.Read, Paths: set(t, "secret/"), Where: "no one else"},
	)
	_ = lower
	bin := t.TempDir()
	os.Chmod(bin, 0o755)
	os.Chmod(filepath.Dir(bin), 0o755)
	head, err := exec.LookPath("head")
	if err != nil {
		t.Fatal(err)
	}
	cat, _ := exec.LookPath("cat")
	copyFile(t, head, filepath.Join(bin, "cat"))  // another program, named cat
	copyFile(t, cat, filepath.Join(bin, "mycat")) // cat, copied: another file
	for _, c := range []struct {
		script string
		ok     bool
	}{
		{"cat secret/f", true},
		{"head secret/f", false},
		{bin + "/cat secret/f", false},
		{bin + "/mycat secret/f", false},
		{"cat < secret/f", false}, // the shell opens it
		// The copies run, and read what they may:
		{bin + "/cat pub/x", true},
		{bin + "/mycat pub/x", true},
	} {
		out, err := nobody.Sh(t, m.Dir, c.script)
		want := "top secret\n"
		if strings.HasSuffix(c.script, "pub/x") {
			want = "public\n"
		}
		if (err == nil) != c.ok || (c.ok && out != want) || (!c.ok && !strings.Contains(out, "Permission denied")) {
			t.Errorf("uid %d: %s: %v, %q; want ok=%v", nobody.Uid, c.script, err, out, c.ok)
		}
	}
	h := startHelper(t, nobody, m.Dir)
	if got := h.do("comm cat"); got != "ok" {
		t.Fatalf("prctl: %s", got)
	}
	if comm := procComm(t, h); comm != "cat" {
		t.Fatalf("the helper's name is %q, not cat", comm)
	}
	if got := h.do("cat secret/f"); got != "err EACCES" {
		t.Errorf("a process that calls itself cat read secret/f: %s", got)
	}
}

// procComm reads the name of the helper's thread: it runs on one thread, the
// one that made it (its pid).
func procComm(t *testing.T, h *proc) string {
	t.Helper()
	out := h.do("pid")
	var pid int
	fmt.Sscanf(strings.TrimPrefix(out, "ok "), "%d", &pid)
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", pid, pid))
	return strings.TrimSpace(string(b))
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestReadDenialDeniesExec: a user refused reading a program is refused
// running it too (it could read the program back from its memory,
// /proc/PID/mem), unless a rule allows exec by name.
func TestReadDenialDeniesExec(t *testing.T) {
	lower, m := mountRules(t,
		acl.Rule{Uids: []uint32{nobody.Uid}, Ops: acl.Read, Paths: set(t, "bin/hidden"), Where: "no read"},
		acl.Rule{Allow: true, Uids: []uint32{nobody.Uid}, Ops: acl.Exec, Paths: set(t, "bin/runnable"), Where: "exec by name"},
		acl.Rule{Uids: []uint32{nobody.Uid}, Ops: acl.Read, Paths: set(t, "bin/runnable"), Where: "no read"},
	)
	exe, _ := os.ReadFile(filepath.Join(lower, "bin/true"))
	for _, n := range []string{"bin/hidden", "bin/runnable"} {
		os.WriteFile(filepath.Join(lower, n), exe, 0o755)
		os.Chmod(filepath.Join(lower, n), 0o755)
	}
	for _, c := range []struct {
		who    mounttest.User
		script string
		ok     bool
		out    string
	}{
		{nobody, "./bin/hidden", false, "Permission denied"},
		{nobody, "cat bin/hidden", false, "Permission denied"},
		{nobody, "./bin/runnable", true, ""},
		{nobody, "cat bin/runnable", false, "Permission denied"},
		{nobody, "./bin/true", true, ""},
		{mounttest.User{}, "./bin/hidden", true, ""},
	} {
		out, err := c.who.Sh(t, m.Dir, c.script)
		if (err == nil) != c.ok || !strings.Contains(out, c.out) {
			t.Errorf("uid %d: %s: %v, %q; want ok=%v and %q", c.who.Uid, c.script, err, out, c.ok, c.out)
		}
	}
}
