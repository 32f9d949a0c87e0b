//go:build linux

package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// TestCreateModes: objects get the mode asked for under the caller's umask
// (none in-process), whatever the process's umask; a default ACL of the
// directory replaces the umask, as for any local process.
func TestCreateModes(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	dir := t.TempDir()
	fs, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	mode := func(name string) uint32 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, name), &st); err != nil {
			t.Fatal(err)
		}
		return st.Mode & 07777
	}
	ctx := context.Background()
	as := func(umask uint32) context.Context {
		return layer.WithCaller(ctx, &layer.Caller{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), Pid: uint32(os.Getpid()), Umask: umask})
	}
	f, _, err := fs.Create(ctx, "in-process", unix.O_WRONLY, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	f.Release(ctx)
	if got := mode("in-process"); got != 0o666 {
		t.Errorf("in-process create: mode %04o, want 0666 (the process umask must not apply)", got)
	}
	for _, c := range []struct {
		umask, want uint32
	}{{0, 0o777}, {0o022, 0o755}, {0o027, 0o750}} {
		name := fmt.Sprintf("d%03o", c.umask)
		if _, err := fs.Mkdir(as(c.umask), name, 0o777); err != nil {
			t.Fatal(err)
		}
		if got := mode(name); got != c.want {
			t.Errorf("mkdir with umask %03o: mode %04o, want %04o", c.umask, got, c.want)
		}
		if _, err := fs.Mknod(as(c.umask), name+"/p", unix.S_IFIFO|0o777, 0); err != nil {
			t.Fatal(err)
		}
		if got := mode(name + "/p"); got != c.want {
			t.Errorf("mknod with umask %03o: mode %04o, want %04o", c.umask, got, c.want)
		}
	}
	// A default ACL replaces the umask.
	if _, err := exec.LookPath("setfacl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("setfacl is missing (./setup.sh installs acl)")
		}
		t.Skip("no setfacl here")
	}
	if _, err := fs.Mkdir(ctx, "acl", 0o777); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("setfacl", "-d", "-m", "u::rwx,g::rwx,o::rwx", filepath.Join(dir, "acl")).CombinedOutput(); err != nil {
		t.Fatalf("setfacl: %v %s", err, out)
	}
	f, _, err = fs.Create(as(0o022), "acl/f", unix.O_WRONLY, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	f.Release(ctx)
	if got := mode("acl/f"); got != 0o666 {
		t.Errorf("create under a default ACL with umask 022: mode %04o, want 0666", got)
	}
}

// TestCreatorsConcurrent: many creates at once, with different umasks, each
// get their own (the creator threads are shared).
func TestCreatorsConcurrent(t *testing.T) {
	dir := t.TempDir()
	fs, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			umask := uint32(0o022)
			if i%2 == 1 {
				umask = 0o077
			}
			ctx := layer.WithCaller(context.Background(), &layer.Caller{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), Pid: uint32(os.Getpid()), Umask: umask})
			name := fmt.Sprint("f", i)
			if _, err := fs.Mkdir(ctx, name, 0o777); err != nil {
				t.Error(err)
				return
			}
			var st unix.Stat_t
			unix.Stat(filepath.Join(dir, name), &st)
			if st.Mode&0o777 != 0o777&^umask {
				t.Errorf("%s: mode %04o with umask %03o", name, st.Mode&0o777, umask)
			}
		})
	}
	wg.Wait()
}
