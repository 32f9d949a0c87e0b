package fsx

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TreeConfig says what RunTree runs.
type TreeConfig struct {
	Dir    string // the directory under test (usually a cairn mount)
	Oracle string // a directory of a plain file system to compare with (default: a new t.TempDir(), on ext4 here)
	Ops    int    // operations per worker (default 2000)
	// Workers run at once, each in a subdirectory of its own (default 2):
	// the file system sees concurrent namespace operations, and each
	// worker's results stay deterministic.
	Workers    int
	Seed       uint64 // 0: random (printed)
	CheckEvery int    // compare the whole trees every so many operations (default 200)
	// Prepared: the workers' subdirectories (fsx-tree-N) exist in Dir
	// and Oracle already, filled alike (a union's lower branch).
	Prepared bool
	// NoExchange leaves RENAME_EXCHANGE out.
	NoExchange bool
	// NoRenameFlags leaves out every renameat2 flag (RENAME_NOREPLACE too):
	// a lower that has none (GlusterFS's FUSE client answers EINVAL).
	NoRenameFlags bool
	// RenameEXDEV accepts EXDEV from a rename of a directory under test,
	// which is then not done on the oracle either (mv copies instead):
	// overlayfs's answer for a directory with lower parts.
	RenameEXDEV bool
	// NoDirNlink leaves directories' link counts out of the comparison
	// (overlayfs shows 1 for a merged directory).
	NoDirNlink bool
}

// RunTree is the model check of namespace operations: random create,
// unlink, mkdir, rmdir, rename (with RENAME_NOREPLACE and RENAME_EXCHANGE),
// link, symlink, readlink, lstat and readdir on a small tree of names, each
// done in cfg.Dir and in cfg.Oracle. Every operation must end with the same
// errno in both, and the trees must be equal (names, types, sizes, link
// counts, hard links, file contents, symlink targets) every CheckEvery
// operations and at the end. CAIRN_FSX_SEED replays a seed, CAIRN_FSX_OPS
// changes the number of operations.
func RunTree(t testing.TB, c TreeConfig) {
	t.Helper()
	if c.Oracle == "" {
		c.Oracle = t.TempDir()
	}
	if c.Ops == 0 {
		c.Ops = 2000
	}
	if v, err := strconv.Atoi(os.Getenv("CAIRN_FSX_OPS")); err == nil && v > 0 {
		c.Ops = v
	}
	if c.Workers == 0 {
		c.Workers = 2
	}
	if v, err := strconv.ParseUint(os.Getenv("CAIRN_FSX_SEED"), 10, 64); err == nil {
		c.Seed = v
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.CheckEvery == 0 {
		c.CheckEvery = 200
	}
	t.Logf("fsx tree: seed %d, %d workers × %d operations in %s, oracle %s (replay: CAIRN_FSX_SEED=%d)",
		c.Seed, c.Workers, c.Ops, c.Dir, c.Oracle, c.Seed)
	var wg sync.WaitGroup
	errs := make([]string, c.Workers)
	for w := 0; w < c.Workers; w++ {
		sub := fmt.Sprintf("fsx-tree-%d", w)
		tw := &treeWorker{c: c, dir: filepath.Join(c.Dir, sub), oracle: filepath.Join(c.Oracle, sub),
			r: rand.New(rand.NewPCG(c.Seed+uint64(w), c.Seed^0x2545f4914f6cdd1d))}
		for _, d := range []string{tw.dir, tw.oracle} {
			if c.Prepared {
				break
			}
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatalf("fsx tree: %v", err)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = tw.run()
		}()
	}
	wg.Wait()
	for w, e := range errs {
		if e != "" {
			t.Fatalf("fsx tree: seed %d, worker %d: %s", c.Seed, w, e)
		}
	}
	t.Logf("fsx tree: %d operations, no difference", c.Workers*c.Ops)
}

type treeWorker struct {
	c           TreeConfig
	dir, oracle string
	r           *rand.Rand
	n           int
	log         []string
}

// path picks one of 4 + 16 + 64 names, so that operations often meet.
func (w *treeWorker) path() string {
	depth := 1 + w.r.IntN(3)
	parts := make([]string, depth)
	for i := range parts {
		parts[i] = string(rune('a' + w.r.IntN(4)))
	}
	return strings.Join(parts, "/")
}

func (w *treeWorker) run() string {
	for w.n = 0; w.n < w.c.Ops; w.n++ {
		if msg := w.step(); msg != "" {
			return w.failure(msg)
		}
		if (w.n+1)%w.c.CheckEvery == 0 {
			if msg := compareTrees(w.dir, w.oracle, w.c.NoDirNlink); msg != "" {
				return w.failure(msg)
			}
		}
	}
	if msg := compareTrees(w.dir, w.oracle, w.c.NoDirNlink); msg != "" {
		return w.failure(msg)
	}
	return ""
}

func (w *treeWorker) failure(msg string) string {
	start := max(0, len(w.log)-30)
	return fmt.Sprintf("operation %d: %s\nlast operations:\n  %s", w.n, msg, strings.Join(w.log[start:], "\n  "))
}

// step does one random operation in both trees and compares the results.
func (w *treeWorker) step() string {
	p, q := w.path(), w.path()
	var desc string
	var do func(base string) string // returns the result as text
	mayEXDEV := false
	switch op := w.r.IntN(100); {
	case op < 20:
		data := fmt.Sprintf("%d:%s\n", w.n, p)
		desc = "create " + p
		do = func(b string) string {
			fd, err := unix.Open(filepath.Join(b, p), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
			if err != nil {
				return errText(err)
			}
			defer unix.Close(fd)
			n, err := unix.Write(fd, []byte(data))
			if err != nil || n != len(data) {
				return fmt.Sprintf("write: %d %v", n, err)
			}
			return "ok"
		}
	case op < 32:
		desc = "unlink " + p
		do = func(b string) string { return errText(unix.Unlink(filepath.Join(b, p))) }
	case op < 47:
		desc = "mkdir " + p
		do = func(b string) string { return errText(unix.Mkdir(filepath.Join(b, p), 0o755)) }
	case op < 57:
		desc = "rmdir " + p
		do = func(b string) string { return errText(unix.Rmdir(filepath.Join(b, p))) }
	case op < 72:
		flags := []uint{0, 0, renameNoreplace, renameExchange}[w.r.IntN(4)]
		if w.c.NoExchange && flags == renameExchange || w.c.NoRenameFlags {
			flags = 0
		}
		mayEXDEV = w.c.RenameEXDEV
		desc = fmt.Sprintf("rename %s %s flags %d", p, q, flags)
		do = func(b string) string {
			return errText(renameat2(filepath.Join(b, p), filepath.Join(b, q), flags))
		}
	case op < 80:
		desc = "link " + p + " " + q
		do = func(b string) string { return errText(unix.Link(filepath.Join(b, p), filepath.Join(b, q))) }
	case op < 86:
		target := w.path()
		desc = "symlink " + target + " " + p
		do = func(b string) string { return errText(unix.Symlink(target, filepath.Join(b, p))) }
	case op < 90:
		desc = "readlink " + p
		do = func(b string) string {
			buf := make([]byte, 256)
			n, err := unix.Readlink(filepath.Join(b, p), buf)
			if err != nil {
				return errText(err)
			}
			return "ok " + string(buf[:n])
		}
	case op < 95:
		desc = "lstat " + p
		do = func(b string) string {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(b, p), &st); err != nil {
				return errText(err)
			}
			return fmt.Sprintf("ok mode %o nlink %d size %d", st.Mode&^0o7777, nlink(&st, w.c.NoDirNlink), regSize(&st))
		}
	default:
		desc = "readdir " + p
		do = func(b string) string {
			ents, err := os.ReadDir(filepath.Join(b, p))
			if err != nil {
				return errText(err)
			}
			var names []string
			for _, e := range ents {
				names = append(names, e.Name()+":"+e.Type().String())
			}
			return "ok " + strings.Join(names, " ")
		}
	}
	if len(w.log) > 200 {
		w.log = w.log[100:]
	}
	if mayEXDEV {
		if got := do(w.dir); got == "EXDEV" {
			w.log = append(w.log, fmt.Sprintf("%d: %s -> EXDEV (not done)", w.n, desc))
			return ""
		} else {
			want := do(w.oracle)
			w.log = append(w.log, fmt.Sprintf("%d: %s -> %s", w.n, desc, want))
			if got != want {
				return fmt.Sprintf("%s: %s, the oracle %s", desc, got, want)
			}
			return ""
		}
	}
	want := do(w.oracle)
	got := do(w.dir)
	w.log = append(w.log, fmt.Sprintf("%d: %s -> %s", w.n, desc, want))
	if got != want {
		return fmt.Sprintf("%s: %s, the oracle %s", desc, got, want)
	}
	return ""
}

// nlink is st's link count, 0 for a directory when noDir.
func nlink(st *unix.Stat_t, noDir bool) uint64 {
	if noDir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return 0
	}
	return uint64(st.Nlink)
}

// regSize is the size of regular files and symlinks (directory sizes are
// the file system's own business).
func regSize(st *unix.Stat_t) int64 {
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return 0
	}
	return st.Size
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

// compareTrees walks both trees and returns the first difference.
func compareTrees(dir, oracle string, noDirNlink bool) string {
	a, err := describeTree(dir, noDirNlink)
	if err != nil {
		return err.Error()
	}
	b, err := describeTree(oracle, noDirNlink)
	if err != nil {
		return "oracle: " + err.Error()
	}
	for i := 0; i < len(a) || i < len(b); i++ {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			return fmt.Sprintf("trees differ: %q, the oracle %q", x, y)
		}
	}
	return ""
}

// describeTree lists every entry under root, sorted: its path, type, size
// (files and symlinks), link count, contents or target, and which earlier
// entry it is a hard link of.
func describeTree(root string, noDirNlink bool) ([]string, error) {
	var out []string
	first := map[uint64]string{} // inode -> first path seen
	var walk func(rel string) error
	walk = func(rel string) error {
		ents, err := os.ReadDir(filepath.Join(root, rel))
		if err != nil {
			return err
		}
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		for _, n := range names {
			p := filepath.Join(rel, n)
			full := filepath.Join(root, p)
			var st unix.Stat_t
			if err := unix.Lstat(full, &st); err != nil {
				return err
			}
			s := fmt.Sprintf("%s type %o nlink %d size %d", p, st.Mode&unix.S_IFMT, nlink(&st, noDirNlink), regSize(&st))
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				if f, ok := first[st.Ino]; ok {
					s += " link of " + f
				} else {
					first[st.Ino] = p
				}
				b, err := os.ReadFile(full)
				if err != nil {
					return err
				}
				s += fmt.Sprintf(" data %q", b)
			case unix.S_IFLNK:
				t, err := os.Readlink(full)
				if err != nil {
					return err
				}
				s += " target " + t
			}
			out = append(out, s)
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if err := walk(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk("")
}
