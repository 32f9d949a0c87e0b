package union

import (
	"context"
	"encoding/binary"
	"syscall"

	"cairnfs.dev/cairn/layer"
)

// File handles (layer.Finder): a handle of the union names the branch the
// object lives on, its identity there and that branch's own handle; the
// branch finds it, and the union checks that the name it gives still shows
// that object (not a whiteout, not another branch's object before it).

// CanFind: the union finds what all its branches can find.
func (u *FS) CanFind() bool {
	for _, b := range u.b {
		if !layer.CanFind(b.FS) {
			return false
		}
	}
	return true
}

// Handle is the branch's index, the object's identity on it, and the
// branch's handle.
// What is known of the name, if it shows id, is enough (the kernel asks
// for the handle of every name it is given, and most were just looked up
// or made): the branch is not asked.
func (u *FS) Handle(ctx context.Context, path string, id layer.ID) ([]byte, error) {
	i, lid, ok := u.knownID(path, id)
	if !ok {
		o, err := u.resolve(ctx, path)
		if err != nil {
			return nil, err
		}
		i, lid = o.top(), o.lid
	}
	h, err := layer.Handle(ctx, u.b[i].FS, path, lid)
	if err != nil {
		return nil, err
	}
	return append(append([]byte{byte(i)}, encodeID(lid)...), h...), nil
}

// knownID is the branch and the identity there of path, if what is known
// of it shows id.
func (u *FS) knownID(path string, id layer.ID) (int, layer.ID, bool) {
	u.kmu.Lock()
	k, ok := u.knownNow(path)
	u.kmu.Unlock()
	if !ok || k.br == nil {
		return -1, layer.ID{}, false
	}
	a := layer.Attr{}
	setID(&a, k.lid)
	if k.id != nil {
		setID(&a, k.id.id)
	} else {
		layer.TagBranch(&a, k.br[0], len(u.b))
	}
	return k.br[0], k.lid, a.ID() == id
}

// Find asks the branch, and checks that the union shows the object there.
func (u *FS) Find(ctx context.Context, id layer.ID, h []byte) (string, error) {
	if len(h) < 33 || int(h[0]) >= len(u.b) {
		return "", syscall.ESTALE
	}
	i, be := int(h[0]), binary.BigEndian
	lid := layer.ID{Dev: be.Uint64(h[1:]), Branch: be.Uint64(h[9:]), Ino: be.Uint64(h[17:]), Gen: be.Uint64(h[25:])}
	var lh []byte
	if len(h) > 33 {
		lh = h[33:]
	}
	path, err := layer.Find(ctx, u.b[i].FS, lid, lh)
	if err != nil {
		return "", err
	}
	o, err := u.resolve(ctx, path)
	if err != nil {
		return "", syscall.ESTALE
	}
	if a := o.a; a.Dev != id.Dev || a.Branch != id.Branch || a.Ino != id.Ino || id.Gen != 0 && a.Gen != id.Gen {
		return "", syscall.ESTALE
	}
	return path, nil
}
