//go:build linux

package fusefs_test

// O_TMPFILE and inode flags (chattr, lsattr) through a real mount, compared
// with ext4: the same scripts, run on a plain directory and on the mount,
// must print the same.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// tmpfileScript makes an O_TMPFILE file in argv[1], writes, reads and
// fchmods it, links it into the directory through /proc/self/fd, makes a
// second one that is closed unlinked and a third with O_EXCL, which cannot
// be linked. It prints what it sees; the last line is the inode numbers of
// the first two.
const tmpfileScript = `
import os, sys, errno, ctypes
libc = ctypes.CDLL(None, use_errno=True)
def flink(fd, dst):
    # linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, dst, AT_SYMLINK_FOLLOW)
    if libc.linkat(-100, b"/proc/self/fd/%d" % fd, -100, dst.encode(), 0x400) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
d = sys.argv[1]
os.umask(0o022)
try:
    fd = os.open(d, os.O_TMPFILE | os.O_RDWR, 0o666)
except OSError as e:
    print("tmpfile", errno.errorcode[e.errno]); sys.exit(0)
os.write(fd, b"hello tmpfile")
print("read", os.pread(fd, 100, 0))
st = os.fstat(fd)
print("nlink", st.st_nlink, "mode %o" % st.st_mode, "uid", st.st_uid, "size", st.st_size)
print("entries", sorted(os.listdir(d)))
os.fchmod(fd, 0o640)
flink(fd, os.path.join(d, "linked"))
st2 = os.stat(os.path.join(d, "linked"))
print("linked nlink", os.fstat(fd).st_nlink, st2.st_nlink, "same ino", st2.st_ino == st.st_ino, "mode %o" % st2.st_mode, "uid", st2.st_uid)
print("entries", sorted(os.listdir(d)))
os.write(fd, b"!")
print("content", open(os.path.join(d, "linked"), "rb").read())
try:
    flink(fd, os.path.join(d, "linked"))
except OSError as e:
    print("link again", errno.errorcode[e.errno])
os.close(fd)
fd2 = os.open(d, os.O_TMPFILE | os.O_WRONLY, 0o600)
st3 = os.fstat(fd2)
print("second: distinct ino", st3.st_ino != st.st_ino, "nlink", st3.st_nlink)
os.close(fd2)
fd3 = os.open(d, os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
try:
    flink(fd3, os.path.join(d, "excl"))
    print("excl linked")
except OSError as e:
    print("excl link", errno.errorcode[e.errno])
os.close(fd3)
print("entries", sorted(os.listdir(d)))
print(st.st_ino, st3.st_ino)
`

// runTmpfile runs tmpfileScript as u in dir; it returns the output without
// the inode numbers, and those.
func runTmpfile(t *testing.T, u mounttest.User, dir string) (string, []uint64) {
	t.Helper()
	out, err := python(t, u, tmpfileScript, dir)
	if err != nil {
		t.Fatalf("tmpfile script in %s: %v\n%s", dir, err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var inos []uint64
	if f := strings.Fields(lines[len(lines)-1]); len(f) == 2 && f[0] != "tmpfile" {
		for _, s := range f {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("tmpfile script: last line %q", lines[len(lines)-1])
			}
			inos = append(inos, n)
		}
		lines = lines[:len(lines)-1]
	}
	return strings.Join(lines, "\n"), inos
}

// TestTmpfile: open(O_TMPFILE), I/O, fstat (no link), fchmod, linkat of
// /proc/self/fd into the directory, a tmpfile closed without a link, and
// O_EXCL, as root and as another user (ownership, umask), give what they
// give on ext4; the file's st_ino is its lower inode number before and
// after the link, and an unlinked one is gone from the lower once closed.
// Stacks that change data have no O_TMPFILE: EOPNOTSUPP.
func TestTmpfile(t *testing.T) {
	mounttest.NeedRoot(t)
	ext := ext4Dir(t)
	os.Chmod(ext, 0o777)
	for _, u := range []mounttest.User{root, nobody} {
		sub := fmt.Sprint("u", u.Uid)
		os.Mkdir(filepath.Join(ext, sub), 0o777)
		os.Chmod(filepath.Join(ext, sub), 0o777)
		want, _ := runTmpfile(t, u, filepath.Join(ext, sub))
		if !strings.Contains(want, "linked nlink 1 1 same ino True") {
			t.Fatalf("ext4 (as uid %d):\n%s", u.Uid, want)
		}
		eachStack(t, func(t *testing.T, s posixStack) {
			if err := os.Mkdir(s.m.Path(sub), 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(s.m.Path(sub), 0o777)
			got, inos := runTmpfile(t, u, s.m.Path(sub))
			if s.name == "zstd" || s.name == "crypt" {
				if got != "tmpfile ENOTSUP" { // EOPNOTSUPP
					t.Errorf("uid %d: %q, want EOPNOTSUPP", u.Uid, got)
				}
				return
			}
			if got != want {
				t.Errorf("uid %d: on the mount:\n%s\nwant (ext4):\n%s", u.Uid, got, want)
			}
			// The lower holds the linked file under its name, with the
			// st_ino the mount showed, and nothing else.
			var st = lstat(t, filepath.Join(s.lower, sub, "linked"))
			if st.Ino != inos[0] {
				t.Errorf("st_ino %d on the mount, %d in the lower", inos[0], st.Ino)
			}
			if ents, _ := os.ReadDir(filepath.Join(s.lower, sub)); len(ents) != 1 {
				t.Errorf("lower holds %d entries, want 1 (linked)", len(ents))
			}
			// The one closed without a link is gone: the daemon (this
			// process) lets go of it once the kernel releases it, which
			// comes after close(2) returns.
			gone := fmt.Sprintf("/#%d (deleted)", inos[1])
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if !holds(gone) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the daemon still holds the unlinked tmpfile (inode %d)", inos[1])
				}
			}
		})
	}
}

// holds reports whether this process has a descriptor whose target ends
// with suffix.
func holds(suffix string) bool {
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasSuffix(l, suffix) {
			return true
		}
	}
	return false
}

// immutableScript: chattr +i on a file and a directory refuses every change
// to them (EPERM) and allows reading; lsattr shows it; chattr -i clears it.
// Then xfs_io's chattr, which goes through FS_IOC_FSSETXATTR, and a write
// through a descriptor opened before chattr +i.
const immutableScript = `exec 2>&1
echo data > f; mkdir d; echo x > d/g
chattr +i f d; echo "chattr +i: $?"
lsattr -d f d
echo more >> f; echo "append: $?"
echo over > f; echo "write: $?"
rm -f f; echo "rm: $?"
mv f f2; echo "mv: $?"
ln f f3; echo "ln: $?"
chmod 600 f; echo "chmod: $?"
touch f; echo "touch: $?"
cat f
touch d/new; echo "create in d: $?"
rm d/g; echo "rm in d: $?"
cat d/g
chattr -i f d; echo "chattr -i: $?"
lsattr -d f d
echo more >> f; echo "append: $?"
cat f
xfs_io -c "chattr +iAS" -c lsattr -c "chattr -iAS" -c lsattr f
echo more >> f; echo "append: $?"
echo e > e; xfs_io -c "chattr +i" -c "pwrite 0 4" -c "chattr -i" e; cat e
`

// appendScript: chattr +a allows O_APPEND writes only.
const appendScript = `exec 2>&1
echo data > a
chattr +a a; echo "chattr +a: $?"
lsattr a
echo more >> a; echo "append: $?"
echo over > a; echo "write: $?"
truncate -s 0 a; echo "truncate: $?"
rm a; echo "rm: $?"
cat a
chattr -a a; echo "chattr -a: $?"
rm a; echo "rm: $?"
`

// ownerScript, as a user that owns the file: chattr +i needs
// CAP_LINUX_IMMUTABLE, nodump does not.
const ownerScript = `exec 2>&1
echo x > n
chattr +i n; echo "chattr +i: $?"
chattr +d n; echo "chattr +d: $?"
lsattr n
chattr -d n; echo "chattr -d: $?"
`

// TestInodeFlags: chattr and lsattr on the mount do what they do on ext4;
// the lower enforces immutable and append-only for every access through
// the stack. Stacks that change data refuse append-only (EOPNOTSUPP): they
// rewrite the end of a file in place; codecs refuse immutable too (they
// store written bytes later, when the lower would refuse them). A write
// through a descriptor opened before chattr +i gets EPERM, as on ext4.
func TestInodeFlags(t *testing.T) {
	mounttest.NeedRoot(t)
	ext := ext4Dir(t)
	os.Chmod(ext, 0o777)
	run := func(u mounttest.User, dir, script string) string {
		out, _ := u.Sh(t, dir, script)
		return out
	}
	os.Mkdir(filepath.Join(ext, "i"), 0o755)
	os.Mkdir(filepath.Join(ext, "a"), 0o755)
	os.Mkdir(filepath.Join(ext, "o"), 0o777)
	os.Chmod(filepath.Join(ext, "o"), 0o777)
	wantI := run(root, filepath.Join(ext, "i"), immutableScript)
	wantA := run(root, filepath.Join(ext, "a"), appendScript)
	wantO := run(nobody, filepath.Join(ext, "o"), ownerScript)
	for _, w := range []string{wantI, wantA} {
		if !strings.Contains(w, "Operation not permitted") {
			t.Fatalf("ext4 refuses nothing:\n%s", w)
		}
	}
	eachStack(t, func(t *testing.T, s posixStack) {
		for _, d := range []string{"i", "a", "o"} {
			if err := os.Mkdir(s.m.Path(d), 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(s.m.Path(d), 0o777)
		}
		got := run(root, s.m.Path("i"), immutableScript)
		if s.name == "zstd" {
			if !strings.Contains(got, "chattr: Operation not supported while setting flags on f\n") {
				t.Errorf("immutable on %s:\n%s\nwant it refused (EOPNOTSUPP)", s.name, got)
			}
		} else if got != wantI {
			t.Errorf("immutable: on the mount:\n%s\nwant (ext4):\n%s", got, wantI)
		}
		if got := run(nobody, s.m.Path("o"), ownerScript); got != wantO {
			t.Errorf("owner: on the mount:\n%s\nwant (ext4):\n%s", got, wantO)
		}
		got = run(root, s.m.Path("a"), appendScript)
		if s.name == "zstd" || s.name == "crypt" {
			if !strings.Contains(got, "chattr: Operation not supported while setting flags on a\nchattr +a: 1") {
				t.Errorf("append-only on %s:\n%s\nwant it refused (EOPNOTSUPP)", s.name, got)
			}
			return
		}
		if got != wantA {
			t.Errorf("append-only: on the mount:\n%s\nwant (ext4):\n%s", got, wantA)
		}
	})
}
