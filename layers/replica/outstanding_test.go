//go:build linux

package replica_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/replica"
)

// openCounter counts the opens that reach a replica.
type openCounter struct {
	layer.Base
	opens atomic.Int64
}

func (c *openCounter) Open(ctx context.Context, p string, flags int) (layer.File, error) {
	c.opens.Add(1)
	return c.Base.Open(ctx, p, flags)
}

// TestLeastOutstandingSpreadsPassthrough: files passed through to the
// kernel send no requests the layer could count, so each open one counts
// as one in flight on its replica: four large files held open at once by
// four readers are spread over the two replicas, not all put on the first.
func TestLeastOutstandingSpreadsPassthrough(t *testing.T) {
	dirs := lowers(t, 2)
	big := bytes.Repeat([]byte("large file "), 20000)
	for _, d := range dirs {
		for i := range 4 {
			os.WriteFile(filepath.Join(d, fmt.Sprintf("b%d", i)), big, 0o644)
		}
	}
	var cs []*openCounter
	var ls []layer.FS
	for _, d := range dirs {
		c := &openCounter{Base: layer.Base{Lower: localFS(t, d)}}
		cs = append(cs, c)
		ls = append(ls, c)
	}
	r := build(t, replica.Options{Policy: replica.LeastOutstanding, BalanceSize: 64 << 10}, ls...)
	m := mounttest.Mount(t, r)
	before := cs[1].opens.Load()
	var held []*os.File
	for i := range 4 {
		f, err := os.Open(m.Path(fmt.Sprintf("b%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, f)
		b := make([]byte, len(big))
		if n, err := f.ReadAt(b, 0); n != len(big) || !bytes.Equal(b, big) {
			t.Fatalf("b%d: read %d bytes, %v", i, n, err)
		}
	}
	if n := cs[1].opens.Load() - before; n != 2 {
		t.Errorf("4 files held open under least-outstanding: %d opened on replica 2, want 2", n)
	}
	for _, f := range held {
		f.Close()
	}
}
