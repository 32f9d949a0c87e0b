package acl_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/spec"
)

// TestCheckRefusesWhatMountWould: a rule naming a program, a user or a
// group that cannot be found, or an unknown class, is refused by the spec
// check (cairn check), at the value, not only later when the layer is
// built.
func TestCheckRefusesWhatMountWould(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	os.WriteFile(script, []byte("#!/bin/sh\necho hi\n"), 0o755)
	text := `mount = "guard"
[layer.data]
type = "local"
path = "` + dir + `"
[layer.guard]
type = "acl"
over = "data"
[[rule]]
layer = "guard"
match = "**"
action = "deny"
procs = ["cat", "no-such-program-cairn", "` + script + `"]
users = ["no-such-user-cairn"]
groups = ["no-such-group-cairn"]
ops = ["reed"]
`
	_, err := spec.Parse("acl.toml", []byte(text))
	if err == nil {
		t.Fatal("the spec check accepted rules that cannot be loaded")
	}
	got := spec.Detail(err)
	for _, want := range []string{
		`acl.toml:12:9: rule for layer "guard": option "procs": program "no-such-program-cairn" is not in PATH`,
		`program "` + script + `": ` + script + ` is a script, and a process running it is its interpreter`,
		`acl.toml:13:9: rule for layer "guard": option "users": "no-such-user-cairn" is neither a number nor a known name`,
		`acl.toml:14:10: rule for layer "guard": option "groups": "no-such-group-cairn" is neither a number nor a known name`,
		`acl.toml:15:7: rule for layer "guard": option "ops": unknown operation class "reed"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	good := strings.NewReplacer(`, "no-such-program-cairn", "`+script+`"`, "", "no-such-user-cairn", "nobody", "no-such-group-cairn", "0", "reed", "read").Replace(text)
	if _, err := spec.Parse("acl.toml", []byte(good)); err != nil {
		t.Errorf("good spec: %v", err)
	}
}
