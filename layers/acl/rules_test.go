package acl

import (
	"cairnfs.dev/cairn/internal/mounttest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/pathmatch"
	"cairnfs.dev/cairn/registry"
)

func set(t testing.TB, pats ...string) *pathmatch.Set {
	s, err := pathmatch.NewSet(pats, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDecide(t *testing.T) {
	rs := &Rules{Default: true, List: []Rule{
		{Allow: true, Uids: []uint32{0}, Where: "root"},
		{Allow: false, Uids: []uint32{1002}, Ops: Read, Paths: set(t, "secret/"), Where: "bob-secret"},
		{Allow: false, Gids: []uint32{50}, Ops: Write | Delete, Where: "group50-ro"},
		{Allow: false, Procs: []string{"cat"}, Paths: set(t, "*.key"), Where: "no-cat"},
		{Allow: true, Paths: set(t, "pub/"), Where: "pub"},
		{Allow: false, Ops: Exec, Where: "no-exec"},
	}}
	self := layer.Self()
	cases := []struct {
		c     *layer.Caller
		k     Class
		path  string
		allow bool
		rule  string
	}{
		{&layer.Caller{Uid: 0}, Exec, "secret/x", true, "root"},
		{&layer.Caller{Uid: 1002}, Read, "secret/x", false, "bob-secret"},
		{&layer.Caller{Uid: 1002}, Read, "secret", false, "bob-secret"},
		{&layer.Caller{Uid: 1002}, Write, "secret/x", true, "default"},
		{&layer.Caller{Uid: 1001}, Read, "secret/x", true, "default"},
		{&layer.Caller{Uid: 1001, Gid: 50}, Delete, "a/b", false, "group50-ro"},
		{&layer.Caller{Uid: 1001, Gid: 50}, Read, "a/b", true, "default"},
		{&layer.Caller{Uid: 1001}, Exec, "pub/x", true, "pub"},
		{&layer.Caller{Uid: 1001}, Exec, "bin/x", false, "no-exec"},
		{&layer.Caller{Uid: self.Uid + 1, Pid: self.Pid}, Read, "a/b.key", true, "default"}, // this process is not cat
	}
	for _, c := range cases {
		allow, rule := rs.Decide(c.c, c.k, c.path)
		if allow != c.allow || rule != c.rule {
			t.Errorf("uid %d gid %d %v %q: %v by %s, want %v by %s", c.c.Uid, c.c.Gid, c.k, c.path, allow, rule, c.allow, c.rule)
		}
	}
}

// TestDecideGroupsAndProcs uses a real process (groups and name come from
// /proc).
func TestDecideGroupsAndProcs(t *testing.T) {
	mounttest.NeedRoot(t) // fails on CI instead of skipping
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1005, Gid: 1005, Groups: []uint32{60, 61}}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	rs := &Rules{Default: true, List: []Rule{
		{Allow: false, Gids: []uint32{61}, Ops: Write, Where: "g61"},
		{Allow: false, Procs: []string{"sleep"}, Ops: Create, Where: "sleepers"},
	}}
	c := &layer.Caller{Uid: 1005, Gid: 1005, Pid: uint32(cmd.Process.Pid)}
	if ok, r := rs.Decide(c, Write, "x"); ok || r != "g61" {
		t.Errorf("write by a member of 61 (supplementary): %v by %s", ok, r)
	}
	if ok, r := rs.Decide(c, Create, "x"); ok || r != "sleepers" {
		t.Errorf("create by sleep: %v by %s", ok, r)
	}
	if ok, _ := rs.Decide(&layer.Caller{Uid: 1005, Gid: 1005, Pid: uint32(os.Getpid())}, Write, "x"); !ok {
		t.Error("write by a caller not in group 61 refused")
	}
}

func TestGains(t *testing.T) {
	rs := &Rules{Default: true, List: []Rule{
		{Allow: false, Uids: []uint32{1002}, Ops: Read, Paths: set(t, "secret/"), Where: "bob"},
		{Allow: false, Uids: []uint32{1002}, Ops: Write, Paths: set(t, "*.conf"), Where: "conf"},
		{Allow: false, Uids: []uint32{1009}, Paths: set(t, "/a/*/x"), Where: "other user"},
	}}
	bob, alice := &layer.Caller{Uid: 1002}, &layer.Caller{Uid: 1001}
	file := func() bool { return false }
	dir := func() bool { return true }
	for _, c := range []struct {
		c        *layer.Caller
		from, to string
		dir      func() bool
		gains    bool
	}{
		{bob, "secret/f", "pub/f", file, true},    // bob would read it
		{bob, "pub/f", "secret/f", file, false},   // bob loses read: fine
		{alice, "secret/f", "pub/f", file, false}, // alice could read it anyway
		{bob, "d/.tmp1", "d/x.conf", file, false}, // an atomic save: fewer rights
		{bob, "d/x.conf", "d/x.bak", file, true},  // would get write
		{bob, "secret", "open", dir, true},        // a directory: its files
		{bob, "a/b", "a/c", dir, false},           // nothing differs below for bob
		{alice, "secret", "open", dir, false},     // alice has no rules
		{bob, "a/b", "z/b", dir, false},           // the rule that differs is another user's
		{&layer.Caller{Uid: 1009}, "a/b", "z/b", dir, true},
	} {
		if got := rs.Gains(c.c, c.from, c.to, c.dir); got != c.gains {
			t.Errorf("uid %d %s -> %s: gains %v", c.c.Uid, c.from, c.to, got)
		}
	}
}

func TestFromRegistry(t *testing.T) {
	rule := func(v registry.Values) registry.Rule {
		return registry.Rule{Where: "spec.toml:3:1", Paths: set(t, "x/"), Values: v}
	}
	rs, err := FromRegistry(registry.Rules{
		rule(registry.Values{"action": "deny", "users": []string{"root", "1002"}, "groups": []string{"root"},
			"procs": []string{"cat"}, "ops": []string{"read", "exec"}}),
		rule(registry.Values{"action": "allow"}),
	}, false)
	if err != nil {
		t.Fatal(err)
	}
	r := rs.List[0]
	if r.Allow || len(r.Uids) != 2 || r.Uids[0] != 0 || r.Uids[1] != 1002 || r.Gids[0] != 0 || r.Ops != Read|Exec ||
		r.Procs[0] != "cat" || !rs.List[1].Allow || rs.Default {
		t.Fatalf("rules: %+v", rs)
	}
	_, err = FromRegistry(registry.Rules{rule(registry.Values{"action": "deny", "users": []string{"nobody-at-all"},
		"ops": []string{"reed"}})}, true)
	if err == nil || !strings.Contains(err.Error(), `"reed"`) || !strings.Contains(err.Error(), "nobody-at-all") {
		t.Fatalf("bad rule: %v", err)
	}
}

// BenchmarkDecide20 is the cost of 20 rules that do not apply.
func BenchmarkDecide20(b *testing.B) {
	rs := &Rules{Default: true}
	for i := 0; i < 20; i++ {
		rs.List = append(rs.List, Rule{Uids: []uint32{uint32(2000 + i)}, Paths: set(b, "secret/**")})
	}
	c := &layer.Caller{Uid: 1001}
	for b.Loop() {
		rs.Decide(c, Read, "src/lib/regex.c")
	}
}

// TestReadImpliesExec: an execution allowed by the default or by a rule
// that does not name exec is refused where reading is refused.
func TestReadImpliesExec(t *testing.T) {
	rs := &Rules{Default: true, List: []Rule{
		{Allow: false, Ops: Read, Paths: set(t, "hidden", "runnable", "all"), Where: "no read"},
		{Allow: true, Ops: Exec, Paths: set(t, "runnable"), Where: "exec by name"},
		{Allow: true, Paths: set(t, "all"), Where: "every class"},
	}}
	c := &layer.Caller{Uid: 1001}
	for path, want := range map[string]bool{"hidden": false, "runnable": true, "all": false, "open": true} {
		if got, r := rs.Decide(c, Exec, path); got != want {
			t.Errorf("exec %s: %v by %s, want %v", path, got, r, want)
		}
	}
	// Default deny: exec only where a rule names it.
	rs2 := &Rules{Default: false, List: []Rule{
		{Allow: true, Ops: Exec, Paths: set(t, "runnable"), Where: "exec by name"},
		{Allow: true, Ops: Read | Exec, Paths: set(t, "both"), Where: "read and exec"},
	}}
	for path, want := range map[string]bool{"runnable": true, "both": true, "other": false} {
		if got, r := rs2.Decide(c, Exec, path); got != want {
			t.Errorf("exec %s (default deny): %v by %s, want %v", path, got, r, want)
		}
	}
}
