package mounttest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// LockFileHidden checks the lock file of a claim (layer.LockLowerOwn) of
// a stack mounted at dir: lower is the file's path in the lower directory,
// name the path, under dir, at which a user of the mount would reach it.
// Below, it is a regular file that the claim locks (another flock of it
// fails). Through the mount, `ls -a` does not list name's first part,
// stat and open say ENOENT, and the name is not made or replaced (create,
// mkdir, symlink, link and rename onto it fail, and the file below stays
// the same inode).
func LockFileHidden(t testing.TB, dir, name, lower string) {
	t.Helper()
	before, err := os.Stat(lower)
	if err != nil || !before.Mode().IsRegular() {
		t.Fatalf("the lock file %s: %v, %v", lower, before, err)
	}
	if fd, err := unix.Open(lower, unix.O_RDONLY, 0); err != nil {
		t.Fatal(err)
	} else {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		unix.Close(fd)
		if err != unix.EWOULDBLOCK {
			t.Fatalf("another flock of the lock file %s: %v, want EWOULDBLOCK (the claim's lock)", lower, err)
		}
	}
	out, err := exec.Command("ls", "-a", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("ls -a: %v: %s", err, out)
	}
	first, _, _ := strings.Cut(name, "/")
	for _, l := range strings.Split(string(out), "\n") {
		if l == first {
			t.Fatalf("ls -a lists %s:\n%s", first, out)
		}
	}
	p := filepath.Join(dir, name)
	if _, err := os.Lstat(p); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("stat %s: %v, want ENOENT", name, err)
	}
	if f, err := os.Open(p); !errors.Is(err, syscall.ENOENT) {
		if err == nil {
			f.Close()
		}
		t.Fatalf("open %s: %v, want ENOENT", name, err)
	}
	other := filepath.Join(dir, "lock-file-probe")
	if err := os.WriteFile(other, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	made := map[string]func() error{
		"create": func() error {
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
			if err == nil {
				f.Close()
			}
			return err
		},
		"create, O_EXCL": func() error {
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
			if err == nil {
				f.Close()
			}
			return err
		},
		"mkdir":   func() error { return os.Mkdir(p, 0o755) },
		"symlink": func() error { return os.Symlink("x", p) },
		"link":    func() error { return os.Link(other, p) },
		"rename":  func() error { return os.Rename(other, p) },
	}
	for op, do := range made {
		if err := do(); err == nil {
			t.Fatalf("%s of %s through the mount worked", op, name)
		}
	}
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(lower)
	if err != nil || !os.SameFile(before, after) || after.Size() != 0 {
		t.Fatalf("the lock file %s changed: %v, %v", lower, after, err)
	}
}
