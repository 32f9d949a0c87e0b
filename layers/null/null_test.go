package null_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

func stack(t *testing.T) (string, layer.FS) {
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	top := null.New(l)
	t.Cleanup(func() { layer.CloseStack(top) })
	return lower, top
}

func TestInProcess(t *testing.T) {
	lower, fs := stack(t)
	ctx := context.Background()
	if err := layer.MkdirAll(ctx, fs, "a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := layer.WriteFile(ctx, fs, "a/b/f", []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := layer.ReadFile(ctx, fs, "a/b/f")
	if err != nil || string(got) != "hello" {
		t.Fatalf("read back %q, %v", got, err)
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "a/b/f")); string(b) != "hello" {
		t.Fatalf("lower holds %q", b)
	}
	ents, err := fs.ReadDir(ctx, "a/b", true)
	if err != nil || len(ents) != 1 || ents[0].Name != "f" || ents[0].Attr == nil || ents[0].Attr.Size != 5 {
		t.Fatalf("readdir: %+v, %v", ents, err)
	}
	if layer.StackChanges(fs) != 0 {
		t.Fatalf("null stack declares changes: %v", layer.StackChanges(fs))
	}
}

// TestFsxThroughMount runs the model through a null stack, which uses
// passthrough: no read or write of the model reaches the daemon (counted
// under the null layer), and the lower files hold the model's bytes.
func TestFsxThroughMount(t *testing.T) {
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	c := mounttest.CountIO(l)
	fs := null.New(c)
	t.Cleanup(func() { layer.CloseStack(fs) })
	m := mounttest.Mount(t, fs)
	if !m.Server.Passthrough {
		t.Fatal("a null stack must use passthrough")
	}
	defer func() {
		if n, w := c.Reads.Load(), c.Writes.Load(); n != 0 || w != 0 {
			t.Errorf("passthrough on, but %d reads and %d writes reached the daemon", n, w)
		}
	}()
	fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: 20000, Punch: true,
		Check: func(name string, want []byte) error {
			got, err := os.ReadFile(filepath.Join(lower, name))
			if err != nil {
				return err
			}
			if !bytes.Equal(got, want) {
				return os.ErrInvalid
			}
			return nil
		}})
}

func TestFsxNoPassthrough(t *testing.T) {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := mounttest.CountIO(l)
	fs := null.New(c)
	t.Cleanup(func() { layer.CloseStack(fs) })
	m := mounttest.MountOpts(t, fs, mountOpts(true))
	fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: 10000, Punch: true})
	// The counter sees I/O when there is some to see.
	if c.Reads.Load() == 0 || c.Writes.Load() == 0 {
		t.Fatalf("passthrough off, but %d reads and %d writes reached the daemon", c.Reads.Load(), c.Writes.Load())
	}
}

// TestFsxMmapProcess runs the model with mmap against a mount served by a
// cairn process, with and without passthrough.
func TestFsxMmapProcess(t *testing.T) {
	for _, extra := range [][]string{nil, {"--no-passthrough"}} {
		lower := t.TempDir()
		p := mounttest.MountSpec(t, "mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = \""+lower+"\"\n[layer.top]\ntype = \"null\"\nover = \"base\"\n", extra...)
		fsx.Run(t, fsx.Config{Dir: p.Dir, Ops: 5000, Mmap: true, Punch: true})
		p.Unmount()
	}
}
