package replica

import (
	"context"
	"encoding/json"

	"cairnfs.dev/cairn/layer"
)

// The kernel keeps one I/O mode per inode (fs/fuse/iomode.c): while a file
// of it is passed through, every other open of it must be passed through
// too, to the same backing file, and while one is open through the page
// cache none may be passed through; an open that breaks this fails with
// EIO. A replica passes through read-only files, one replica's each, and
// serves files opened to write itself (they are several files). So the
// layer counts the open files of each object: a read-only open goes to the
// replica that already backs the object's passed-through files, and is not
// passed through while the object is open to write through the layer. An
// open to write while the object's read-only files are passed through is
// passed through too, to their replica (the kernel then writes that
// replica's file alone), under a write-intent mark (intend), and its bytes
// are copied to the other replicas at its fsync and last close (copyOut).

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

// writeOpen says whether an open to write must be passed through, and to
// which replica (-1: not), as the object's read-only files are.
func (fs *FS) writeOpen(id layer.ID) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if o := fs.opens[id]; o != nil && o.ptN > 0 {
		return o.pt
	}
	return -1
}

// intend records, before a file opened to write is passed through to
// replica pt (whose bytes the kernel then changes alone, until the file is
// released and copied to the others: file.copyOut), that the other replicas
// may be behind on path: a dirty mark on pt (with the directories above
// it) and a newer state generation on pt alone. After a crash, the others
// are behind by generation, and resync copies the marked file from pt.
func (fs *FS) intend(ctx context.Context, pt int, path string) error {
	ctx = layer.AsSelf(ctx)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	bits := uint32(1<<len(fs.r)-1) &^ fs.degraded.Load() &^ (1 << pt)
	for p := path; ; p = parent(p) {
		if err := fs.setMark(ctx, pt, p, fs.getMark(ctx, pt, p)|bits); err != nil {
			return err
		}
		if p == "" {
			break
		}
	}
	w := fs.ptw[path]
	fs.ptw[path] = ptwMark{bits: w.bits | bits, pt: pt}
	fs.ptwN++
	if fs.state.Set != "" && fs.ptwN == 1 {
		fs.state.Gen++
		v, _ := json.Marshal(fs.state)
		return fs.meta[pt].Set(ctx, "", keyState, v)
	}
	return nil
}

// intended ends an intend: when no file is passed through to write any
// more (each copied out), the marks it made for replicas still healthy
// are cleared and every replica gets the same generation again.
func (fs *FS) intended(ctx context.Context) {
	ctx = layer.AsSelf(ctx)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.ptwN--; fs.ptwN > 0 {
		return
	}
	healthy := uint32(1<<len(fs.r)-1) &^ fs.degraded.Load()
	for path, w := range fs.ptw {
		bits := w.bits & healthy
		for p := path; ; p = parent(p) {
			for i := range fs.r {
				if m := fs.getMark(ctx, i, p); m&bits != 0 {
					fs.setMark(ctx, i, p, m&^bits)
				}
			}
			if p == "" {
				break
			}
		}
	}
	clear(fs.ptw)
	fs.saveState(ctx)
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
		// Its reads go from the kernel to the replica, unseen: the open
		// file stands for them in least-outstanding's count.
		f.busy = f.rd + 1
		fs.outstanding[f.rd].Add(1)
	} else {
		o.cached++
	}
}

func (fs *FS) closed(f *file) {
	unlock := fs.lockID(f.id)
	defer unlock()
	fs.mu.Lock()
	if o := fs.opens[f.id]; o != nil {
		if f.pt {
			o.ptN--
		} else {
			o.cached--
		}
		if o.ptN <= 0 && o.cached <= 0 {
			delete(fs.opens, f.id)
		}
	}
	fs.mu.Unlock()
	if f.busy > 0 {
		fs.outstanding[f.busy-1].Add(-1)
		f.busy = 0
	}
	if f.ptw {
		fs.intended(context.Background())
	}
}

// ptwMark is a path under write-intent: the replicas that may be behind,
// and the one the kernel writes.
type ptwMark struct {
	bits uint32
	pt   int
}

// writing says which replica holds the newest bytes of path while a file
// of it is passed through to write (-1: none; the primary's are right).
func (fs *FS) writing(path string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.ptw) == 0 {
		return -1
	}
	if w, ok := fs.ptw[path]; ok {
		return w.pt
	}
	return -1
}
