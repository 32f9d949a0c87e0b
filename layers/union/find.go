package union

import (
	"context"
	"encoding/binary"
	"syscall"

	"cairn/layer"
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
func (u *FS) Handle(ctx context.Context, path string, id layer.ID) ([]byte, error) {
	o, err := u.resolve(ctx, path)
	if err != nil {
		return nil, err
	}
	i := o.top()
	a, err := u.b[i].FS.Getattr(layer.AsSelf(ctx), path)
	if err != nil {
		return nil, err
	}
	h, err := layer.Handle(ctx, u.b[i].FS, path, a.ID())
	if err != nil {
		return nil, err
	}
	return append(append([]byte{byte(i)}, encodeID(a.ID())...), h...), nil
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
