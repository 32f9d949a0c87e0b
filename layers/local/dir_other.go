//go:build !linux

package local

import (
	"context"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// dir lists a directory as it was when opened: the names are read at once
// (no getdents64 with lseek-able cookies off Linux) and each is stat'ed, so
// a cookie is an index in that list, stable for the open directory. It holds
// no descriptor between calls.
type dir struct {
	ents []layer.DirEntry
	i    int
}

var _ layer.DirOpener = (*FS)(nil)

// OpenDir opens path's listing (layer.DirOpener).
func (fs *FS) OpenDir(ctx context.Context, path string) (layer.Dir, error) {
	fd, err := fs.openIn(path, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	d := &dir{}
	for _, n := range names {
		a, err := fs.lstatAt(int(f.Fd()), n)
		if err != nil {
			continue // gone meanwhile
		}
		d.ents = append(d.ents, layer.DirEntry{Name: n, Ino: a.Ino, Mode: a.Mode & unix.S_IFMT, Attr: &a})
	}
	return d, nil
}

func (d *dir) Next(ctx context.Context, plus bool) (layer.DirEntry, uint64, error) {
	if d.i >= len(d.ents) {
		return layer.DirEntry{}, 0, io.EOF
	}
	e := d.ents[d.i]
	d.i++
	if !plus {
		e.Attr = nil
	}
	return e, uint64(d.i), nil
}

func (d *dir) Seek(ctx context.Context, off uint64) error {
	d.i = int(min(off, uint64(len(d.ents))))
	return nil
}

func (d *dir) Close() error { return nil }
