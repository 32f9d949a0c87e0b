package cairn_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"cairnfs.dev/cairn"
	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/local"
)

// stackCase is a stack of one layer type over temporary directories.
type stackCase struct {
	name string
	// spec gives the inline spec over dirs, made beforehand.
	spec    func(t *testing.T, dirs []string) string
	dirs    int
	secrets map[string][]byte
	init    func(t *testing.T, dirs []string)
}

var pass = []byte("library test passphrase")

func cases() []stackCase {
	inline := func(chain string) func(*testing.T, []string) string {
		return func(_ *testing.T, d []string) string { return chain + ":" + strings.Join(d, ":") }
	}
	cs := []stackCase{
		{name: "local", spec: func(_ *testing.T, d []string) string { return d[0] }},
		{name: "null", spec: inline("null")},
		{name: "snoop", spec: func(t *testing.T, d []string) string {
			return "snoop(log=" + filepath.Join(t.TempDir(), "log.jsonl") + "),null:" + d[0]
		}},
		{name: "acl", spec: inline("acl")},
		{name: "crypt", spec: inline("crypt"), secrets: map[string][]byte{"crypt": pass}, init: func(t *testing.T, d []string) {
			l, err := local.New(d[0])
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if _, err := crypt.Init(context.Background(), l, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "mux", spec: inline("mux(names=a+b)"), dirs: 2},
		{name: "union", spec: inline("union"), dirs: 2},
		{name: "replica", spec: inline("replica"), dirs: 2},
		{name: "shard", spec: inline("shard")},
		{name: "chains", spec: inline("chains")},
	}
	for _, c := range []string{"zstd", "gzip", "lz4", "copy", "uuencode"} {
		cs = append(cs, stackCase{name: c, spec: inline(c)})
	}
	return cs
}

func open(t *testing.T, c stackCase) (*cairn.Stack, []string) {
	t.Helper()
	var dirs []string
	for range max(c.dirs, 1) {
		dirs = append(dirs, t.TempDir())
	}
	if c.init != nil {
		c.init(t, dirs)
	}
	s, err := cairn.Open(c.spec(t, dirs), cairn.Options{Secrets: c.secrets})
	if err != nil {
		t.Fatalf("open %s: %v", c.spec(t, dirs), err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dirs
}

// TestFSTest: every layer type, opened in-process from an inline spec and
// filled through the os-like API, passes the standard library's
// testing/fstest.TestFS (which opens, reads, seeks, lists, stats and
// walks every file and directory, and checks them against one another).
func TestFSTest(t *testing.T) {
	for _, c := range cases() {
		t.Run(c.name, func(t *testing.T) {
			s, _ := open(t, c)
			root := ""
			if c.name == "mux" {
				root = "a/"
			}
			files := map[string]string{
				"hello.txt":       "hello, world\n",
				"dir/a.bin":       strings.Repeat("abc", 40000),
				"dir/sub/empty":   "",
				"dir/sub/x.txt":   "x",
				"another dir/ü.t": "unicode",
			}
			var want []string
			for name, body := range files {
				p := root + name
				if err := s.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := s.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
				want = append(want, name)
			}
			if c.name != "mux" {
				if err := s.Symlink("hello.txt", "link"); err != nil {
					t.Fatal(err)
				}
				want = append(want, "link")
			}
			fsys := s.FS()
			if root != "" {
				var err error
				if fsys, err = fs.Sub(fsys, strings.TrimSuffix(root, "/")); err != nil {
					t.Fatal(err)
				}
			}
			if err := fstest.TestFS(fsys, want...); err != nil {
				t.Fatal(err)
			}
			for name, body := range files {
				b, err := fs.ReadFile(fsys, name)
				if err != nil || string(b) != body {
					t.Errorf("%s: %d bytes, %v", name, len(b), err)
				}
			}
		})
	}
}

// TestOSLike: the writable API behaves as package os does on ext4, errors
// included, over a zstd stack (a layer that changes data) and a plain one.
func TestOSLike(t *testing.T) {
	for _, c := range []stackCase{cases()[0], {name: "zstd", spec: func(_ *testing.T, d []string) string { return "zstd:" + d[0] }}} {
		t.Run(c.name, func(t *testing.T) {
			s, dirs := open(t, c)
			if _, err := s.Stat("missing"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("stat of a missing name: %v", err)
			}
			var pe *fs.PathError
			if _, err := s.OpenFile("missing/x", os.O_RDONLY, 0); !errors.As(err, &pe) || pe.Path != "missing/x" {
				t.Errorf("open of a missing name: %#v", err)
			}
			f, err := s.OpenFile("f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.OpenFile("f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640); !errors.Is(err, fs.ErrExist) {
				t.Errorf("O_EXCL of an existing file: %v", err)
			}
			if _, err := f.WriteString("0123456789"); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Seek(2, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 3)
			if n, err := f.Read(b); n != 3 || string(b) != "234" || err != nil {
				t.Errorf("read after seek: %q, %v", b[:n], err)
			}
			if _, err := f.WriteAt([]byte("AB"), 8); err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(12); err != nil {
				t.Fatal(err)
			}
			if fi, err := f.Stat(); err != nil || fi.Size() != 12 || fi.Mode().Perm() != 0o640&^umask() {
				t.Errorf("stat of the open file: %v, %v", fi, err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); !errors.Is(err, fs.ErrClosed) {
				t.Errorf("second close: %v", err)
			}
			if got, _ := s.ReadFile("f"); string(got) != "01234567AB\x00\x00" {
				t.Errorf("contents %q", got)
			}
			a, err := s.OpenFile("f", os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			a.WriteString("!")
			a.Close()
			if fi, _ := s.Stat("f"); fi.Size() != 13 {
				t.Errorf("after an append: %d bytes", fi.Size())
			}
			if err := s.MkdirAll("d/e/f", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := s.Rename("f", "d/e/g"); err != nil {
				t.Fatal(err)
			}
			var le *os.LinkError
			if err := s.Rename("nothing", "x"); !errors.As(err, &le) || !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("rename of a missing name: %v", err)
			}
			if err := s.Chmod("d/e/g", 0o600); err != nil {
				t.Fatal(err)
			}
			mt := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
			if err := s.Chtimes("d/e/g", mt, mt); err != nil {
				t.Fatal(err)
			}
			if fi, err := s.Stat("d/e/g"); err != nil || fi.Mode() != 0o600 || !fi.ModTime().Equal(mt) || fi.Size() != 13 {
				t.Errorf("after chmod and chtimes: %v, %v", fi, err)
			}
			if err := s.Symlink("e/g", "d/l"); err != nil {
				t.Fatal(err)
			}
			if b, err := s.ReadFile("d/l"); err != nil || len(b) != 13 {
				t.Errorf("read through a symlink: %d bytes, %v", len(b), err)
			}
			if err := s.Symlink("/d/e", "abs"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Stat("abs/g"); err != nil {
				t.Errorf("an absolute link target is taken from the stack's root: %v", err)
			}
			if fi, err := s.Lstat("d/l"); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
				t.Errorf("lstat of a symlink: %v, %v", fi, err)
			}
			if err := s.Remove("d"); err == nil {
				t.Errorf("remove of a non-empty directory succeeded")
			}
			if err := s.RemoveAll("d"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Stat("d"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("after RemoveAll: %v", err)
			}
			// The lower holds the stack's own format (a header first).
			if c.name == "zstd" {
				plain := bytes.Repeat([]byte("z"), 100000)
				s.WriteFile("z", plain, 0o644)
				s.Close()
				if b, err := os.ReadFile(filepath.Join(dirs[0], "z")); err != nil || bytes.HasPrefix(b, plain[:64]) {
					t.Errorf("the lower file is not zstd's: %q..., %v", b[:min(len(b), 16)], err)
				}
			}
		})
	}
}

func umask() fs.FileMode {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Umask:"); ok {
			var m uint32
			fmt.Sscanf(strings.TrimSpace(v), "%o", &m)
			return fs.FileMode(m)
		}
	}
	return 0o022
}

// fsxFS is a stack as the model test's file system.
type fsxFS struct{ *cairn.Stack }

func (f fsxFS) OpenFile(name string, flag int, perm os.FileMode) (fsx.File, error) {
	return f.Stack.OpenFile(name, flag, perm)
}

// TestModelInProcess: the fsx model (the test every data-changing layer
// runs through a mount) runs over the library's API on the layers that
// change data, so the in-process path and the mount cannot drift.
func TestModelInProcess(t *testing.T) {
	for _, c := range cases() {
		switch c.name {
		case "null", "crypt", "zstd", "gzip", "copy", "union", "replica", "chains":
		default:
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			s, dirs := open(t, c)
			fsx.Run(t, fsx.Config{Dir: dirs[0], FS: fsxFS{s}, Files: 3, Ops: 3000, MaxSize: 256 << 10, MaxLen: 32 << 10})
		})
	}
}

// TestSpecErrors: Open refuses what cairn check refuses, with the same
// positions.
func TestSpecErrors(t *testing.T) {
	d := t.TempDir()
	_, err := cairn.Open("zstd(level=30):"+d, cairn.Options{})
	if err == nil || !strings.Contains(err.Error(), "inline:1:") || !strings.Contains(err.Error(), "level") {
		t.Errorf("a zstd level of 30: %v", err)
	}
	// A crypt layer without its secret asks no terminal: it fails.
	if _, err := cairn.Open("crypt:"+d, cairn.Options{}); err == nil {
		t.Errorf("a crypt layer over an empty directory opened")
	}
	// A second Open of the same codec lower is refused while the first is open.
	s, err := cairn.Open("zstd:"+d, cairn.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cairn.Open("zstd:"+d, cairn.Options{}); err == nil {
		t.Errorf("a second open of a claimed lower succeeded")
	}
	s.Close()
}

// TestScratchModule: a module outside the repository requires this one
// (through a replace to the checkout, as a user would before a release)
// and builds a program that opens a stack, writes and reads it back, and
// runs it.
func TestScratchModule(t *testing.T) {
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		t.Fatalf("no go toolchain at %s", gobin)
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	path := strings.TrimPrefix(strings.SplitN(string(mod), "\n", 2)[0], "module ")
	if !strings.Contains(strings.SplitN(path, "/", 2)[0], ".") {
		t.Errorf("module path %q: its first element has no dot, so another module cannot require it", path)
	}
	d := t.TempDir()
	gomod := "module example.com/scratch\n\ngo 1.26\n\nrequire " + path + " v0.0.0\n\nreplace " + path + " => " + root + "\n"
	prog := `package main

import (
	"fmt"
	"log"
	"os"

	"` + path + `"
)

func main() {
	s, err := cairn.Open("zstd:"+os.Args[1], cairn.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	if err := s.WriteFile("hello.txt", []byte("from a scratch module"), 0o644); err != nil {
		log.Fatal(err)
	}
	b, err := s.ReadFile("hello.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(b))
}
`
	for name, body := range map[string]string{"go.mod": gomod, "main.go": prog} {
		if err := os.WriteFile(filepath.Join(d, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(d, "go.sum"), sum, 0o644)
	build := exec.Command(gobin, "build", "-mod=mod", "-o", "scratch", ".")
	build.Dir = d
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the scratch module: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(d, "scratch"), t.TempDir()).CombinedOutput()
	if err != nil || string(out) != "from a scratch module" {
		t.Errorf("the scratch program: %q, %v", out, err)
	}
}
