package mounttest

import (
	"context"
	"sync/atomic"

	"cairnfs.dev/cairn/layer"
)

// IOCounter is a layer that changes nothing and counts the reads and writes
// of open files that reach it, with their bytes. Put under the layers of a
// stack, it shows what the kernel sent to the daemon instead of doing it
// itself (kernel passthrough).
type IOCounter struct {
	layer.Base
	Reads, Writes         atomic.Int64
	ReadBytes, WriteBytes atomic.Int64
}

// CountIO stacks an IOCounter over lower.
func CountIO(lower layer.FS) *IOCounter { return &IOCounter{Base: layer.Base{Lower: lower}} }

type countedFile struct {
	layer.BaseFile
	c *IOCounter
}

func (c *IOCounter) Open(ctx context.Context, p string, flags int) (layer.File, error) {
	f, err := c.Base.Open(ctx, p, flags)
	if err != nil {
		return nil, err
	}
	return &countedFile{layer.BaseFile{Lower: f}, c}, nil
}

func (c *IOCounter) Create(ctx context.Context, p string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	f, a, err := c.Base.Create(ctx, p, flags, mode)
	if err != nil {
		return nil, a, err
	}
	return &countedFile{layer.BaseFile{Lower: f}, c}, a, nil
}

func (f *countedFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	n, err := f.BaseFile.ReadAt(ctx, p, off)
	f.c.Reads.Add(1)
	f.c.ReadBytes.Add(int64(n))
	return n, err
}

func (f *countedFile) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	n, err := f.BaseFile.WriteAt(ctx, p, off)
	f.c.Writes.Add(1)
	f.c.WriteBytes.Add(int64(n))
	return n, err
}
