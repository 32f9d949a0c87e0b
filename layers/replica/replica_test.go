//go:build linux

package replica_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/fault"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/replica"
)

func lowers(t *testing.T, n int) []string {
	var d []string
	for range n {
		d = append(d, t.TempDir())
	}
	return d
}

func localFS(t *testing.T, dir string) layer.FS {
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// build makes a replica over dirs (each under its own extra layer, if
// wrap is set), claimed as cairn mount claims it.
func build(t *testing.T, o replica.Options, ls ...layer.FS) *replica.FS {
	t.Helper()
	r, err := replica.New(ls, o)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Claim(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func locals(t *testing.T, dirs []string) []layer.FS {
	var ls []layer.FS
	for _, d := range dirs {
		ls = append(ls, localFS(t, d))
	}
	return ls
}

// tree describes a directory: every object's type, mode, owner, size,
// contents or target, and extended attributes (but the replica's own),
// hard links as the set of names sharing an inode.
func tree(t *testing.T, root string) string {
	t.Helper()
	var out []string
	inodes := map[uint64][]string{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			out = append(out, fmt.Sprintf("error %v", err))
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			out = append(out, rel+": "+err.Error())
			return nil
		}
		line := fmt.Sprintf("%s mode %o owner %d:%d", rel, st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" size %d data %x", st.Size, hash(b))
			if st.Nlink > 1 {
				inodes[st.Ino] = append(inodes[st.Ino], rel)
			}
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			line += " -> " + l
		}
		if rel != "." {
			line += " xattrs " + xattrs(p)
		}
		out = append(out, line)
		return nil
	})
	for _, names := range inodes {
		sort.Strings(names)
		out = append(out, "links "+strings.Join(names, " "))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func hash(b []byte) []byte {
	var h [8]byte
	for i, c := range b {
		h[i%8] = h[i%8]*31 + c
	}
	return h[:]
}

func xattrs(p string) string {
	buf := make([]byte, 64<<10)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		return "?"
	}
	var s []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" || strings.Contains(name, "cairn.replica.") {
			continue
		}
		v := make([]byte, 64<<10)
		m, _ := unix.Lgetxattr(p, name, v)
		s = append(s, fmt.Sprintf("%s=%q", name, v[:max(m, 0)]))
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

// same fails unless every directory holds the same tree.
func same(t *testing.T, dirs ...string) {
	t.Helper()
	want := tree(t, dirs[0])
	for i, d := range dirs[1:] {
		if got := tree(t, d); got != want {
			t.Errorf("replica %d differs from replica 1:\n%s", i+2, diff(want, got))
		}
	}
}

func diff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	in := map[string]bool{}
	for _, l := range bl {
		in[l] = true
	}
	ina := map[string]bool{}
	for _, l := range al {
		ina[l] = true
	}
	var out []string
	for _, l := range al {
		if !in[l] {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if !ina[l] {
			out = append(out, "+ "+l)
		}
	}
	if len(out) > 30 {
		out = append(out[:30], "...")
	}
	return strings.Join(out, "\n")
}

// TestReplicaModel runs the data and namespace models over replicas of two
// and three local lowers; the replicas are then identical.
func TestReplicaModel(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			dirs := lowers(t, n)
			r := build(t, replica.Options{Policy: replica.RoundRobin}, locals(t, dirs)...)
			m := mounttest.Mount(t, r)
			os.Mkdir(m.Path("data"), 0o755)
			fsx.Run(t, fsx.Config{Dir: m.Path("data"), Ops: 3000, Punch: true})
			fsx.RunTree(t, fsx.TreeConfig{Dir: m.Dir, Ops: 500})
			os.WriteFile(m.Path("x"), []byte("x"), 0o640)
			if err := unix.Setxattr(m.Path("x"), "user.k", []byte("v"), 0); err != nil {
				t.Error(err)
			}
			os.Chmod(m.Path("data"), 0o711)
			m.Unmount()
			same(t, dirs...)
			if r.Degraded() != 0 {
				t.Errorf("replicas degraded after a clean run: %b", r.Degraded())
			}
		})
	}
}

// TestReplicaReadsBalanced: reads of read-only files go to every replica
// in turn (round-robin), and one open file reads from one replica.
func TestReplicaReadsBalanced(t *testing.T) {
	dirs := lowers(t, 2)
	for _, d := range dirs {
		for i := range 4 {
			os.WriteFile(filepath.Join(d, fmt.Sprint(i)), bytes.Repeat([]byte{'a'}, 1<<16), 0o644)
		}
	}
	var counted []*mounttest.IOCounter
	var ls []layer.FS
	for _, d := range dirs {
		c := mounttest.CountIO(localFS(t, d))
		counted = append(counted, c)
		ls = append(ls, c)
	}
	r := build(t, replica.Options{Policy: replica.RoundRobin, NoPassthrough: true}, ls...)
	m := mounttest.Mount(t, r)
	for i := range 4 {
		if b, err := os.ReadFile(m.Path(fmt.Sprint(i))); err != nil || len(b) != 1<<16 {
			t.Fatalf("read %d: %d bytes, %v", i, len(b), err)
		}
	}
	for i, c := range counted {
		if c.Reads.Load() == 0 {
			t.Errorf("replica %d served no read", i+1)
		}
	}
	// Identity: the same st_ino whichever replica serves the file.
	var st1, st2 unix.Stat_t
	f1, _ := os.Open(m.Path("0"))
	f2, _ := os.Open(m.Path("0"))
	defer f1.Close()
	defer f2.Close()
	unix.Fstat(int(f1.Fd()), &st1)
	unix.Fstat(int(f2.Fd()), &st2)
	var st unix.Stat_t
	unix.Lstat(m.Path("0"), &st)
	if st1.Ino != st.Ino || st2.Ino != st.Ino {
		t.Errorf("st_ino differs between opens: %d %d, stat %d", st1.Ino, st2.Ino, st.Ino)
	}
}

// TestReplicaPassthrough: a read-only file of a replica is a replica's
// file, passed through; a file opened to write is not.
func TestReplicaPassthrough(t *testing.T) {
	dirs := lowers(t, 2)
	for _, d := range dirs {
		os.WriteFile(filepath.Join(d, "f"), []byte("data"), 0o644)
	}
	r := build(t, replica.Options{}, locals(t, dirs)...)
	for _, c := range []struct {
		flags int
		pass  bool
	}{{unix.O_RDONLY, true}, {unix.O_RDWR, false}, {unix.O_WRONLY, false}} {
		f, err := r.Open(t.Context(), "f", c.flags)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.Caps()&layer.CapPassthrough != 0; got != c.pass {
			t.Errorf("flags %#o: passthrough %v, want %v", c.flags, got, c.pass)
		}
		if fd, ok := f.PassthroughFd(); ok != c.pass {
			t.Errorf("flags %#o: PassthroughFd %v", c.flags, ok)
		} else if ok {
			unix.Close(fd)
		}
		f.Release(t.Context())
	}
}

// TestReplicaBadInput: what a replica set refuses.
func TestReplicaBadInput(t *testing.T) {
	d := t.TempDir()
	if _, err := replica.New([]layer.FS{localFS(t, d), localFS(t, d)}, replica.Options{}); err == nil || !strings.Contains(err.Error(), "same directory") {
		t.Errorf("the same directory twice: %v", err)
	}
	if _, err := replica.New([]layer.FS{localFS(t, d)}, replica.Options{}); err == nil {
		t.Error("one replica accepted")
	}
	dirs := lowers(t, 2)
	os.WriteFile(filepath.Join(dirs[0], "a"), []byte("one"), 0o644)
	os.WriteFile(filepath.Join(dirs[1], "a"), []byte("two"), 0o644)
	r, err := replica.New(locals(t, dirs), replica.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Claim(t.Context())
	var de *replica.DivergedError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "/a: the contents differ on replica 2") || !strings.Contains(err.Error(), "cairn resync --full") {
		t.Errorf("different trees at the first mount: %v", err)
	}
	r.Close()
	// resync --full makes them one set.
	r, _ = replica.New(locals(t, dirs), replica.Options{})
	st, err := r.ResyncStats(t.Context(), true, nil)
	if err != nil || st.Copied != 1 {
		t.Errorf("resync --full: %+v %v", st, err)
	}
	r.Close()
	same(t, dirs...)
	r, _ = replica.New(locals(t, dirs), replica.Options{})
	if err := r.Claim(t.Context()); err != nil {
		t.Errorf("claim after resync --full: %v", err)
	}
	r.Close()
	// A replica from elsewhere.
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "a"), []byte("one"), 0o644)
	r2, _ := replica.New(locals(t, []string{other, dirs[1]}), replica.Options{})
	os.WriteFile(filepath.Join(other, "a"), []byte("one"), 0o644)
	if err := r2.Claim(t.Context()); err == nil || !strings.Contains(err.Error(), "not part of this replica set") {
		t.Errorf("a foreign replica: %v", err)
	}
	r2.Close()
}

// faulty is replica i's fault layer, with rules that may change.
func faulty(t *testing.T, dir string) *fault.FS {
	return fault.New(localFS(t, dir), nil, true, false)
}

// workload makes and changes files under dir and fails on the first error
// the application sees.
func workload(t *testing.T, dir string, round int) {
	t.Helper()
	for i := range 20 {
		p := filepath.Join(dir, fmt.Sprintf("d%d", i%4), fmt.Sprintf("f%d-%d", round, i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte{byte('a' + i)}, 1000*(i+1)), 0o644); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if b, err := os.ReadFile(p); err != nil || len(b) != 1000*(i+1) {
			t.Fatalf("round %d: reading back %s: %d bytes, %v", round, p, len(b), err)
		}
	}
}

// TestReplicaFailover: of three replicas, the second starts failing every
// operation with EIO mid-workload, then the third hangs; the application
// sees no error. Resync then copies exactly what changed meanwhile (a file
// rewritten with its size and time kept included: the hash finds it), and
// the replicas are identical again.
func TestReplicaFailover(t *testing.T) {
	dirs := lowers(t, 3)
	f2, f3 := faulty(t, dirs[1]), faulty(t, dirs[2])
	r := build(t, replica.Options{Policy: replica.RoundRobin, Timeout: 300 * 1e6}, localFS(t, dirs[0]), f2, f3)
	m := mounttest.Mount(t, r)
	workload(t, m.Dir, 0)
	same(t, dirs...)

	f2.SetRules(fault.Rules{{Errno: syscall.EIO}})
	workload(t, m.Dir, 1)
	if r.Degraded() != 0b010 {
		t.Fatalf("degraded %03b after replica 2 failed, want 010", r.Degraded())
	}
	f3.SetRules(fault.Rules{{Hang: 3 * 1e9}})
	workload(t, m.Dir, 2)
	// A file rewritten in place with its size and times kept, and one
	// removed.
	p := m.Path("d0/f0-0")
	var st unix.Stat_t
	unix.Stat(p, &st)
	if err := os.WriteFile(p, bytes.Repeat([]byte{'Z'}, int(st.Size)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.UtimesNano(p, []unix.Timespec{st.Atim, st.Mtim}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(m.Path("d1/f0-1")); err != nil {
		t.Fatal(err)
	}
	if r.Degraded() != 0b110 {
		t.Fatalf("degraded %03b after replica 3 hung, want 110", r.Degraded())
	}
	m.Unmount()
	r.Close()
	f2.SetRules(nil)
	f3.SetRules(nil)
	if tree(t, dirs[0]) == tree(t, dirs[1]) || tree(t, dirs[0]) == tree(t, dirs[2]) {
		t.Fatal("the degraded replicas got the changes")
	}

	// A new mount sees them degraded (and refuses nothing).
	r2 := build(t, replica.Options{}, locals(t, dirs)...)
	if r2.Degraded() != 0b110 {
		t.Errorf("a new mount sees degraded %03b, want 110", r2.Degraded())
	}
	replica.SetDebugCopy(func(k int, p string) { t.Logf("copy to %d: %s", k+1, p) })
	defer replica.SetDebugCopy(nil)
	st2, err := r2.ResyncStats(t.Context(), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Replica 2 missed rounds 1 and 2 (40 files), replica 3 round 2 (20),
	// each the rewritten file and the removal.
	if st2.Copied != 40+1+20+1 || st2.Removed != 2 {
		t.Errorf("resync: %+v, want 62 copied and 2 removed", st2)
	}
	same(t, dirs...)
	if r2.Degraded() != 0 {
		t.Errorf("degraded %03b after the resync", r2.Degraded())
	}
	// Nothing left to do.
	if st, err := r2.ResyncStats(t.Context(), false, nil); err != nil || st.Copied != 0 || st.Removed != 0 {
		t.Errorf("a second resync: %+v %v", st, err)
	}
}

// TestReplicaResyncInterrupted: a resync that stops midway (a crash, ^C),
// with a temporary file of it left behind, resumes when run again.
func TestReplicaResyncInterrupted(t *testing.T) {
	dirs := lowers(t, 2)
	f2 := faulty(t, dirs[1])
	r := build(t, replica.Options{Timeout: 300 * 1e6}, localFS(t, dirs[0]), f2)
	m := mounttest.Mount(t, r)
	workload(t, m.Dir, 0)
	f2.SetRules(fault.Rules{{Errno: syscall.EIO}})
	workload(t, m.Dir, 1)
	workload(t, m.Dir, 2)
	m.Unmount()
	r.Close()
	f2.SetRules(nil)

	total := int64(0)
	for i := 0; ; i++ {
		if i > 50 {
			t.Fatal("the resync never finished")
		}
		r, err := replica.New(locals(t, dirs), replica.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		st, err := r.ResyncStats(ctx, false, func(done, _ int64) {
			if done == int64(15*(i+1)) {
				cancel()
			}
		})
		cancel()
		r.Close()
		total += st.Copied
		if err == nil {
			break
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		// What a crash in the middle of a copy leaves (in a directory
		// not done yet).
		if i == 0 {
			os.WriteFile(filepath.Join(dirs[1], "d2", ".cairn-replica-tmp.f2-2"), []byte("half"), 0o600)
		}
	}
	same(t, dirs...)
	if total < 40 || total > 48 {
		t.Errorf("%d objects copied in all, want 40 and a few copied twice at most", total)
	}
}

// TestReplicaWriteWhileReading: a file open read-only (passed through from
// one replica) is opened to write and written: the kernel writes through
// the readers' replica, and the others get the bytes at fsync and close.
func TestReplicaWriteWhileReading(t *testing.T) {
	dirs := lowers(t, 3)
	for _, d := range dirs {
		os.WriteFile(filepath.Join(d, "f"), []byte("0123456789"), 0o644)
	}
	r := build(t, replica.Options{Policy: replica.RoundRobin}, locals(t, dirs)...)
	m := mounttest.Mount(t, r)
	rd, err := os.Open(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	w, err := os.OpenFile(m.Path("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("opening to write a file open to read: %v", err)
	}
	if _, err := w.WriteAt([]byte("abc"), 2); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	same(t, dirs...)
	if _, err := w.WriteAt([]byte("XYZ!"), 8); err != nil {
		t.Fatal(err)
	}
	var st1, st2 unix.Stat_t
	unix.Fstat(int(w.Fd()), &st1)
	unix.Fstat(int(rd.Fd()), &st2)
	if st1.Size != 12 || st1.Ino != st2.Ino {
		t.Errorf("fstat of the writer: size %d, st_ino %d; of the reader: st_ino %d", st1.Size, st1.Ino, st2.Ino)
	}
	w.Close()
	b := make([]byte, 12)
	if n, _ := rd.ReadAt(b, 0); string(b[:n]) != "01abc567XYZ!" {
		t.Errorf("the reader reads %q", b[:n])
		for _, d := range dirs {
			b, _ := os.ReadFile(filepath.Join(d, "f"))
			t.Logf("%s: %q", d, b)
		}
		b, _ := os.ReadFile(m.Path("f"))
		t.Logf("mount: %q", b)
	}
	rd.Close()
	m.Unmount()
	same(t, dirs...)
	if r.Degraded() != 0 {
		t.Errorf("degraded %b", r.Degraded())
	}
	// The marks are gone: a new mount finds every replica in step.
	r.Close()
	r2 := build(t, replica.Options{}, locals(t, dirs)...)
	if r2.Degraded() != 0 {
		t.Errorf("a new mount finds degraded %b", r2.Degraded())
	}
}

// TestReplicaResyncAtMount: with resync = true, a mount brings a degraded
// replica back before serving.
func TestReplicaResyncAtMount(t *testing.T) {
	dirs := lowers(t, 2)
	f2 := faulty(t, dirs[1])
	r := build(t, replica.Options{Timeout: 300 * 1e6}, localFS(t, dirs[0]), f2)
	m := mounttest.Mount(t, r)
	workload(t, m.Dir, 0)
	f2.SetRules(fault.Rules{{Errno: syscall.EIO}})
	workload(t, m.Dir, 1)
	m.Unmount()
	r.Close()
	if r.Degraded() != 0b10 {
		t.Fatalf("degraded %b", r.Degraded())
	}
	r2 := build(t, replica.Options{ResyncAtMount: true}, locals(t, dirs)...)
	if r2.Degraded() != 0 {
		t.Errorf("degraded %b after a mount with resync", r2.Degraded())
	}
	same(t, dirs...)
}

// TestReplicaSeekPastData: lseek SEEK_DATA past a file's last data gives
// ENXIO, as on ext4, and degrades no replica (it did: the conformance
// suite's sparse-file case left replica 1 degraded).
func TestReplicaSeekPastData(t *testing.T) {
	dirs := lowers(t, 2)
	r := build(t, replica.Options{}, locals(t, dirs)...)
	m := mounttest.Mount(t, r)
	f, err := os.Create(m.Path("s"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("data"); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Seek(int(f.Fd()), 1<<20, unix.SEEK_DATA); err != unix.ENXIO {
		t.Errorf("SEEK_DATA past the data: %v, want ENXIO", err)
	}
	if _, err := unix.Seek(int(f.Fd()), 1<<20, unix.SEEK_HOLE); err != unix.ENXIO {
		t.Errorf("SEEK_HOLE past the end: %v, want ENXIO", err)
	}
	if d := r.Degraded(); d != 0 {
		t.Errorf("degraded %02b after seeks past the data", d)
	}
}

// TestReplicaFullReplica: a replica whose disk is full (ENOSPC) is degraded
// and the others take the change, whichever replica it is; the first one
// full used to fail the application's write and degrade the one with room.
func TestReplicaFullReplica(t *testing.T) {
	for full := range 2 {
		t.Run(fmt.Sprintf("replica%d", full+1), func(t *testing.T) {
			dirs := lowers(t, 2)
			fs := []*fault.FS{faulty(t, dirs[0]), faulty(t, dirs[1])}
			r := build(t, replica.Options{Policy: replica.First}, fs[0], fs[1])
			m := mounttest.Mount(t, r)
			fs[full].SetRules(fault.Rules{{Names: []string{"write"}, Errno: syscall.ENOSPC}})
			want := bytes.Repeat([]byte("full disk "), 10000)
			if err := os.WriteFile(filepath.Join(m.Dir, "f"), want, 0o644); err != nil {
				t.Fatalf("write with replica %d full: %v", full+1, err)
			}
			if d := r.Degraded(); d != 1<<full {
				t.Errorf("degraded %02b, want %02b", d, 1<<full)
			}
			if b, err := os.ReadFile(filepath.Join(dirs[1-full], "f")); err != nil || !bytes.Equal(b, want) {
				t.Errorf("the replica with room holds %d bytes (%v), want %d", len(b), err, len(want))
			}
			// Every replica full: the application gets ENOSPC.
			fs[1-full].SetRules(fault.Rules{{Names: []string{"write"}, Errno: syscall.ENOSPC}})
			if err := os.WriteFile(filepath.Join(m.Dir, "g"), want, 0o644); !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("write with every replica full: %v, want ENOSPC", err)
			}
		})
	}
}

// lockedBuffer is a log written by the server's goroutines, read by the
// test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReplicaDirectoryMovedAway: a replica's directory renamed behind the
// mount (mv rb/d rb/gone) is degraded at the next change, with one log
// line naming it and what to run; the change and those after it go to the
// other replica only, not on into rb/gone through the daemon's descriptor.
func TestReplicaDirectoryMovedAway(t *testing.T) {
	base := t.TempDir()
	ra, rb := filepath.Join(base, "ra"), filepath.Join(base, "rb", "d")
	for _, d := range []string{ra, rb} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := build(t, replica.Options{Policy: replica.RoundRobin}, locals(t, []string{ra, rb})...)
	r.CheckRootsAlways()
	logged := &lockedBuffer{}
	r.SetLog(slog.New(slog.NewTextHandler(logged, nil)))
	m := mounttest.Mount(t, r)
	if err := os.WriteFile(m.Path("before"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	gone := filepath.Join(base, "rb", "gone")
	if err := os.Rename(rb, gone); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("after"), []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(m.Path("before"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("+more")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Mkdir(m.Path("dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if d := r.Degraded(); d != 1<<1 {
		t.Errorf("degraded set %b, want replica 2 (10)", d)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "replica=2") || !strings.Contains(lines[0], rb) || !strings.Contains(lines[0], "cairn resync") {
		t.Errorf("want one log line naming replica 2, %s and cairn resync; got:\n%s", rb, logged.String())
	}
	for _, c := range []struct{ path, want string }{
		{m.Path("before"), "one+more"}, {m.Path("after"), "two"},
		{filepath.Join(ra, "before"), "one+more"}, {filepath.Join(ra, "after"), "two"},
		{filepath.Join(gone, "before"), "one"},
	} {
		if b, err := os.ReadFile(c.path); err != nil || string(b) != c.want {
			t.Errorf("%s: %q, %v; want %q", c.path, b, err, c.want)
		}
	}
	for _, n := range []string{"after", "dir"} {
		if _, err := os.Lstat(filepath.Join(gone, n)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s made in the moved directory: %v", n, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ra, "dir")); err != nil {
		t.Errorf("dir on replica 1: %v", err)
	}
}

// TestReplicaResyncRenames: what is renamed while a replica is degraded (a
// directory of many files into a directory made meanwhile, a file, a file
// out of a renamed directory, a directory made and renamed) is renamed on
// it by resync, not copied: only what changed is copied (a file rewritten
// in the renamed directory with its size kept, found by its hash), and the
// replicas are identical after.
func TestReplicaResyncRenames(t *testing.T) {
	dirs := lowers(t, 2)
	f2 := faulty(t, dirs[1])
	r := build(t, replica.Options{Timeout: 300 * 1e6}, localFS(t, dirs[0]), f2)
	m := mounttest.Mount(t, r)
	write := func(p string, b []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		write(m.Path("big", fmt.Sprintf("f%d", i)), bytes.Repeat([]byte{byte('a' + i%26)}, 100+i))
	}
	for i := range 10 {
		write(m.Path("big", "sub", fmt.Sprintf("s%d", i)), bytes.Repeat([]byte{byte('A' + i)}, 200+i))
	}
	write(m.Path("solo"), []byte("solo"))
	write(m.Path("d0", "a"), []byte("old a"))
	for i := range 5 {
		write(m.Path("x", fmt.Sprintf("x%d", i)), []byte("in x"))
		write(m.Path("y", fmt.Sprintf("y%d", i)), []byte("in y"))
	}
	same(t, dirs...)

	f2.SetRules(fault.Rules{{Errno: syscall.EIO}})
	write(m.Path("trigger"), []byte("x"))
	if r.Degraded() != 0b10 {
		t.Fatalf("degraded %02b, want 10", r.Degraded())
	}
	mv := func(a, b string) {
		t.Helper()
		if err := os.Rename(m.Path(a), m.Path(b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(m.Path("moved"), 0o755); err != nil {
		t.Fatal(err)
	}
	mv("big", "moved/big2")
	mv("solo", "solo2")
	mv("moved/big2/sub/s1", "moved/big2/s1x")
	write(m.Path("moved/big2/f3"), bytes.Repeat([]byte{'Z'}, 103))
	if err := os.Mkdir(m.Path("nd"), 0o755); err != nil {
		t.Fatal(err)
	}
	mv("nd", "nd2")
	// Old paths used again: a new solo of the old one's size; a new d0
	// with an a of the old one's size, renamed in turn.
	write(m.Path("solo"), []byte("SOLO"))
	mv("d0", "d0x")
	write(m.Path("d0", "a"), []byte("new a"))
	mv("d0", "d0y")
	// Two directories exchanged.
	if err := unix.Renameat2(unix.AT_FDCWD, m.Path("x"), unix.AT_FDCWD, m.Path("y"), layer.RenameExchange); err != nil {
		t.Fatal(err)
	}
	m.Unmount()
	r.Close()
	f2.SetRules(nil)

	r2 := build(t, replica.Options{}, locals(t, dirs)...)
	if r2.Degraded() != 0b10 {
		t.Fatalf("a new mount sees degraded %02b, want 10", r2.Degraded())
	}
	replica.SetDebugCopy(func(k int, p string) { t.Logf("copy to %d: %s", k+1, p) })
	defer replica.SetDebugCopy(nil)
	st, err := r2.ResyncStats(t.Context(), false, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Copied: trigger, moved (made for big2), nd2 (new), big2/f3
	// (rewritten), the new solo, d0y and its a; renamed: big, solo,
	// sub/s1, d0, x and y.
	if st.Copied != 7 || st.Renamed != 6 || st.Removed != 0 {
		t.Errorf("resync: %+v, want 7 copied, 6 renamed, 0 removed", st)
	}
	same(t, dirs...)
	if b, err := os.ReadFile(filepath.Join(dirs[1], "moved/big2/f3")); err != nil || !bytes.Equal(b, bytes.Repeat([]byte{'Z'}, 103)) {
		t.Errorf("moved/big2/f3 on replica 2: %q %v", b, err)
	}
	if st, err := r2.ResyncStats(t.Context(), false, nil); err != nil || st.Copied != 0 || st.Removed != 0 || st.Renamed != 0 {
		t.Errorf("a second resync: %+v %v", st, err)
	}
}

// resident counts the pages of a file in the page cache.
func resident(t *testing.T, p string) int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	b, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	vec := make([]byte, (len(b)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// evict drops a file's pages from the page cache.
func evict(t *testing.T, p string) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Sync() // dirty pages stay
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// TestReplicaSmallReadsStayOnPrimary: read-only files smaller than
// BalanceSize are read from the primary (no open, lookup or read on the
// other replica); larger ones are spread by the policy, and one read on
// another replica changes the primary's atime (relatime: it was due)
// without reading its data (no page of the primary's file comes into the
// page cache).
func TestReplicaSmallReadsStayOnPrimary(t *testing.T) {
	dirs := lowers(t, 2)
	small, big := bytes.Repeat([]byte("small "), 700), bytes.Repeat([]byte("big file "), 150000)
	old := time.Now().Add(-time.Hour)
	for _, d := range dirs {
		for i := range 8 {
			os.WriteFile(filepath.Join(d, fmt.Sprintf("s%d", i)), small, 0o644)
		}
		for i := range 4 {
			p := filepath.Join(d, fmt.Sprintf("b%d", i))
			os.WriteFile(p, big, 0o644)
			os.Chtimes(p, old.Add(-time.Hour), old) // atime before mtime: due
		}
	}
	var counted []*mounttest.IOCounter
	var ls []layer.FS
	for _, d := range dirs {
		c := mounttest.CountIO(localFS(t, d))
		counted = append(counted, c)
		ls = append(ls, c)
	}
	r := build(t, replica.Options{Policy: replica.RoundRobin, NoPassthrough: true, BalanceSize: 1 << 20}, ls...)
	m := mounttest.Mount(t, r)
	for _, c := range counted {
		c.Reads.Store(0) // the first mount's comparison of the trees
	}
	for i := range 8 {
		if b, err := os.ReadFile(m.Path(fmt.Sprintf("s%d", i))); err != nil || !bytes.Equal(b, small) {
			t.Fatalf("s%d: %d bytes, %v", i, len(b), err)
		}
	}
	if n := counted[1].Reads.Load(); n != 0 || counted[0].Reads.Load() == 0 {
		t.Errorf("small files: %d reads on replica 1, %d on replica 2; want all on replica 1", counted[0].Reads.Load(), n)
	}
	elsewhere := 0
	for i := range 4 {
		name := fmt.Sprintf("b%d", i)
		for _, d := range dirs {
			evict(t, filepath.Join(d, name))
		}
		var before unix.Stat_t
		unix.Stat(filepath.Join(dirs[0], name), &before)
		r2 := counted[1].Reads.Load()
		if b, err := os.ReadFile(m.Path(name)); err != nil || !bytes.Equal(b, big) {
			t.Fatalf("%s: %d bytes, %v", name, len(b), err)
		}
		if counted[1].Reads.Load() == r2 {
			continue // served by the primary
		}
		elsewhere++
		var after unix.Stat_t
		unix.Stat(filepath.Join(dirs[0], name), &after)
		if after.Atim == before.Atim {
			t.Errorf("%s read on replica 2: the primary's atime is unchanged", name)
		}
		if n := resident(t, filepath.Join(dirs[0], name)); n != 0 {
			t.Errorf("%s read on replica 2: %d pages of the primary's file were read to change its atime", name, n)
		}
	}
	if elsewhere == 0 {
		t.Error("no large file was read on replica 2")
	}
}

// TestReplicaMmapWriteWhileRead: a file held open for reading (passed
// through to one replica's file) is written through a shared mapping of
// another open, which the layer passes through to the reader's replica too
// (opens.go): the write reaches every replica once the writer is released
// (its copy to the others).
func TestReplicaMmapWriteWhileRead(t *testing.T) {
	dirs := lowers(t, 2)
	r := build(t, replica.Options{Policy: replica.RoundRobin}, locals(t, dirs)...)
	m := mounttest.Mount(t, r)
	if err := os.WriteFile(m.Path("f"), []byte("0123456789abcdef"), 0o644); err != nil {
		t.Fatal(err)
	}
	rd, err := os.Open(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	w, err := os.OpenFile(m.Path("f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open for writing while a reader holds the file: %v", err)
	}
	mp, err := unix.Mmap(int(w.Fd()), 0, 16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	mounttest.MapCopyIn(t, mp, "MAPPED")
	unix.Msync(mp, unix.MS_SYNC)
	unix.Munmap(mp)
	w.Close()
	// The writer's release (after close(2) returns) copies it: only the
	// reader is open then.
	m.WaitOpenFiles(t, 1)
	for _, d := range dirs {
		if b, _ := os.ReadFile(filepath.Join(d, "f")); string(b) != "MAPPED6789abcdef" {
			t.Errorf("%s holds %q", d, b)
		}
	}
}

// TestReplicaTimesAlike: after a file is written and closed, its replicas
// have the same modification time (each took the writes at its own
// moment), so a stat gives the same times whichever replica answers.
func TestReplicaTimesAlike(t *testing.T) {
	dirs := lowers(t, 3)
	r := build(t, replica.Options{Policy: replica.RoundRobin}, locals(t, dirs)...)
	m := mounttest.Mount(t, r)
	for i := range 5 {
		name := fmt.Sprintf("f%d", i)
		if err := os.WriteFile(m.Path(name), bytes.Repeat([]byte("t"), 100000*(i+1)), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(m.Path(name), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("more")
		f.Close()
	}
	m.Unmount() // the last releases are done
	for i := range 5 {
		var first unix.Stat_t
		for k, d := range dirs {
			var st unix.Stat_t
			if err := unix.Stat(filepath.Join(d, fmt.Sprintf("f%d", i)), &st); err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				first = st
			} else if st.Mtim != first.Mtim {
				t.Errorf("f%d: replica %d's mtime %v, replica 1's %v", i, k+1, st.Mtim, first.Mtim)
			}
		}
	}
}

// TestReplicaUnlinkedOpenReadElsewhere: a file open for reading on another
// replica than the primary (balanced: BalanceSize 0), then unlinked, keeps
// its bytes while new files are made, as on ext4. Its inode number shown
// is the primary's file's; the open released that file, so the unlink
// freed the number, ext4 gave it to a new file, and the kernel, handed the
// new file as the open file's node, failed the open file's reads and
// fstat with EIO (TestConformance/replica/identity, 1 run in 8 to 30).
func TestReplicaUnlinkedOpenReadElsewhere(t *testing.T) {
	dirs := lowers(t, 2)
	r := build(t, replica.Options{Policy: replica.RoundRobin}, locals(t, dirs)...)
	m := mounttest.Mount(t, r)
	for round := range 8 { // round robin: half the opens read on replica 2
		name := fmt.Sprintf("f%d", round)
		want := fmt.Sprintf("file %d of the round", round)
		if err := os.WriteFile(m.Path(name), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		m.WaitReleased(t) // the writer's files hold the inode no more
		f, err := os.Open(m.Path(name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(m.Path(name)); err != nil {
			t.Fatal(err)
		}
		for j := range 5 {
			if err := os.WriteFile(m.Path(fmt.Sprintf("new%d-%d", round, j)), []byte("new"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		b := make([]byte, 100)
		n, err := f.ReadAt(b, 0)
		if string(b[:n]) != want {
			t.Errorf("round %d: the unlinked open file reads %q (%v) after new files were made, want %q", round, b[:n], err, want)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Errorf("round %d: fstat of the unlinked open file: %v", round, err)
		}
		f.Close()
	}
}
