package fsx

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

// catcher stands for the test in a model run that must fail: it records
// the failure and ends the run's goroutine, as t.Fatalf would.
type catcher struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (c *catcher) Helper() {}
func (c *catcher) Fatalf(f string, a ...any) {
	c.mu.Lock()
	c.msg = fmt.Sprintf(f, a...)
	c.mu.Unlock()
	runtime.Goexit()
}
func (c *catcher) Failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.msg != ""
}

// mustFail runs fn with a catcher and returns the failure it reported; the
// test fails if there was none.
func mustFail(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	c := &catcher{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(c)
	}()
	<-done
	if c.msg == "" {
		t.Fatal("the model run passed over a planted bug")
	}
	t.Logf("caught: %s", strings.SplitN(c.msg, "\n", 2)[0])
	return c.msg
}

func TestCheckRead(t *testing.T) {
	buf := []byte("abcdefgh")
	for _, c := range []struct {
		got  int
		err  error
		want string
		ok   bool
	}{
		{8, nil, "abcdefgh", true},
		{3, io.EOF, "abc", true},
		{3, syscall.EIO, "abc", false}, // the count matches, but the read failed
		{8, io.EOF, "abcdefgh", false}, // EOF with a full read is not os.File's
		{3, io.EOF, "abcd", false},
		{4, nil, "abcX", false},
	} {
		msg := checkRead(buf, c.got, c.err, []byte(c.want))
		if (msg == "") != c.ok {
			t.Errorf("checkRead(%d, %v, %q) = %q, want ok=%v", c.got, c.err, c.want, msg, c.ok)
		}
	}
}

// TestRunOnExt4: the model agrees with a plain directory.
func TestRunOnExt4(t *testing.T) {
	Run(t, Config{Dir: t.TempDir(), Ops: 3000, Punch: true})
}

// buggy is a layer with one planted bug in its files.
type buggy struct {
	layer.Base
	bug string
}

type buggyFile struct {
	layer.BaseFile
	bug string
}

func (b *buggy) Open(ctx context.Context, p string, flags int) (layer.File, error) {
	f, err := b.Base.Open(ctx, p, flags)
	if err != nil {
		return nil, err
	}
	return &buggyFile{layer.BaseFile{Lower: f}, b.bug}, nil
}

func (b *buggy) Create(ctx context.Context, p string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	f, a, err := b.Base.Create(ctx, p, flags, mode)
	if err != nil {
		return nil, a, err
	}
	return &buggyFile{layer.BaseFile{Lower: f}, b.bug}, a, nil
}

func (f *buggyFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	n, err := f.BaseFile.ReadAt(ctx, p, off)
	if f.bug == "flip" && off <= 300000 && 300000 < off+int64(n) {
		p[300000-off] ^= 1
	}
	return n, err
}

func (f *buggyFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if f.bug == "small writes lost" && len(p) <= 16 {
		return len(p), nil
	}
	return f.BaseFile.WriteAt(ctx, p, off)
}

func (b *buggy) Rename(ctx context.Context, from, to string, flags uint32) error {
	if b.bug == "exchange ignored" {
		flags &^= 2 // RENAME_EXCHANGE
	}
	return b.Base.Rename(ctx, from, to, flags)
}

func buggyMount(t *testing.T, bug string) string {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fs := &buggy{layer.Base{Lower: l}, bug}
	t.Cleanup(func() { layer.CloseStack(fs) })
	// Without passthrough, every read and write reaches the layer.
	return mounttest.MountOpts(t, fs, fusefs.Options{AllowOther: true, NoPassthrough: true}).Dir
}

// TestRunCatchesPlantedBugs: the model fails on a flipped bit and on lost
// writes, through a mount.
func TestRunCatchesPlantedBugs(t *testing.T) {
	for _, bug := range []string{"flip", "small writes lost"} {
		t.Run(bug, func(t *testing.T) {
			dir := buggyMount(t, bug)
			mustFail(t, func(tb testing.TB) { Run(tb, Config{Dir: dir, Ops: 5000, Seed: 1}) })
		})
	}
}

// TestTreeOnExt4: two plain directories agree (the model itself is
// deterministic).
func TestTreeOnExt4(t *testing.T) {
	RunTree(t, TreeConfig{Dir: t.TempDir(), Ops: 1000})
}

// TestTreeCatchesPlantedBug: a rename that ignores RENAME_EXCHANGE is
// caught.
func TestTreeCatchesPlantedBug(t *testing.T) {
	dir := buggyMount(t, "exchange ignored")
	msg := mustFail(t, func(tb testing.TB) { RunTree(tb, TreeConfig{Dir: dir, Ops: 2000, Seed: 1}) })
	if !strings.Contains(msg, "flags 2") && !strings.Contains(msg, "trees differ") {
		t.Fatalf("caught something else: %s", msg)
	}
}

// TestTreeThroughStacks runs the namespace model through a null stack and
// a stack that changes data (zstd), with concurrent workers.
func TestTreeThroughStacks(t *testing.T) {
	for _, name := range []string{"null", "zstd"} {
		t.Run(name, func(t *testing.T) {
			l, err := local.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			var fs layer.FS = null.New(l)
			if name == "zstd" {
				if fs, err = codec.New(l, "zstd", codec.Options{Level: 1}); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { layer.CloseStack(fs) })
			m := mounttest.Mount(t, fs)
			RunTree(t, TreeConfig{Dir: m.Dir, Ops: treeOps(), Workers: 3})
		})
	}
}

func treeOps() int {
	if os.Getenv("CAIRN_LONG") != "" {
		return 20000
	}
	return 2000
}
