package layer_test

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/snoop"
)

// The stack's own operations (layer.AsSelf) pass an acl that refuses
// everyone and leave no record in a snoop log, while a user's are refused
// and logged; below them the caller is the daemon.
func TestSelfOperations(t *testing.T) {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	logf := t.TempDir() + "/snoop.jsonl"
	sn, err := snoop.New(acl.New(l, &acl.Rules{Default: false}, false, false), snoop.Options{Log: logf})
	if err != nil {
		t.Fatal(err)
	}
	top := layer.FS(sn)
	user := layer.WithCaller(context.Background(), &layer.Caller{Uid: 1001, Gid: 1001, Pid: 1})
	if _, err := top.Mkdir(user, "d", 0o755); err != syscall.EACCES {
		t.Fatalf("a user's mkdir under acl default deny: %v, want EACCES", err)
	}
	self := layer.AsSelf(user)
	if !layer.IsSelf(self) || layer.IsSelf(user) {
		t.Fatal("IsSelf does not tell the stack's own operations from a user's")
	}
	if c := layer.CallerOf(self); c != layer.Self() {
		t.Fatalf("the caller of the stack's own operation is %+v, want the daemon", c)
	}
	if _, err := top.Mkdir(self, "own", 0o700); err != nil {
		t.Fatalf("the stack's own mkdir under acl default deny: %v", err)
	}
	f, _, err := top.Create(self, "own/journal", syscall.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("the stack's own create: %v", err)
	}
	if _, err := f.WriteAt(self, []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	f.Release(self)
	if err := sn.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := osReadFile(logf)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(b, `"op":"mkdir"`) {
		t.Errorf("the user's refused mkdir is not in the snoop log:\n%s", b)
	}
	if contains(b, "own") {
		t.Errorf("the stack's own operations are in the snoop log:\n%s", b)
	}
}

func osReadFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
