package crypt

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

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

// TestKDFBounds: a configuration with a key-derivation parameter out of
// range is refused with the file, the field and the allowed range (scrypt
// r = 2^20 used to panic, argon2 time 2^32-1 to hang); init refuses
// settings below the minimums; flags are checked before any conversion.
func TestKDFBounds(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	ctx := context.Background()
	l, _ := openLocal(t, dir)
	cfgPath := filepath.Join(dir, ConfigName)
	orig, _ := os.ReadFile(cfgPath)
	os.Chmod(cfgPath, 0o600)
	salt := `"salt":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="`
	for _, tc := range []struct{ kdf, want string }{
		{`{"name":"scrypt",` + salt + `,"n":65536,"r":1048576,"p":1}`, "kdf.r = 1048576 is out of range (allowed 1..32)"},
		{`{"name":"scrypt",` + salt + `,"n":65535,"r":8,"p":1}`, "kdf.n = 65535: not a power of two"},
		{`{"name":"scrypt",` + salt + `,"n":4194304,"r":32,"p":1}`, "kdf.n = 4194304: with r = 32 needs 16384 MiB"},
		{`{"name":"scrypt",` + salt + `,"n":1024,"r":8,"p":-1}`, "cannot be negative"},
		{`{"name":"argon2id",` + salt + `,"time":4294967295,"memory_kib":65536,"threads":4}`, "kdf.time = 4294967295 is out of range (allowed 1..64)"},
		{`{"name":"argon2id",` + salt + `,"time":3,"memory_kib":4194305,"threads":4}`, "kdf.memory_kib = 4194305 is out of range"},
		{`{"name":"argon2id",` + salt + `,"time":3,"memory_kib":65536,"threads":300}`, "kdf.threads = 300 is out of range (allowed 1..64)"},
		{`{"name":"argon2id","salt":"AAAA","time":3,"memory_kib":65536,"threads":4}`, "kdf.salt: 3 bytes (allowed 16..64)"},
	} {
		c := `{"format":"cairn-crypt","version":1,"cipher":"aes-256-gcm","block_size":4096,"kdf":` + tc.kdf + `}`
		os.WriteFile(cfgPath, []byte(c), 0o600)
		start := time.Now()
		_, err := Unlock(ctx, l, testPass, false, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), cfgPath) {
			t.Errorf("%s: %v (want %q and the file)", tc.kdf, err, tc.want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s: refused after %v", tc.kdf, d)
		}
	}
	os.WriteFile(cfgPath, orig, 0o400)
	// The minimums of new settings (cairn init and passwd: TestPasswdKeepsKDF).
	for _, k := range []KDF{{Name: Scrypt, N: 1024, R: 8, P: 1}, {Name: Argon2id, Time: 1, MemoryKiB: 32, Threads: 1}} {
		if err := k.Check(); err == nil || !strings.Contains(err.Error(), "out of range (allowed") {
			t.Errorf("%+v: %v", k, err)
		}
	}
	if err := DefaultKDF().Check(); err != nil {
		t.Errorf("the default settings: %v", err)
	}
	if err := (KDF{Name: Argon2id, Time: 3, MemoryKiB: 64 << 10, Threads: 260}).Check(); err == nil || !strings.Contains(err.Error(), "kdf.threads = 260") {
		t.Errorf("threads 260: %v", err)
	}
	// The maximums of the API's settings.
	l2, _ := openLocal(t, t.TempDir())
	if _, err := Init(ctx, l2, InitParams{KDF: KDF{Name: Argon2id, Time: 1 << 20, MemoryKiB: 64, Threads: 1}}, testPass); err == nil || !strings.Contains(err.Error(), "kdf.time") {
		t.Errorf("init with argon2 time 2^20: %v", err)
	}
	if err := ChangePassphrase(ctx, l, testPass, nil, []byte("new"), KDF{Name: Scrypt, N: 1 << 10, R: 1 << 20, P: 1}); err == nil || !strings.Contains(err.Error(), "kdf.r") {
		t.Errorf("passwd to scrypt r=2^20: %v", err)
	}
}

// TestPassfileBounded: a passphrase file is read up to MaxSecret bytes; a
// device such as /dev/zero is refused at once; a pipe works; so does a
// passphrase command, whose output is bounded too.
func TestPassfileBounded(t *testing.T) {
	dir := t.TempDir()
	done := make(chan error, 1)
	go func() { _, err := ReadPassfile("/dev/zero"); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file, a pipe or a terminal (it is a character device)") {
			t.Errorf("/dev/zero: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reading /dev/zero as a passphrase file does not end")
	}
	long := filepath.Join(dir, "long")
	os.WriteFile(long, bytes.Repeat([]byte("a"), MaxSecret+1), 0o600)
	if _, err := ReadPassfile(long); err == nil || !strings.Contains(err.Error(), "longer than 4096 bytes") {
		t.Errorf("a long first line: %v", err)
	}
	ok := filepath.Join(dir, "ok")
	os.WriteFile(ok, append([]byte("short\n"), bytes.Repeat([]byte("b"), 3*MaxSecret)...), 0o600)
	if b, err := ReadPassfile(ok); err != nil || string(b) != "short" {
		t.Errorf("a short first line and a long rest: %q %v", b, err)
	}
	if _, err := ReadPassfile(dir); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("a directory: %v", err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err == nil {
			f.Write([]byte("piped\n"))
			f.Close()
		}
	}()
	if b, err := ReadPassfile(fifo); err != nil || string(b) != "piped" {
		t.Errorf("a pipe: %q %v", b, err)
	}
	go func() { _, err := RunExtpass("cat /dev/zero"); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "longer than 4096 bytes") {
			t.Errorf("extpass cat /dev/zero: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("extpass cat /dev/zero does not end")
	}
	if b, err := RunExtpass("yes secret"); err != nil || string(b) != "secret" {
		t.Errorf("extpass yes: %q %v", b, err)
	}
}

// failingRand fails after n bytes.
type failingRand struct{ n int }

func (r *failingRand) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("entropy source gone")
	}
	k := min(len(p), r.n)
	r.n -= k
	clear(p[:k])
	return k, nil
}

// TestRandomSourceErrors: when the random source fails, the operation that
// needed a nonce, file ID or IV fails (and nothing is written with bytes
// that are not random).
func TestRandomSourceErrors(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	l, _ := openLocal(t, dir)
	fs, err := Unlock(context.Background(), l, testPass, false, Options{Rand: &failingRand{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := layer.WriteFile(ctx, fs, "f", []byte("data"), 0o644); err == nil || !strings.Contains(err.Error(), "random source failed") {
		t.Errorf("write: %v", err)
	}
	if _, err := fs.Mkdir(ctx, "d", 0o755); err == nil || !strings.Contains(err.Error(), "random source failed") {
		t.Errorf("mkdir: %v", err)
	}
	if _, err := fs.Symlink(ctx, "target", "s"); err == nil || !strings.Contains(err.Error(), "random source failed") {
		t.Errorf("symlink: %v", err)
	}
	if ents, _ := fs.ReadDir(ctx, "", false); len(ents) != 1 || ents[0].Name != "f" {
		t.Errorf("after the failures the root lists %v (want the empty file f only)", ents)
	}
	if a, err := fs.Getattr(ctx, "f"); err != nil || a.Size != 0 {
		t.Errorf("f: %d bytes, %v", a.Size, err)
	}
}

// TestClaim: one crypt layer at a time serves a volume (a second mount
// would corrupt it: names, sizes and journals are kept in memory); closing
// the first lets the next one in.
func TestClaim(t *testing.T) {
	ctx := context.Background()
	dir, a := stack(t)
	b := open(t, dir)
	if err := layer.ClaimStack(ctx, a); err != nil {
		t.Fatal(err)
	}
	var busy *layer.InUseError
	if err := layer.ClaimStack(ctx, b); !errors.As(err, &busy) || busy.Dir != dir || !errors.Is(err, layer.ErrInUse) {
		t.Fatalf("a second claim of the volume: %v, want an InUseError naming %s", err, dir)
	}
	a.Close()
	if err := layer.ClaimStack(ctx, b); err != nil {
		t.Fatalf("claim after the first layer closed: %v", err)
	}
}
