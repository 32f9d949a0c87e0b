package fusefs_test

import (
	"context"
	"os"
	"sync/atomic"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// keepLayer changes data (no passthrough) and counts the reads that reach
// it; its files may offer CapKeepCache.
type keepLayer struct {
	layer.Base
	keep  bool
	reads atomic.Int64
}

func (d *keepLayer) Changes() layer.Changes { return layer.ChangesData }
func (d *keepLayer) Open(ctx context.Context, path string, flags int) (layer.File, error) {
	f, err := d.Lower.Open(ctx, path, flags)
	if err != nil {
		return nil, err
	}
	return &keepFile{BaseFile: layer.BaseFile{Lower: f}, d: d}, nil
}

type keepFile struct {
	layer.BaseFile
	d *keepLayer
}

func (f *keepFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	f.d.reads.Add(1)
	return f.Lower.ReadAt(ctx, p, off)
}
func (f *keepFile) PassthroughFd() (int, bool) { return -1, false }
func (f *keepFile) Caps() layer.Caps {
	if f.d.keep {
		return layer.CapKeepCache
	}
	return 0
}

// TestKeepCache: a file that offers CapKeepCache is read through the stack once
// for several opens; one that does not, after every open.
func TestKeepCache(t *testing.T) {
	for _, keep := range []bool{false, true} {
		dir := t.TempDir()
		os.WriteFile(dir+"/f", make([]byte, 8192), 0o644)
		l, err := local.New(dir)
		if err != nil {
			t.Fatal(err)
		}
		d := &keepLayer{Base: layer.Base{Lower: l}, keep: keep}
		m := mounttest.Mount(t, d)
		for i := 0; i < 3; i++ {
			if b, err := os.ReadFile(m.Path("f")); err != nil || len(b) != 8192 {
				t.Fatalf("read: %d %v", len(b), err)
			}
		}
		n := d.reads.Load()
		if keep && n > 2 || !keep && n < 3 {
			t.Errorf("KeepCache %v: %d reads reached the layer for 3 opens", keep, n)
		}
		m.Unmount()
		l.Close()
	}
}
