package layer_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// tagger records, as side data of each new file, the path it was
// created at: the smallest layer that keeps side data with layer.Meta.
type tagger struct{ layer.MetaBase }

func (t *tagger) Create(ctx context.Context, p string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	f, a, err := t.Lower.Create(ctx, p, flags, mode)
	if err == nil {
		err = t.Meta.Set(ctx, p, "born", []byte(p))
	}
	return f, a, err
}

// Side data kept with layer.Meta moves with renames, is shared by hard
// links, goes with the last unlink, does not keep a directory from being
// removed, and is hidden from users of the mount (listed, read, set or
// removed), through a real FUSE mount.
func TestMetaThroughMount(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	tg := &tagger{layer.MetaBase{Base: layer.Base{Lower: l}, Meta: layer.NewMeta(l, "tagger")}}
	m := mounttest.Mount(t, tg)
	ctx := context.Background()
	os.Mkdir(m.Path("d"), 0o755)
	if err := os.WriteFile(m.Path("d/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := tg.Meta.Prefix() + "born"
	if name != "trusted.cairn.tagger.born" {
		t.Errorf("the side data is kept as %s", name)
	}
	buf := make([]byte, 64)
	if n, err := unix.Lgetxattr(filepath.Join(lower, "d/f"), name, buf); err != nil || string(buf[:n]) != "d/f" {
		t.Fatalf("the lower file's %s: %q %v", name, buf[:max(n, 0)], err)
	}
	// Hidden from the mount's users.
	n, err := unix.Listxattr(m.Path("d/f"), buf)
	if err != nil || strings.Contains(string(buf[:n]), "cairn") {
		t.Errorf("listxattr through the mount: %q %v", buf[:max(n, 0)], err)
	}
	if _, err := unix.Getxattr(m.Path("d/f"), name, buf); err != layer.ENOATTR {
		t.Errorf("getxattr of the layer's value through the mount: %v, want ENODATA", err)
	}
	if err := unix.Setxattr(m.Path("d/f"), name, []byte("forged"), 0); err != unix.EPERM {
		t.Errorf("setxattr of the layer's value through the mount: %v, want EPERM", err)
	}
	if err := unix.Removexattr(m.Path("d/f"), name); err != unix.EPERM {
		t.Errorf("removexattr of the layer's value through the mount: %v, want EPERM", err)
	}
	if err := unix.Setxattr(m.Path("d/f"), "user.mine", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := unix.Listxattr(m.Path("d/f"), buf); string(buf[:n]) != "user.mine\x00" {
		t.Errorf("listxattr through the mount: %q, want only user.mine", buf[:n])
	}
	// Renames and hard links carry it.
	if err := os.Rename(m.Path("d/f"), m.Path("g")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(m.Path("g"), m.Path("d/h")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"g", "d/h"} {
		if v, err := tg.Meta.Get(ctx, p, "born"); err != nil || string(v) != "d/f" {
			t.Errorf("side data of %s: %q %v, want d/f", p, v, err)
		}
	}
	// A directory whose files had side data is removed like any other.
	if err := os.Remove(m.Path("d/h")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(m.Path("d")); err != nil {
		t.Errorf("rmdir: %v", err)
	}
	if err := tg.Meta.Remove(ctx, "g", "born"); err != nil {
		t.Fatal(err)
	}
	if _, err := tg.Meta.Get(ctx, "g", "born"); err != layer.ENOATTR {
		t.Errorf("side data after Remove: %v, want ENODATA", err)
	}
}
