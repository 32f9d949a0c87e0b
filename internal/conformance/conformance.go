//go:build linux

// Package conformance is the test suite every layer type runs: it mounts a
// stack through FUSE and runs, through the kernel with ordinary system
// calls, the same operations and edge cases on the mount and on a plain
// directory of the root file system (ext4 here, the oracle), and requires
// the same results, errno for errno; then the fsx data and namespace models
// through the mount, and the identity checks (st_ino). rclone's
// fstests.Run is the model: a layer gets the suite by adding one Stack to
// the table in conformance_test.go.
package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// Stack is one entry of the table: how to build a stack and what it
// declares it cannot do.
type Stack struct {
	Name string
	// Setup, if set, prepares the lower directory before Build (mounts a
	// file system inside it).
	Setup func(t testing.TB, lower string)
	// Build builds the stack over the lower directory (a fresh directory
	// of the root file system).
	Build func(t testing.TB, lower string) layer.FS
	// Dirs are the directories of the mount the cases run in (default
	// the root: [""]); the identity checks span all of them, and the fsx
	// models run in the first.
	Dirs []string
	// Plain says the lower directory holds the mount's files under the
	// same names with the same bytes (null, snoop, acl): the identity
	// checks then also change the lower behind the mount's back.
	Plain bool
	// Limits are the deviations from ext4 the stack declares, by name (see
	// the Limit constants), each with its reason: a real FUSE or format
	// limit, not a bug.
	Limits map[Limit]string
}

// Limit names a check a stack may declare it cannot pass.
type Limit string

const (
	// Holes: SEEK_DATA/SEEK_HOLE and st_blocks do not show the lower's
	// holes (the whole file is data, as POSIX allows); the suite then
	// checks only the fallback (data at every offset before the end, the
	// one hole at the end).
	Holes Limit = "holes"
	// XattrOverhead: the layer stores an xattr value in a longer form, so
	// a value close to the lower's limit (ext4: the names and values of a
	// file fit in one block) does not fit; the suite writes 3500 bytes
	// instead of 4000.
	XattrOverhead Limit = "xattr-overhead"
	// Tmpfile: open(O_TMPFILE) is refused (EOPNOTSUPP); the suite skips
	// the nameless file and its linkat. Run declares it for a stack
	// without layer.FSTmpfile (crypt, the codecs).
	Tmpfile Limit = "tmpfile"
	// LowerTmpfs: (part of) the lower is a tmpfs, which differs from ext4
	// where a stack passes its answers on: no FALLOC_FL_ZERO_RANGE
	// (EOPNOTSUPP), a larger largest file (no EFBIG at 1 PiB or 16 TiB); the suite
	// skips those.
	LowerTmpfs Limit = "lower-tmpfs"
	// NoWhiteout: renameat2(RENAME_WHITEOUT) is refused (EINVAL): the
	// stack's own whiteouts would be confused with it (a union, as the
	// kernel's overlayfs); the suite skips it.
	NoWhiteout Limit = "no-whiteout"
)

// Run runs the suite on s.
func Run(t *testing.T, s Stack) {
	mounttest.NeedRoot(t)
	mounttest.Need(t)
	limits := map[Limit]string{}
	for l, why := range s.Limits {
		limits[l] = why
	}
	s.Limits = limits
	lower := t.TempDir()
	open(t, lower)
	if s.Setup != nil {
		s.Setup(t, lower)
	}
	top := s.Build(t, lower)
	t.Cleanup(func() { layer.CloseStack(top) })
	if layer.FSCapsOf(top)&layer.FSTmpfile == 0 {
		limits[Tmpfile] = "a layer of the stack has no O_TMPFILE (layer.FSTmpfile): one that changes data makes a file with its name"
	}
	m := mounttest.Mount(t, top)
	dirs := s.Dirs
	if len(dirs) == 0 {
		dirs = []string{""}
	}
	for _, d := range dirs {
		d := d
		t.Run("cases/"+strings.ReplaceAll(d, "/", "_"), func(t *testing.T) {
			steps := 0
			for _, c := range cases {
				mdir := filepath.Join(m.Dir, d, "conf-"+c.name)
				odir := filepath.Join(t.TempDir(), c.name)
				open(t, filepath.Dir(odir))
				want := runCase(t, c, odir, s.Limits)
				got := runCase(t, c, mdir, s.Limits)
				compare(t, c.name, want, got)
				steps += len(want)
			}
			t.Logf("%d cases, %d steps compared with ext4", len(cases), steps)
		})
	}
	t.Run("identity", func(t *testing.T) { identity(t, m.Dir, dirs) })
	if s.Plain {
		t.Run("reused-inode", func(t *testing.T) { reusedInode(t, m.Dir, lower) })
	}
	work := filepath.Join(m.Dir, dirs[0])
	long := os.Getenv("CAIRN_LONG") != ""
	t.Run("fsx", func(t *testing.T) {
		d := filepath.Join(work, "fsx")
		must(t, os.Mkdir(d, 0o755))
		ops := 20000
		if raceEnabled {
			ops = 4000
		}
		if long {
			ops = 200000
		}
		fsx.Run(t, fsx.Config{Dir: d, Ops: ops, MaxSize: 256 << 10, Punch: s.Limits[Holes] == ""})
	})
	t.Run("tree", func(t *testing.T) {
		d := filepath.Join(work, "tree")
		must(t, os.Mkdir(d, 0o755))
		ops := 2000
		if raceEnabled {
			ops = 500
		}
		if long {
			ops = 20000
		}
		fsx.RunTree(t, fsx.TreeConfig{Dir: d, Ops: ops})
	})
}

// open lets every user search dir and its parent (t.TempDir makes them
// 0700): the cases act as uid 65534 too.
func open(t testing.TB, dir string) {
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A case is a script of system calls; each records its result in the
// trace, which must be the same on the mount and on the oracle.
type tcase struct {
	name string
	run  func(c *C)
}

// C is what a case acts with.
type C struct {
	t      testing.TB
	dir    string
	limits map[Limit]string
	trace  []string
}

// P is the path of name in the case's directory.
func (c *C) P(name string) string { return filepath.Join(c.dir, name) }

// Has reports whether the stack declares limit l.
func (c *C) Has(l Limit) bool { return c.limits[l] != "" }

// E records an operation's errno.
func (c *C) E(op string, err error) {
	c.trace = append(c.trace, op+": "+errName(err))
}

// V records a value.
func (c *C) V(op string, format string, args ...any) {
	c.trace = append(c.trace, op+" = "+fmt.Sprintf(format, args...))
}

// Stat records the attributes of name that must match ext4's: type,
// permissions, links, owner, size (not the inode number or times).
func (c *C) Stat(name string) {
	var st unix.Stat_t
	err := unix.Lstat(c.P(name), &st)
	if err != nil {
		c.E("lstat "+name, err)
		return
	}
	size := st.Size
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		size = 0 // directory sizes are the file system's own
	}
	c.V("lstat "+name, "mode %o nlink %d uid %d gid %d size %d", st.Mode, st.Nlink, st.Uid, st.Gid, size)
}

// As runs f as uid and gid 65534 with no supplementary groups, on an OS
// thread of its own that exits afterwards (credentials are per thread).
func (c *C) As(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			c.t.Errorf("setgroups: %v", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, 65534, 65534, 65534); e != 0 {
			c.t.Errorf("setresgid: %v", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, 65534, 65534, 65534); e != 0 {
			c.t.Errorf("setresuid: %v", e)
			return
		}
		f()
	}()
	<-done
}

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	if le, ok := err.(*os.LinkError); ok {
		err = le.Err
	}
	if se, ok := err.(*os.SyscallError); ok {
		err = se.Err
	}
	if x, ok := err.(syscall.Errno); ok {
		e = x
	} else {
		return "error " + err.Error()
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return "errno " + strconv.Itoa(int(e))
}

func runCase(t *testing.T, tc tcase, dir string, limits map[Limit]string) []string {
	t.Helper()
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatalf("%s: %v", tc.name, err)
	}
	os.Chmod(dir, 0o777)
	c := &C{t: t, dir: dir, limits: limits}
	tc.run(c)
	return c.trace
}

func compare(t *testing.T, name string, want, got []string) {
	t.Helper()
	n := len(want)
	if len(got) > n {
		n = len(got)
	}
	for i := 0; i < n; i++ {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			// Later steps often differ only because this one did.
			t.Errorf("%s: step %d: ext4 gives %q, the mount %q", name, i, w, g)
			return
		}
	}
}
