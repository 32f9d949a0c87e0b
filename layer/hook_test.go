package layer_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// recorder is a Hook that notes every operation and refuses those named in
// refuse.
type recorder struct {
	layer.Hooked
	ops    []string
	refuse string
}

func (r *recorder) Before(ctx context.Context, op *layer.Op) error {
	if op.Name == r.refuse {
		return syscall.EACCES
	}
	return nil
}

func (r *recorder) After(ctx context.Context, op *layer.Op) {
	s := op.Name + ":" + op.Path
	if op.Path2 != "" {
		s += ">" + op.Path2
	}
	if op.Err != nil {
		s += "!" + layer.Errno(op.Err).Error()
	}
	if op.Bytes != 0 && (op.Name == "read" || op.Name == "write") {
		s += "#" + string(rune('0'+op.Bytes))
	}
	if op.Opener != nil && op.Opener.Pid != uint32(os.Getpid()) {
		s += "?opener"
	}
	r.ops = append(r.ops, s)
}

func newRecorder(t *testing.T) (string, *recorder) {
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	r.Lower, r.Hook = l, r
	return lower, r
}

func TestHookedSeesEveryOperation(t *testing.T) {
	lower, r := newRecorder(t)
	ctx := context.Background()
	r.Mkdir(ctx, "d", 0o755)
	f, _, err := r.Create(ctx, "d/f", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(ctx, []byte("abc"), 0)
	f.ReadAt(ctx, make([]byte, 2), 0)
	f.Getattr(ctx)
	f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o600})
	f.Allocate(ctx, 0, 8, 0)
	f.Lseek(ctx, 0, unix.SEEK_DATA)
	f.Fsync(ctx, false)
	f.Flush(ctx)
	f.Release(ctx)
	g, err := r.Open(ctx, "d/f", unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Setlk(ctx, 1, &layer.Lock{Start: 0, End: 9, Type: unix.F_WRLCK}, 0, false); err != nil {
		t.Fatal(err)
	}
	if l, err := g.Getlk(ctx, 1, &layer.Lock{Start: 0, End: 9, Type: unix.F_WRLCK}, 0); err != nil || l.Type != unix.F_UNLCK {
		t.Fatalf("getlk of the file's own lock: %+v %v", l, err)
	}
	c, _, err := r.Create(ctx, "d/c", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := g.CopyFileRange(ctx, 0, c, 0, 3, 0); n != 3 || err != nil {
		t.Fatalf("copy_file_range: %d %v", n, err)
	}
	c.Release(ctx)
	g.Release(ctx)
	r.Unlink(ctx, "d/c")
	r.Getattr(ctx, "d/f")
	r.Setattr(ctx, "d/f", &layer.SetAttr{Valid: layer.SetMode, Mode: 0o644})
	r.Symlink(ctx, "f", "d/l")
	r.Readlink(ctx, "d/l")
	r.Link(ctx, "d/f", "d/h")
	r.Rename(ctx, "d/h", "d/i", 0)
	r.Setxattr(ctx, "d/f", "user.x", []byte("v"), 0)
	r.Getxattr(ctx, "d/f", "user.x", make([]byte, 8))
	r.Listxattr(ctx, "d/f", make([]byte, 64))
	r.Removexattr(ctx, "d/f", "user.x")
	r.ReadDir(ctx, "d", true)
	r.Statfs(ctx, "")
	r.SyncDir(ctx, "d")
	r.Mknod(ctx, "d/p", unix.S_IFIFO|0o644, 0)
	r.Unlink(ctx, "d/p")
	tf, _, err := r.Tmpfile(ctx, "d", unix.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	tf.WriteAt(ctx, []byte("t"), 0)
	if _, err := r.LinkFile(ctx, tf, "d/t"); err != nil {
		t.Fatal(err)
	}
	tf.Fsync(ctx, false) // the file's path is its new name
	tf.Release(ctx)
	r.Unlink(ctx, "d/t")
	fl, err := r.GetFlags(ctx, "d/f")
	if err != nil {
		t.Fatal(err)
	}
	r.SetFlags(ctx, "d/f", fl)
	r.refuse = "unlink"
	if err := r.Unlink(ctx, "d/i"); err != syscall.EACCES {
		t.Fatalf("refused unlink returned %v", err)
	}
	if _, err := os.Stat(filepath.Join(lower, "d/i")); err != nil {
		t.Fatalf("a refused unlink reached the lower layer: %v", err)
	}
	r.Rmdir(ctx, "d")
	got := strings.Join(r.ops, " ")
	want := "mkdir:d create:d/f write:d/f#3 read:d/f#2 fgetattr:d/f fsetattr:d/f fallocate:d/f lseek:d/f fsync:d/f " +
		"flush:d/f release:d/f open:d/f setlk:d/f getlk:d/f create:d/c copy_file_range:d/f>d/c release:d/c release:d/f unlink:d/c getattr:d/f setattr:d/f symlink:d/l>f readlink:d/l link:d/f>d/h rename:d/h>d/i " +
		"setxattr:d/f>user.x getxattr:d/f>user.x listxattr:d/f removexattr:d/f>user.x readdir:d statfs: syncdir:d " +
		"mknod:d/p unlink:d/p tmpfile:d write:d#1 link:d>d/t fsync:d/t release:d/t unlink:d/t getflags:d/f setflags:d/f " +
		"unlink:d/i!permission denied rmdir:d!directory not empty"
	if got != want {
		t.Fatalf("operations seen:\n%s\nwant:\n%s", got, want)
	}
	// Every operation a hook can see was called here.
	seen := map[string]bool{}
	for _, o := range r.ops {
		seen[strings.FieldsFunc(o, func(c rune) bool { return c == ':' })[0]] = true
	}
	for _, n := range layer.OpNames {
		if !seen[n] {
			t.Errorf("the test never calls %s", n)
		}
	}
}

func TestHookedPassthrough(t *testing.T) {
	_, r := newRecorder(t)
	ctx := context.Background()
	f, _, err := r.Create(ctx, "f", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	if _, ok := f.PassthroughFd(); !ok {
		t.Fatal("a hooked file refuses passthrough by default")
	}
	if f.Caps()&layer.CapPassthrough == 0 {
		t.Fatalf("a hooked file over a local one has caps %v", f.Caps())
	}
	r.NoPassthrough = true
	if _, ok := f.PassthroughFd(); ok {
		t.Fatal("NoPassthrough is ignored")
	}
	if f.Caps()&layer.CapPassthrough != 0 {
		t.Fatal("NoPassthrough leaves CapPassthrough")
	}
}

// TestHookedFlushes: a hooked file forwards CapNoFlush (a read-only local
// file's), unless the hook must see every flush (Hooked.Flushes).
func TestHookedFlushes(t *testing.T) {
	_, r := newRecorder(t)
	ctx := context.Background()
	f, _, err := r.Create(ctx, "f", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Release(ctx)
	if f, err = r.Open(ctx, "f", unix.O_RDONLY); err != nil {
		t.Fatal(err)
	}
	defer f.Release(ctx)
	if f.Caps()&layer.CapNoFlush == 0 {
		t.Fatalf("a hooked read-only file over a local one needs flushes (caps %v)", f.Caps())
	}
	r.Flushes = true
	if f.Caps()&layer.CapNoFlush != 0 {
		t.Fatal("Flushes leaves CapNoFlush")
	}
}

// TestHookedFollowsRenames: operations on an open file carry its path after
// renames of it or of a directory above it.
func TestHookedFollowsRenames(t *testing.T) {
	_, r := newRecorder(t)
	ctx := context.Background()
	r.Mkdir(ctx, "d", 0o755)
	f, _, err := r.Create(ctx, "d/f", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	g, _, _ := r.Create(ctx, "g", unix.O_RDWR, 0o644)
	r.Rename(ctx, "d", "e", 0)
	r.Rename(ctx, "e/f", "e/h", 0)
	r.Rename(ctx, "e/h", "g", layer.RenameExchange)
	r.ops = nil
	f.Fsync(ctx, false)
	g.Fsync(ctx, false)
	f.Release(ctx)
	g.Release(ctx)
	if got := strings.Join(r.ops, " "); got != "fsync:g fsync:e/h release:g release:e/h" {
		t.Fatalf("after renames: %s", got)
	}
}

func TestHookedCopyFileRange(t *testing.T) {
	lower, r := newRecorder(t)
	ctx := context.Background()
	f, _, _ := r.Create(ctx, "a", unix.O_RDWR, 0o644)
	g, _, _ := r.Create(ctx, "b", unix.O_RDWR, 0o644)
	f.WriteAt(ctx, []byte("hello"), 0)
	r.ops = nil
	n, err := f.CopyFileRange(ctx, 0, g, 0, 5, 0)
	if err != nil || n != 5 {
		t.Fatalf("copy_file_range: %d, %v", n, err)
	}
	f.Release(ctx)
	g.Release(ctx)
	if b, _ := os.ReadFile(filepath.Join(lower, "b")); string(b) != "hello" {
		t.Fatalf("lower b: %q", b)
	}
	if r.ops[0] != "copy_file_range:a>b" {
		t.Fatalf("seen: %v", r.ops)
	}
}
