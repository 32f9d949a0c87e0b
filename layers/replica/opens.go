package replica

import (
	"syscall"

	"cairn/layer"
)

// The kernel keeps one I/O mode per inode (fs/fuse/iomode.c): while a file
// of it is passed through, every other open of it must be passed through
// too, to the same backing file, and while one is open through the page
// cache none may be passed through; an open that breaks this fails with EIO.
// A replica passes through read-only files, one replica's each, and serves
// files opened to write itself (they are several files). So the layer
// counts the open files of each object: a read-only open goes to the
// replica that already backs the object's passed-through files; it is not
// passed through while the object is open to write; and an open to write
// while the object's read-only files are passed through is refused with
// ETXTBSY (the kernel would refuse it with EIO), which mount option
// passthrough = false avoids (docs/replica.md).

// opens are the open files of one object.
type opens struct {
	pt     int // the replica backing the passed-through files
	ptN    int // files passed through
	cached int // files not passed through
}

// lockID serializes the opens and releases of one object.
func (fs *FS) lockID(id layer.ID) func() {
	m := &fs.idMu[(id.Ino^id.Dev^id.Branch)%uint64(len(fs.idMu))]
	m.Lock()
	return m.Unlock
}

// readOpen says where a read-only open of id goes (-1: where the policy
// says) and whether it may be passed through.
func (fs *FS) readOpen(id layer.ID) (int, bool, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	o := fs.opens[id]
	switch {
	case fs.o.NoPassthrough || o != nil && o.cached > 0:
		return -1, false, nil
	case o != nil && o.ptN > 0:
		return o.pt, true, nil
	}
	return -1, true, nil
}

// writeOpen refuses an open to write while the object's files are passed
// through.
func (fs *FS) writeOpen(id layer.ID) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if o := fs.opens[id]; o != nil && o.ptN > 0 {
		return syscall.ETXTBSY
	}
	return nil
}

func (fs *FS) opened(f *file) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	o := fs.opens[f.id]
	if o == nil {
		o = &opens{}
		fs.opens[f.id] = o
	}
	if f.pt {
		o.pt = f.rd
		o.ptN++
	} else {
		o.cached++
	}
}

func (fs *FS) closed(f *file) {
	unlock := fs.lockID(f.id)
	defer unlock()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	o := fs.opens[f.id]
	if o == nil {
		return
	}
	if f.pt {
		o.ptN--
	} else {
		o.cached--
	}
	if o.ptN <= 0 && o.cached <= 0 {
		delete(fs.opens, f.id)
	}
}
