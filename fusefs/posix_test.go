package fusefs_test

// POSIX semantics through a real mount, compared with ext4 (a plain
// directory of the test's temporary file system): modes, umask, set-id
// bits, "." and "..", ACLs, directory handles. Each test runs on a
// passthrough stack (null) and on data-changing ones (zstd, crypt), as root
// with allow_other and as a second user.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"cairn/internal/mounttest"
	"cairn/layer"
	"cairn/layers/codec"
	"cairn/layers/crypt"
	"cairn/layers/local"
	"cairn/layers/null"
)

var nobody = mounttest.User{Uid: 65534, Gid: 65534}

// posixStack is a mounted stack and its lower directory.
type posixStack struct {
	name  string
	m     *mounttest.Mounted
	lower string
}

// stackNames are the stacks every POSIX test runs on: null passes files
// through to the kernel, zstd and crypt serve every read and write.
var stackNames = []string{"null", "zstd", "crypt"}

func mountStack(t *testing.T, name string) posixStack {
	t.Helper()
	lower := t.TempDir()
	os.Chmod(lower, 0o755)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	var top layer.FS
	switch name {
	case "null":
		top = null.New(l)
	case "zstd":
		top, err = codec.New(l, "zstd", codec.Options{Level: 1})
	case "crypt":
		pass := []byte("posix test")
		if _, err = crypt.Init(context.Background(), l, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: 1 << 10, R: 8, P: 1}}, pass); err == nil {
			top, err = crypt.Unlock(context.Background(), l, pass, false, crypt.Options{})
		}
	default:
		t.Fatalf("no stack %q", name)
	}
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(top) })
	m := mounttest.Mount(t, top)
	if name == "null" && !m.Server.Passthrough || name != "null" && m.Server.Passthrough {
		t.Fatalf("%s stack: passthrough %v", name, m.Server.Passthrough)
	}
	return posixStack{name: name, m: m, lower: lower}
}

// eachStack runs fn on every stack of stackNames.
func eachStack(t *testing.T, fn func(t *testing.T, s posixStack)) {
	for _, name := range stackNames {
		t.Run(name, func(t *testing.T) { fn(t, mountStack(t, name)) })
	}
}

// ext4Dir is a plain directory on the test's file system, the oracle.
func ext4Dir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	os.Chmod(d, 0o755)
	os.Chmod(filepath.Dir(d), 0o755)
	var sf unix.Statfs_t
	if err := unix.Statfs(d, &sf); err != nil {
		t.Fatal(err)
	}
	if sf.Type != unix.EXT4_SUPER_MAGIC {
		t.Logf("the oracle directory %s is not on ext4 (type %#x)", d, sf.Type)
	}
	return d
}

func lstatMode(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode
}

// python runs a Python script as u with the arguments; its output is returned.
func python(t *testing.T, u mounttest.User, script string, args ...string) (string, error) {
	t.Helper()
	cmd := u.Command("/usr/bin/python3", append([]string{"-c", script}, args...)...)
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var root = mounttest.User{Uid: 0, Gid: 0}

// TestModeZero: mode 0000 is reported as 0000 (not 0644/0755), and another
// user cannot read or list it through the mount.
func TestModeZero(t *testing.T) {
	mounttest.NeedRoot(t)
	eachStack(t, func(t *testing.T, s posixStack) {
		mustWrite(t, s.m.Path("f"), "secret")
		if err := os.Mkdir(s.m.Path("d"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"f", "d"} {
			if err := os.Chmod(s.m.Path(n), 0); err != nil {
				t.Fatal(err)
			}
			if got := lstatMode(t, s.m.Path(n)) & 07777; got != 0 {
				t.Errorf("%s: mode %04o after chmod 0, want 0000", n, got)
			}
		}
		out, err := nobody.Sh(t, s.m.Dir, "cat f")
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("uid 65534 reading a mode-0000 file: %v %q, want Permission denied", err, out)
		}
		out, err = nobody.Sh(t, s.m.Dir, "ls d")
		if err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("uid 65534 listing a mode-0000 directory: %v %q, want Permission denied", err, out)
		}
		// Root still reads it (CAP_DAC_OVERRIDE), as on ext4.
		if got := mustRead(t, s.m.Path("f")); got != "secret" {
			t.Errorf("root read %q", got)
		}
	})
}
