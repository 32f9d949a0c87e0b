package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/layer"
)

func newFS(t *testing.T) (*FS, string) {
	t.Helper()
	root := t.TempDir()
	fs, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	return fs, root
}

func TestInProcessBasics(t *testing.T) {
	fs, root := newFS(t)
	ctx := context.Background()
	if _, err := fs.Mkdir(ctx, "d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := layer.WriteFile(ctx, fs, "d/f", []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := fs.Getattr(ctx, "d/f")
	if err != nil || a.Size != 3 || !a.IsRegular() || a.Mode&0o777 != 0o600 {
		t.Fatalf("getattr: %+v %v", a, err)
	}
	if _, err := fs.Setattr(ctx, "d/f", &layer.SetAttr{Valid: layer.SetSize | layer.SetMode, Size: 1, Mode: 0o640}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "d/f")); string(b) != "a" {
		t.Fatalf("after truncate: %q", b)
	}
	if err := fs.Rename(ctx, "d/f", "g", 0); err != nil {
		t.Fatal(err)
	}
	ents, err := fs.ReadDir(ctx, "", true)
	if err != nil || len(ents) != 2 {
		t.Fatalf("readdir: %+v %v", ents, err)
	}
	for _, e := range ents {
		if e.Attr == nil || e.Attr.Ino != e.Ino {
			t.Fatalf("entry without attributes: %+v", e)
		}
	}
	if err := fs.Rmdir(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	if err := fs.Unlink(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Getattr(ctx, "g"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("after unlink: %v", err)
	}
}

// TestNoEscape: a symlink or ".." inside the directory cannot lead outside
// it, whatever the operation.
func TestNoEscape(t *testing.T) {
	fs, root := newFS(t)
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	os.WriteFile(secret, []byte("secret"), 0o644)
	os.Symlink(outside, filepath.Join(root, "abs"))
	os.Symlink("../"+filepath.Base(outside), filepath.Join(root, "rel"))
	os.Symlink(secret, filepath.Join(root, "file-link"))
	ctx := context.Background()
	for _, p := range []string{"abs/secret", "rel/secret", "../" + filepath.Base(outside) + "/secret", "file-link"} {
		if f, err := fs.Open(ctx, p, os.O_RDONLY); err == nil {
			f.Release(ctx)
			t.Errorf("opened %q outside the root", p)
		}
		if _, err := fs.Getattr(ctx, p); err == nil && p != "file-link" {
			t.Errorf("stat of %q reached outside the root", p)
		}
		if _, _, err := fs.Create(ctx, p+"-new", os.O_WRONLY, 0o644); err == nil && p != "file-link" {
			t.Errorf("created %q-new outside the root", p)
		}
		if err := fs.Unlink(ctx, p); err == nil && p != "file-link" {
			t.Errorf("unlinked %q", p)
		}
		if _, err := fs.Setattr(ctx, p, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o777}); err == nil && p != "file-link" {
			t.Errorf("chmod through %q", p)
		}
		if err := fs.Setxattr(ctx, p, "user.x", []byte("1"), 0); err == nil && p != "file-link" {
			t.Errorf("setxattr through %q", p)
		}
	}
	os.Symlink(secret, filepath.Join(root, "file-link"))
	// The symlink itself can be stat'ed, read and removed, but a chmod or a
	// truncate of it does not follow it.
	if a, err := fs.Getattr(ctx, "file-link"); err != nil || !a.IsSymlink() {
		t.Fatalf("lstat of the link: %+v %v", a, err)
	}
	fs.Setattr(ctx, "file-link", &layer.SetAttr{Valid: layer.SetMode, Mode: 0o777})
	fs.Setattr(ctx, "file-link", &layer.SetAttr{Valid: layer.SetSize, Size: 0})
	fi, _ := os.Stat(secret)
	if fi.Mode().Perm() != 0o644 || fi.Size() != 6 {
		t.Fatalf("the target outside was changed: %v, %d bytes", fi.Mode(), fi.Size())
	}
	if b, _ := os.ReadFile(secret); string(b) != "secret" {
		t.Fatal("the target outside was changed")
	}
	if _, err := os.Stat(filepath.Join(outside, "secret-new")); err == nil {
		t.Fatal("a file was created outside")
	}
}
