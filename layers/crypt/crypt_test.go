package crypt

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn/layer"
	"cairn/layers/local"
)

// The package's tests make volumes with settings below the minimums of
// cairn init (TestKDFBounds checks those).
func init() { weakKDFOK = true }

// fastKDF keeps tests quick; real volumes use DefaultKDF.
var fastKDF = KDF{Name: Scrypt, N: 1 << 10, R: 8, P: 1}

var testPass = []byte("correct horse battery staple")

// newVolume initialises an empty directory and returns it.
func newVolume(t testing.TB, p InitParams) (string, []byte) {
	t.Helper()
	dir := t.TempDir()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p.KDF.Name == "" {
		p.KDF = fastKDF
	}
	master, err := Init(context.Background(), l, p, testPass)
	if err != nil {
		t.Fatal(err)
	}
	return dir, master
}

// open stacks a crypt layer over dir.
func open(t testing.TB, dir string) *FS {
	t.Helper()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := Unlock(context.Background(), l, testPass, false, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	return fs
}

func stack(t testing.TB) (string, *FS) {
	dir, _ := newVolume(t, InitParams{})
	return dir, open(t, dir)
}

func TestRoundTripInProcess(t *testing.T) {
	lower, fs := stack(t)
	ctx := context.Background()
	if err := layer.MkdirAll(ctx, fs, "a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 4095, 4096, 4097, 3*4096 + 17, 100000} {
		data := bytes.Repeat([]byte("0123456789abcdefghij"), n/20+1)[:n]
		name := "a/b/file" + strings.Repeat("x", n%7)
		if err := layer.WriteFile(ctx, fs, name, data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := layer.ReadFile(ctx, fs, name)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: read back %d bytes, %v", n, len(got), err)
		}
		a, err := fs.Getattr(ctx, name)
		if err != nil || a.Size != uint64(n) {
			t.Fatalf("%d bytes: stat says %d, %v", n, a.Size, err)
		}
	}
	ents, err := fs.ReadDir(ctx, "a/b", true)
	if err != nil || len(ents) == 0 {
		t.Fatalf("readdir: %v, %v", ents, err)
	}
	// Nothing in the lower shows a plaintext name or content.
	filepath.Walk(lower, func(p string, fi os.FileInfo, err error) error {
		if strings.Contains(fi.Name(), "file") || fi.Name() == "a" || fi.Name() == "b" {
			t.Errorf("plaintext name in the lower: %s", p)
		}
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			if bytes.Contains(b, []byte("0123456789")) {
				t.Errorf("plaintext in the lower: %s", p)
			}
		}
		return nil
	})
}

func openLocal(t testing.TB, dir string) (*local.FS, error) {
	l, err := local.New(dir)
	if err == nil {
		t.Cleanup(func() { l.Close() })
	}
	return l, err
}

// TestChangePassphraseInProcess: a new passphrase (and KDF) opens the same
// data; the old one does not; the master key still does.
func TestChangePassphraseInProcess(t *testing.T) {
	dir, master := newVolume(t, InitParams{KDF: KDF{Name: Argon2id, Time: 1, MemoryKiB: 64, Threads: 1}})
	ctx := context.Background()
	if err := layer.WriteFile(ctx, open(t, dir), "f", []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, _ := openLocal(t, dir)
	before, _ := os.ReadFile(filepath.Join(dir, ConfigName))
	if err := ChangePassphrase(ctx, l, []byte("wrong"), nil, []byte("new"), fastKDF); err != ErrWrongPassphrase {
		t.Fatalf("with a wrong old passphrase: %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, ConfigName)); !bytes.Equal(before, after) {
		t.Fatal("a failed change changed the configuration")
	}
	if err := ChangePassphrase(ctx, l, testPass, nil, []byte("new"), fastKDF); err != nil {
		t.Fatal(err)
	}
	if _, err := Unlock(ctx, l, testPass, false, Options{}); !errors.Is(err, ErrWrongPassphrase) {
		t.Fatalf("old passphrase: %v", err)
	}
	fs, err := Unlock(ctx, l, []byte("new"), false, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := layer.ReadFile(ctx, fs, "f"); err != nil || string(b) != "data" {
		t.Fatalf("after the change: %q %v", b, err)
	}
	if _, err := Unlock(ctx, l, []byte(FormatMasterKey(master)), true, Options{}); err != nil {
		t.Fatalf("master key: %v", err)
	}
	cfg, _ := ReadConfig(ctx, l)
	if cfg.KDF.Name != Scrypt {
		t.Fatalf("KDF is %s", cfg.KDF.Name)
	}
	// A damaged configuration says so, naming the file.
	os.Chmod(filepath.Join(dir, ConfigName), 0o600)
	os.WriteFile(filepath.Join(dir, ConfigName), []byte("{not json"), 0o600)
	if _, err := ReadConfig(ctx, l); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, ConfigName)) {
		t.Fatalf("damaged configuration: %v", err)
	}
}
