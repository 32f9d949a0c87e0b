// Package fsx is an fsx-style randomised model checker: it runs random
// operations on a few real files of a directory (usually a cairn mount) and
// compares every read with an in-memory model of what the files must hold.
//
// The operations: writes at random offsets (leaving holes), reads, appends
// through O_APPEND descriptors, truncates down and up, renames between the
// files, close and reopen, fsync, size checks, and optionally mmap reads and
// writes and hole punching. A failure prints the seed and the last
// operations; CAIRN_FSX_SEED replays a seed, CAIRN_FSX_OPS changes the
// number of operations and CAIRN_FSX_LOG=all prints every operation kept
// (not only the last 30) on a failure.
package fsx

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Config says what to run.
type Config struct {
	Dir string // where the files live
	// FS, if set, is what the files are reached through, names relative
	// to it (Dir is then only for messages): a stack used in-process
	// (package cairn) rather than a directory through the kernel. Mmap and
	// Punch need the kernel's files and are left out.
	FS      FS
	Files   int    // number of files (default 3)
	Ops     int    // number of operations (default 10000)
	Seed    uint64 // 0: random (printed)
	MaxSize int64  // largest offset written (default 1 MiB)
	MaxLen  int    // largest single write or read (default 64 KiB)
	// Mmap also reads and writes through mmap. Only with a mount served by
	// another process (mounttest.MountSpec): a Go program that serves the
	// page faults of its own mapping can deadlock in the garbage collector.
	Mmap  bool
	Punch bool // also punch holes (fallocate PUNCH_HOLE)
	// Check, if set, is called every CheckEvery operations (default 500)
	// and at the end with each file's name (relative to Dir) and expected
	// contents, e.g. to compare the lower directory.
	Check      func(name string, want []byte) error
	CheckEvery int
	// Between, if set, is called on some of the close-and-reopen
	// operations, while the model has the file closed, with its path: a
	// change that must keep the file's bytes (a chains layer's push or
	// pop). It returns a note for the operation log; an error fails the run.
	Between func(path string, r *rand.Rand) (string, error)
}

// FS is what the model acts on: names are relative to it.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Rename(oldname, newname string) error
	Stat(name string) (os.FileInfo, error)
	ReadFile(name string) ([]byte, error)
}

// File is an open file of an FS.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Writer
	Truncate(size int64) error
	Sync() error
	Close() error
}

// dirFS is Dir through the kernel.
type dirFS string

func (d dirFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	return os.OpenFile(filepath.Join(string(d), name), flag, perm)
}
func (d dirFS) Rename(a, b string) error {
	return os.Rename(filepath.Join(string(d), a), filepath.Join(string(d), b))
}
func (d dirFS) Stat(name string) (os.FileInfo, error) { return os.Stat(filepath.Join(string(d), name)) }
func (d dirFS) ReadFile(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(string(d), name))
}

type file struct {
	name string
	f    File
	data []byte // the model
}

type runner struct {
	t     testing.TB
	c     Config
	r     *rand.Rand
	files []*file
	log   []string
	n     int
}

// Run runs the model check; it fails t on the first difference.
func Run(t testing.TB, c Config) {
	t.Helper()
	if c.Files == 0 {
		c.Files = 3
	}
	if c.Ops == 0 {
		c.Ops = 10000
	}
	if v, err := strconv.Atoi(os.Getenv("CAIRN_FSX_OPS")); err == nil && v > 0 {
		c.Ops = v
	}
	if v, err := strconv.ParseUint(os.Getenv("CAIRN_FSX_SEED"), 10, 64); err == nil {
		c.Seed = v
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.MaxSize == 0 {
		c.MaxSize = 1 << 20
	}
	if c.MaxLen == 0 {
		c.MaxLen = 64 << 10
	}
	if c.CheckEvery == 0 {
		c.CheckEvery = 500
	}
	if c.FS == nil {
		c.FS = dirFS(c.Dir)
	} else {
		c.Mmap, c.Punch = false, false
	}
	t.Logf("fsx: seed %d, %d operations in %s (replay: CAIRN_FSX_SEED=%d)", c.Seed, c.Ops, c.Dir, c.Seed)
	r := &runner{t: t, c: c, r: rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15))}
	for i := 0; i < c.Files; i++ {
		name := fmt.Sprintf("fsx-%d", i)
		f, err := c.FS.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			t.Fatalf("fsx: create %s: %v", name, err)
		}
		r.files = append(r.files, &file{name: name, f: f})
	}
	defer func() {
		for _, f := range r.files {
			f.f.Close()
		}
	}()
	for r.n = 0; r.n < c.Ops; r.n++ {
		r.step()
		if t.Failed() {
			return
		}
		if (r.n+1)%c.CheckEvery == 0 {
			r.checkAll()
		}
	}
	r.checkAll()
	t.Logf("fsx: %d operations, no difference", c.Ops)
}

func (r *runner) fail(f string, a ...any) {
	r.t.Helper()
	start := max(0, len(r.log)-30)
	if os.Getenv("CAIRN_FSX_LOG") == "all" {
		start = 0
	}
	r.t.Fatalf("fsx: seed %d, operation %d: %s\nlast operations:\n  %s",
		r.c.Seed, r.n, fmt.Sprintf(f, a...), joinLines(r.log[start:]))
}

func joinLines(l []string) string {
	var b bytes.Buffer
	for i, s := range l {
		if i > 0 {
			b.WriteString("\n  ")
		}
		b.WriteString(s)
	}
	return b.String()
}

func (r *runner) note(f string, a ...any) {
	if len(r.log) > 200 {
		r.log = r.log[100:]
	}
	r.log = append(r.log, fmt.Sprintf("%d: ", r.n)+fmt.Sprintf(f, a...))
}

// length picks a length, mostly small, sometimes large.
func (r *runner) length() int {
	switch r.r.IntN(4) {
	case 0:
		return 1 + r.r.IntN(16)
	case 1:
		return 1 + r.r.IntN(4096)
	default:
		return 1 + r.r.IntN(r.c.MaxLen)
	}
}

// offset picks an offset near the interesting places: 0, block
// boundaries, the end of the file, or anywhere.
func (r *runner) offset(size int64) int64 {
	switch r.r.IntN(5) {
	case 0:
		return 0
	case 1:
		b := int64(4096 * r.r.IntN(int(r.c.MaxSize/4096)+1))
		return max(0, b+int64(r.r.IntN(3))-1)
	case 2:
		return max(0, size-int64(r.r.IntN(100)))
	default:
		return r.r.Int64N(r.c.MaxSize)
	}
}

// fill makes n bytes of new data: random bytes (incompressible) or a
// short random pattern repeated (compressible), which matters to codecs.
// It works in words and copies, not byte by byte: under the race detector
// a byte loop would dominate the run.
func (r *runner) fill(n int) []byte {
	b := make([]byte, n+8)
	unit := n
	if r.r.IntN(2) == 0 {
		unit = min(n, 1+r.r.IntN(64))
	}
	for i := 0; i < unit; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.r.Uint64())
	}
	for done := unit; done < n; done *= 2 {
		copy(b[done:n], b[:done])
	}
	return b[:n]
}

func (r *runner) step() {
	f := r.files[r.r.IntN(len(r.files))]
	size := int64(len(f.data))
	switch op := r.r.IntN(100); {
	case op < 30: // write
		off := r.offset(size)
		n := min(r.length(), int(r.c.MaxSize+int64(r.c.MaxLen)-off))
		if n <= 0 {
			return
		}
		buf := r.fill(n)
		r.note("write %s off=%d len=%d", f.name, off, n)
		if w, err := f.f.WriteAt(buf, off); err != nil || w != n {
			r.fail("write %s at %d, %d bytes: wrote %d, %v", f.name, off, n, w, err)
		}
		f.write(off, buf)
	case op < 60: // read
		off := r.offset(size)
		n := r.length()
		r.note("read %s off=%d len=%d (size %d)", f.name, off, n, size)
		buf := make([]byte, n)
		got, err := f.f.ReadAt(buf, off)
		if msg := checkRead(buf, got, err, f.slice(off, n)); msg != "" {
			r.fail("read %s at %d, %d bytes: %s", f.name, off, n, msg)
		}
	case op < 68: // append
		n := r.length()
		buf := r.fill(n)
		r.note("append %s len=%d (size %d)", f.name, n, size)
		a, err := r.c.FS.OpenFile(f.name, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			r.fail("open %s O_APPEND: %v", f.name, err)
		}
		w, err := a.Write(buf)
		a.Close()
		if err != nil || w != n {
			r.fail("append %s: wrote %d of %d: %v", f.name, w, n, err)
		}
		f.write(size, buf)
	case op < 76: // truncate
		var ns int64
		switch r.r.IntN(4) {
		case 0:
			ns = 0
		case 1:
			ns = size + int64(r.r.IntN(r.c.MaxLen)) // up: a hole
		default:
			if size > 0 {
				ns = r.r.Int64N(size + 1)
			}
		}
		r.note("truncate %s %d -> %d", f.name, size, ns)
		if err := f.f.Truncate(ns); err != nil {
			r.fail("truncate %s to %d: %v", f.name, ns, err)
		}
		f.truncate(ns)
	case op < 80: // stat
		r.note("stat %s (size %d)", f.name, size)
		fi, err := r.c.FS.Stat(f.name)
		if err != nil {
			r.fail("stat %s: %v", f.name, err)
		}
		if fi.Size() != size {
			r.fail("stat %s: size %d, want %d", f.name, fi.Size(), size)
		}
	case op < 84: // rename: swap two files' names through a temporary
		g := r.files[r.r.IntN(len(r.files))]
		if f == g {
			return
		}
		r.note("swap %s %s", f.name, g.name)
		for _, mv := range [][2]string{{f.name, "fsx-tmp"}, {g.name, f.name}, {"fsx-tmp", g.name}} {
			if err := r.c.FS.Rename(mv[0], mv[1]); err != nil {
				r.fail("rename %s %s: %v", mv[0], mv[1], err)
			}
		}
		f.name, g.name = g.name, f.name
	case op < 88: // close and reopen
		r.note("reopen %s", f.name)
		if err := f.f.Close(); err != nil {
			r.fail("close %s: %v", f.name, err)
		}
		if r.c.Between != nil && r.r.IntN(2) == 0 {
			note, err := r.c.Between(filepath.Join(r.c.Dir, f.name), r.r)
			r.note("between %s: %s", f.name, note)
			if err != nil {
				r.fail("between %s: %s: %v", f.name, note, err)
			}
		}
		nf, err := r.c.FS.OpenFile(f.name, os.O_RDWR, 0)
		if err != nil {
			r.fail("reopen %s: %v", f.name, err)
		}
		f.f = nf
	case op < 89: // fsync (rarely: on a real disk it costs milliseconds)
		r.note("fsync %s", f.name)
		if err := f.f.Sync(); err != nil {
			r.fail("fsync %s: %v", f.name, err)
		}
	case op < 95: // mmap
		if !r.c.Mmap || size == 0 {
			return
		}
		r.mmap(f, size)
	default: // punch a hole
		if !r.c.Punch || size == 0 {
			return
		}
		off := r.r.Int64N(size)
		n := int64(r.length())
		r.note("punch %s off=%d len=%d", f.name, off, n)
		err := punchHole(int(f.f.(*os.File).Fd()), off, n)
		if err != nil {
			r.fail("punch %s at %d, %d bytes: %v", f.name, off, n, err)
		}
		end := min(off+n, size)
		clear(f.data[off:end])
	}
}

// checkRead compares what ReadAt gave (buf[:got], err) with the model's
// bytes, want. The only error a read may end with is the end of the file,
// and only when it returns less than asked: an error with the right count
// is still an error.
func checkRead(buf []byte, got int, err error, want []byte) string {
	if err != nil && (err != io.EOF || got == len(buf)) {
		return fmt.Sprintf("%d bytes and error %v", got, err)
	}
	if got != len(want) {
		return fmt.Sprintf("got %d bytes (%v), want %d", got, err, len(want))
	}
	if i := diff(buf[:got], want); i >= 0 {
		return fmt.Sprintf("byte %d is %#x, want %#x", i, buf[i], want[i])
	}
	return ""
}

func (r *runner) mmap(f *file, size int64) {
	m, err := unix.Mmap(int(f.f.(*os.File).Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		r.fail("mmap %s (%d bytes): %v", f.name, size, err)
	}
	defer unix.Munmap(m)
	off := r.r.Int64N(size)
	n := min(int64(r.length()), size-off)
	if r.r.IntN(2) == 0 {
		r.note("mmap read %s off=%d len=%d", f.name, off, n)
		if i := diff(m[off:off+n], f.data[off:off+n]); i >= 0 {
			r.fail("mmap read %s: byte at offset %d is %#x, want %#x", f.name, off+int64(i), m[off+int64(i)], f.data[off+int64(i)])
		}
		return
	}
	r.note("mmap write %s off=%d len=%d", f.name, off, n)
	buf := r.fill(int(n))
	copy(m[off:], buf)
	copy(f.data[off:], buf)
	if r.r.IntN(2) == 0 {
		if err := unix.Msync(m, unix.MS_SYNC); err != nil {
			r.fail("msync %s: %v", f.name, err)
		}
	}
}

func (r *runner) checkAll() {
	for _, f := range r.files {
		got, err := r.c.FS.ReadFile(f.name)
		if err != nil {
			r.fail("read whole %s: %v", f.name, err)
		}
		if len(got) != len(f.data) {
			r.fail("whole %s: %d bytes, want %d", f.name, len(got), len(f.data))
		}
		if i := diff(got, f.data); i >= 0 {
			r.fail("whole %s: byte at offset %d is %#x, want %#x", f.name, i, got[i], f.data[i])
		}
		if r.c.Check != nil {
			if err := r.c.Check(f.name, f.data); err != nil {
				r.fail("check %s: %v", f.name, err)
			}
		}
	}
}

func (f *file) write(off int64, b []byte) {
	if end := off + int64(len(b)); end > int64(len(f.data)) {
		f.truncate(end)
	}
	copy(f.data[off:], b)
}

func (f *file) truncate(n int64) {
	if n <= int64(len(f.data)) {
		f.data = f.data[:n]
		return
	}
	f.data = append(f.data, make([]byte, n-int64(len(f.data)))...)
}

func (f *file) slice(off int64, n int) []byte {
	if off >= int64(len(f.data)) {
		return nil
	}
	end := min(off+int64(n), int64(len(f.data)))
	return f.data[off:end]
}

// diff returns the first index where a and b differ, or -1.
func diff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
