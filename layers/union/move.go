package union

import (
	"context"
	"errors"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
)

// With moveonenospc (mergerfs's), a file open for writing on a branch that
// fills up moves, with what it holds, to the RW branch with the most free
// space where its name stays seen, and the write is tried again there. Such
// a file is not passed through to the kernel: its writes must reach the
// union to see ENOSPC.

// movable is an open file that may move to another branch.
type movable struct {
	u     *FS
	path  string
	flags int

	mu    sync.RWMutex
	lower layer.File
	i     int
	id    *shown
}

var _ layer.File = (*movable)(nil)

func (m *movable) cur() (layer.File, int, *shown) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.lower, m.i, m.id
}

func full(err error) bool { return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) }

func (m *movable) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	l, i, _ := m.cur()
	n, err := l.WriteAt(ctx, p, off)
	if !full(err) || m.move(ctx, i) != nil {
		return n, err
	}
	l, _, _ = m.cur()
	k, err := l.WriteAt(ctx, p[n:], off+int64(n))
	return n + k, err
}

func (m *movable) Allocate(ctx context.Context, off, length int64, mode uint32) error {
	l, i, _ := m.cur()
	err := l.Allocate(ctx, off, length, mode)
	if !full(err) || m.move(ctx, i) != nil {
		return err
	}
	l, _, _ = m.cur()
	return l.Allocate(ctx, off, length, mode)
}

// move moves the file from branch i (if it is still there) to another.
func (m *movable) move(ctx context.Context, i int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.i != i {
		return nil // another write moved it
	}
	u, self := m.u, layer.AsSelf(ctx)
	defer u.change()()
	src := u.b[i].FS
	la, err := m.lower.Getattr(ctx)
	if err != nil {
		return err
	}
	// The name must still be this file's.
	if a, err := src.Getattr(self, m.path); err != nil || a.Dev != la.Dev || a.Ino != la.Ino {
		return syscall.ENOSPC
	}
	j, err := u.moveTarget(ctx, m.path, i)
	if err != nil {
		return err
	}
	dir, _ := layer.Split(m.path)
	if err := u.ensureDir(ctx, j, dir); err != nil {
		return err
	}
	dst := u.b[j].FS
	tmp := u.tmpName(m.path)
	err = copyData(self, src, dst, m.path, tmp, &la)
	if err == nil {
		err = copyMeta(self, src, dst, m.path, tmp, &la)
	}
	if err == nil {
		if v, gerr := u.meta[i].Get(self, m.path, "origin"); gerr == nil {
			u.markImpure(ctx, j, dir)
			err = u.meta[j].Set(self, tmp, "origin", v)
		}
	}
	if err == nil {
		err = dst.Rename(self, tmp, m.path, 0)
	}
	if err != nil {
		u.remove(ctx, j, tmp)
		return err
	}
	nf, err := dst.Open(ctx, m.path, m.flags&^(unix.O_TRUNC|unix.O_CREAT|unix.O_EXCL))
	if err != nil {
		return err
	}
	if err := src.Unlink(self, m.path); err != nil {
		u.log.Warn("union: a moved file stays on its full branch too", "path", m.path, "branch", i+1, "err", err)
	}
	u.log.Info("union: a file moved to a branch with room", "path", m.path, "from branch", i+1, "to branch", j+1)
	old := m.lower
	m.lower, m.i = nf, j
	old.Release(ctx)
	return nil
}

// moveTarget chooses the branch a file on full branch i moves to: the RW
// branch with the most free space where its name will be seen once it is
// gone from i.
func (u *FS) moveTarget(ctx context.Context, path string, i int) (int, error) {
	dir, _ := layer.Split(path)
	br, err := u.dirBranches(ctx, dir)
	if err != nil {
		return -1, err
	}
	last := br[len(br)-1]
	cand := make([]fanout.Branch, len(u.b))
	copy(cand, u.b)
	for j := range cand {
		seen := j < i
		if j > i && j <= last {
			seen = true
			for _, k := range br {
				if k > i && k < j {
					if _, err := u.b[k].FS.Getattr(ctx, path); !notFound(err) {
						seen = false // a whiteout or an object hides j
					}
				}
			}
		}
		if !seen || cand[j].Mode != fanout.RW {
			cand[j].Mode = fanout.RO
		}
	}
	return fanout.Policies["mfs"].Create(ctx, cand, path)
}

func (m *movable) tag(a *layer.Attr) {
	_, i, id := m.cur()
	layer.TagBranch(a, i, len(m.u.b))
	if id != nil {
		m.u.showOpen(i, id)(a)
	}
}

func (m *movable) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	l, _, _ := m.cur()
	return l.ReadAt(ctx, p, off)
}

func (m *movable) Getattr(ctx context.Context) (layer.Attr, error) {
	l, _, _ := m.cur()
	a, err := l.Getattr(ctx)
	m.tag(&a)
	return a, err
}

func (m *movable) Setattr(ctx context.Context, in *layer.SetAttr) (layer.Attr, error) {
	l, _, _ := m.cur()
	a, err := l.Setattr(ctx, in)
	m.tag(&a)
	return a, err
}

func (m *movable) Flush(ctx context.Context) error {
	l, _, _ := m.cur()
	return l.Flush(ctx)
}

func (m *movable) Fsync(ctx context.Context, datasync bool) error {
	l, _, _ := m.cur()
	return l.Fsync(ctx, datasync)
}

func (m *movable) Release(ctx context.Context) error {
	l, _, _ := m.cur()
	return l.Release(ctx)
}

func (m *movable) Lseek(ctx context.Context, off int64, whence int) (int64, error) {
	l, _, _ := m.cur()
	return l.Lseek(ctx, off, whence)
}

func (m *movable) Unwrap() layer.File {
	l, _, _ := m.cur()
	return l
}

func (m *movable) CopyFileRange(ctx context.Context, offIn int64, dst layer.File, offOut int64, n int64, flags uint32) (int64, error) {
	u, ok := dst.(layer.Unwrapper)
	if !ok {
		return 0, syscall.EXDEV
	}
	l, _, _ := m.cur()
	return l.CopyFileRange(ctx, offIn, u.Unwrap(), offOut, n, flags)
}

func (m *movable) Getlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32) (layer.Lock, error) {
	l, _, _ := m.cur()
	return l.Getlk(ctx, owner, lk, flags)
}

func (m *movable) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, flags uint32, wait bool) error {
	l, _, _ := m.cur()
	return l.Setlk(ctx, owner, lk, flags, wait)
}

func (m *movable) PassthroughFd() (int, bool) { return -1, false }

// TouchAtime: the lower file's atime is the file's.
func (m *movable) TouchAtime(ctx context.Context) bool {
	l, _, _ := m.cur()
	return layer.TouchAtime(ctx, l)
}

// Caps: the lower's, without passthrough (writes must reach the union).
func (m *movable) Caps() layer.Caps {
	l, _, _ := m.cur()
	return l.Caps() &^ layer.CapPassthrough
}
