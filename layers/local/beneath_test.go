package local

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// openWalk is openBeneath off Linux: on Linux it is plain openat a name at
// a time, so its guarantee is tested here. A tree with symbolic links out
// of it (absolute, relative, through "..") and to inside it: none is
// followed, ".." and absolute paths are refused, and ordinary paths open
// the right files.
func TestOpenWalkStaysBeneath(t *testing.T) {
	top := t.TempDir()
	root := filepath.Join(top, "root")
	for _, d := range []string{root + "/a/b", top + "/outside"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, s := range map[string]string{root + "/a/b/f": "inside", top + "/outside/secret": "secret", top + "/secret": "secret"} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		root + "/abs":      top + "/outside",
		root + "/rel":      "../outside",
		root + "/a/up":     "../..",
		root + "/a/inside": "b",
		root + "/a/file":   "b/f",
	} {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	dirfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)

	read := func(path string) (string, error) {
		fd, err := openWalk(dirfd, path, unix.O_RDONLY, 0, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(fd)
		b := make([]byte, 64)
		n, err := unix.Read(fd, b)
		return string(b[:max(n, 0)]), err
	}
	for _, p := range []string{"a/b/f", "./a/b/f", "a//b/f"} {
		if s, err := read(p); err != nil || s != "inside" {
			t.Errorf("%s: %q, %v; want \"inside\"", p, s, err)
		}
	}
	for p, want := range map[string]error{
		"abs/secret":     unix.ELOOP,
		"rel/secret":     unix.ELOOP,
		"a/up/secret":    unix.ELOOP,
		"a/up/../secret": unix.ELOOP,
		"a/inside/f":     unix.ELOOP, // even inside: no symlink is followed
		"a/file":         unix.ELOOP,
		"../secret":      unix.EXDEV,
		"a/../../secret": unix.EXDEV,
		"a/b/../../../x": unix.EXDEV,
		"/etc/passwd":    unix.EXDEV,
		top + "/secret":  unix.EXDEV,
		"a/b/f/x":        unix.ENOTDIR,
		"a/missing/f":    unix.ENOENT,
		"a/b/missing":    unix.ENOENT,
	} {
		s, err := read(p)
		if err != want && !(want == unix.ELOOP && err == unix.ENOTDIR) {
			t.Errorf("%s: %q, %v; want %v", p, s, err, want)
		}
	}
	// Creating through it: the new file is where the path says.
	fd, err := openWalk(dirfd, "a/b/new", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if _, err := os.Stat(root + "/a/b/new"); err != nil {
		t.Error(err)
	}
	// A dangling symlink as the final name is not created through.
	if err := os.Symlink(top+"/made", root+"/a/dangling"); err != nil {
		t.Fatal(err)
	}
	if fd, err := openWalk(dirfd, "a/dangling", unix.O_WRONLY|unix.O_CREAT, 0o600, 0); err == nil {
		unix.Close(fd)
		t.Error("created through a dangling symlink")
	}
	if _, err := os.Lstat(top + "/made"); err == nil {
		t.Error("a file was made outside the root")
	}
}
