//go:build linux

package crypt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// lowerNames lists a lower directory without the layer's own files.
func lowerNames(t *testing.T, dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestNamesThroughMount(t *testing.T) {
	lower, fs := stack(t)
	m := mounttest.Mount(t, fs)
	long := strings.Repeat("long-name-", 25) // 250 bytes
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(m.Path("a", "b"), 0o755))
	must(os.WriteFile(m.Path("a", "b", long), []byte("long"), 0o644))
	must(os.WriteFile(m.Path("a", "same"), []byte("1"), 0o644))
	must(os.WriteFile(m.Path("a", "b", "same"), []byte("2"), 0o644))
	must(os.Mkdir(m.Path(long), 0o755))
	must(os.WriteFile(m.Path(long, "in-long-dir"), []byte("x"), 0o644))
	must(os.Symlink("../a/same", m.Path(long, "link")))
	// Two directories, one name: two ciphertexts.
	la, _ := fs.lowerPath(context.Background(), "a/same")
	lb, _ := fs.lowerPath(context.Background(), "a/b/same")
	if filepath.Base(la) == filepath.Base(lb) {
		t.Error("one name has one ciphertext in two directories")
	}
	// Long names: a hashed name and a side file.
	ll, _ := fs.lowerPath(context.Background(), "a/b/"+long)
	if !strings.HasPrefix(filepath.Base(ll), longPrefix) {
		t.Errorf("long name stored as %s", ll)
	}
	if _, err := os.Stat(filepath.Join(lower, ll+longSuffix)); err != nil {
		t.Errorf("no side file: %v", err)
	}
	ents, err := os.ReadDir(m.Path("a", "b"))
	must(err)
	if len(ents) != 2 || ents[0].Name() != long && ents[1].Name() != long {
		t.Errorf("listing: %v", ents)
	}
	if b, err := os.ReadFile(m.Path(long, "link")); err != nil || string(b) != "1" {
		t.Errorf("through the symlink: %q %v", b, err)
	}
	if tgt, _ := os.Readlink(m.Path(long, "link")); tgt != "../a/same" {
		t.Errorf("readlink: %q", tgt)
	}
	if fi, _ := os.Lstat(m.Path(long, "link")); fi.Size() != int64(len("../a/same")) {
		t.Errorf("symlink size %d", fi.Size())
	}
	// Renames: a long name to a short one and back; a directory with
	// its contents (its IV goes along, the cache follows).
	must(os.Rename(m.Path("a", "b", long), m.Path("a", "short")))
	if _, err := os.Stat(filepath.Join(lower, ll+longSuffix)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("side file left after rename: %v", err)
	}
	must(os.Rename(m.Path("a", "short"), m.Path(long, long)))
	if b, err := os.ReadFile(m.Path(long, long)); err != nil || string(b) != "long" {
		t.Errorf("long to long: %q %v", b, err)
	}
	must(os.Rename(m.Path("a"), m.Path("c")))
	if b, err := os.ReadFile(m.Path("c", "b", "same")); err != nil || string(b) != "2" {
		t.Errorf("after a directory rename: %q %v", b, err)
	}
	if _, err := os.Stat(m.Path("a", "b", "same")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old path still there: %v", err)
	}
	must(os.WriteFile(m.Path("c", "b", "new"), []byte("3"), 0o644))
	must(os.Mkdir(m.Path("a"), 0o755)) // a new "a": a new IV
	must(os.WriteFile(m.Path("a", "same"), []byte("4"), 0o644))
	if b, _ := os.ReadFile(m.Path("c", "same")); string(b) != "1" {
		t.Errorf("c/same: %q", b)
	}
	// Exchange two directories.
	must(unix.Renameat2(unix.AT_FDCWD, m.Path("a"), unix.AT_FDCWD, m.Path("c"), layer.RenameExchange))
	if b, _ := os.ReadFile(m.Path("a", "b", "new")); string(b) != "3" {
		t.Errorf("after exchange: %q", b)
	}
	// rmdir of a non-empty directory keeps it whole.
	if err := os.Remove(m.Path("a", "b")); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Errorf("rmdir non-empty: %v", err)
	}
	if b, _ := os.ReadFile(m.Path("a", "b", "new")); string(b) != "3" {
		t.Errorf("after a failed rmdir: %q", b)
	}
	// A read-only directory still gets its IV.
	must(os.Mkdir(m.Path("ro"), 0o555))
	if fi, _ := os.Stat(m.Path("ro")); fi.Mode().Perm() != 0o555 {
		t.Errorf("mode %v", fi.Mode())
	}
	must(os.Chmod(m.Path("ro"), 0o755))
	must(os.WriteFile(m.Path("ro", "f"), nil, 0o644))
	// Hard links share content.
	must(os.Link(m.Path("c", "same"), m.Path("ro", "hard")))
	must(os.WriteFile(m.Path("c", "same"), []byte("changed"), 0o644))
	if b, _ := os.ReadFile(m.Path("ro", "hard")); string(b) != "changed" {
		t.Errorf("hard link: %q", b)
	}
	// Extended attributes.
	must(unix.Setxattr(m.Path("ro", "f"), "user.colour", []byte("blue"), 0))
	must(unix.Setxattr(m.Path("ro", "f"), "user.a/b", []byte(""), 0))
	buf := make([]byte, 100)
	if n, err := unix.Getxattr(m.Path("ro", "f"), "user.colour", buf); err != nil || string(buf[:n]) != "blue" {
		t.Errorf("getxattr: %q %v", buf[:n], err)
	}
	n, _ := unix.Listxattr(m.Path("ro", "f"), buf)
	names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
	sort.Strings(names)
	if fmt.Sprint(names) != "[user.a/b user.colour]" {
		t.Errorf("listxattr: %q", names)
	}
	if err := unix.Setxattr(m.Path("ro", "f"), "user.colour", []byte("red"), layer.XattrCreate); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("XATTR_CREATE over an existing one: %v", err)
	}
	must(unix.Removexattr(m.Path("ro", "f"), "user.colour"))
	if _, err := unix.Getxattr(m.Path("ro", "f"), "user.colour", buf); !errors.Is(err, layer.ENOATTR) {
		t.Errorf("removed xattr: %v", err)
	}
	lf, _ := fs.lowerPath(context.Background(), "ro/f")
	lbuf := make([]byte, 1000)
	ln, _ := unix.Llistxattr(filepath.Join(lower, lf), lbuf)
	if bytes.Contains(lbuf[:ln], []byte("colour")) || bytes.Contains(lbuf[:ln], []byte("a/b")) {
		t.Errorf("plaintext xattr name below: %q", lbuf[:ln])
	}
	// Unlink and rmdir of long names remove their side files.
	must(os.Remove(m.Path(long, long)))
	must(os.Remove(m.Path(long, "in-long-dir")))
	must(os.Remove(m.Path(long, "link")))
	must(os.Remove(m.Path(long)))
	for _, n := range lowerNames(t, lower) {
		if strings.HasPrefix(n, longPrefix) {
			t.Errorf("left in the lower: %s", n)
		}
	}
	// statfs: names up to 255 bytes.
	var st unix.Statfs_t
	must(unix.Statfs(m.Dir, &st))
	if st.Namelen != 255 {
		t.Errorf("namelen %d", st.Namelen)
	}
}

// TestNameCacheBounded: a tiny cache still gives right answers.
func TestNameCacheBounded(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	l, _ := openLocal(t, dir)
	fs, err := Unlock(context.Background(), l, testPass, false, Options{CacheDirs: 3, CacheNames: 10})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		p := fmt.Sprintf("d%d/e%d", i%5, i)
		if err := layer.MkdirAll(ctx, fs, p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := layer.WriteFile(ctx, fs, p+"/f", []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs.Rename(ctx, "d1", "moved", 0)
	for i := 0; i < 20; i++ {
		d := fmt.Sprintf("d%d", i%5)
		if d == "d1" {
			d = "moved"
		}
		b, err := layer.ReadFile(ctx, fs, fmt.Sprintf("%s/e%d/f", d, i))
		if err != nil || string(b) != fmt.Sprintf("d%d/e%d", i%5, i) {
			t.Fatalf("%d: %q %v", i, b, err)
		}
	}
	if len(fs.cache.dirs) > 3 || fs.cache.names > 10 {
		t.Fatalf("cache over its bounds: %d dirs, %d names", len(fs.cache.dirs), fs.cache.names)
	}
}

// TestSharedState: handles of one file (and of its hard link) see each
// other's writes at once, from many goroutines.
func TestSharedState(t *testing.T) {
	_, fs := stack(t)
	ctx := context.Background()
	layer.WriteFile(ctx, fs, "f", nil, 0o644)
	fs.Link(ctx, "f", "g")
	var wg sync.WaitGroup
	const workers, per = 4, 50
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			name := []string{"f", "g"}[w%2]
			f, err := fs.Open(ctx, name, unix.O_RDWR)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Release(ctx)
			buf := bytes.Repeat([]byte{byte('a' + w)}, 1000)
			for i := 0; i < per; i++ {
				off := int64((i*workers + w) * 1000)
				if _, err := f.WriteAt(ctx, buf, off); err != nil {
					t.Error(err)
					return
				}
				got := make([]byte, 1000)
				if _, err := f.ReadAt(ctx, got, off); err != nil || !bytes.Equal(got, buf) {
					t.Errorf("worker %d: read back %q, %v", w, got[:10], err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	b, err := layer.ReadFile(ctx, fs, "g")
	if err != nil || len(b) != workers*per*1000 {
		t.Fatalf("%d bytes, %v", len(b), err)
	}
	for i := 0; i < workers*per; i++ {
		if b[i*1000] != byte('a'+i%workers) {
			t.Fatalf("chunk %d is %c", i, b[i*1000])
		}
	}
	if len(fs.t.files) != 0 {
		t.Fatalf("%d file states left after the last close", len(fs.t.files))
	}
}

// TestEmptyIVRepaired: the empty IV file a crash after mkdir can leave is
// replaced when the directory is otherwise empty, and is an error when it
// is not.
func TestEmptyIVRepaired(t *testing.T) {
	lower, fs := stack(t)
	ctx := context.Background()
	fs.Mkdir(ctx, "empty", 0o755)
	fs.Mkdir(ctx, "full", 0o755)
	layer.WriteFile(ctx, fs, "full/f", []byte("x"), 0o644)
	for _, d := range []string{"empty", "full"} {
		lp, _ := fs.lowerPath(ctx, d)
		if err := os.Truncate(filepath.Join(lower, lp, dirIVName), 0); err != nil {
			t.Fatal(err)
		}
	}
	fs2 := open(t, lower)
	if err := layer.WriteFile(ctx, fs2, "empty/new", []byte("y"), 0o644); err != nil {
		t.Fatalf("repaired directory: %v", err)
	}
	if b, err := layer.ReadFile(ctx, open(t, lower), "empty/new"); err != nil || string(b) != "y" {
		t.Fatalf("after repair: %q %v", b, err)
	}
	if _, err := fs2.ReadDir(ctx, "full", false); !IsCorrupt(err) {
		t.Fatalf("non-empty directory with an empty IV: %v", err)
	}
}

// TestTruncatingOpens: O_TRUNC opens race with reads and writes of other
// handles of the file without breaking it: a reader sees the old content
// only before the first truncation, then an empty file or one whole write,
// never a mixture; at the end the file holds the last write.
func TestTruncatingOpens(t *testing.T) {
	_, fs := stack(t)
	ctx := context.Background()
	if err := layer.WriteFile(ctx, fs, "t", bytes.Repeat([]byte("x"), 10000), 0o644); err != nil {
		t.Fatal(err)
	}
	var truncated atomic.Bool // a truncating open has returned
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				if w%2 == 0 {
					if err := layer.WriteFile(ctx, fs, "t", bytes.Repeat([]byte("y"), 5000+i), 0o644); err != nil {
						t.Error(err)
					}
					truncated.Store(true)
					continue
				}
				after := truncated.Load()
				b, err := layer.ReadFile(ctx, fs, "t")
				switch {
				case err != nil:
					t.Errorf("read: %v", err)
				case len(b) == 0:
				case bytes.Count(b, []byte("x")) == len(b) && len(b) == 10000:
					if after {
						t.Errorf("read the content from before a truncation after it")
					}
				case bytes.Count(b, []byte("y")) != len(b) || len(b) < 5000 || len(b) > 5029:
					t.Errorf("read %d bytes of mixed or partial content: %q...", len(b), b[:min(len(b), 20)])
				}
			}
		}(w)
	}
	wg.Wait()
	if b, err := layer.ReadFile(ctx, fs, "t"); err != nil || !bytes.Equal(b, bytes.Repeat([]byte("y"), 5029)) {
		t.Fatalf("final state: %d bytes, %v (want 5029 bytes of y)", len(b), err)
	}
}

// TestSharedRemadeDirs: two layers over one lower, as two machines sharing
// it (Share). Each keeps directories' IVs, checked before use: a
// directory the other one removed and made again (a new IV; ext4 may give
// it the same inode number) or renamed is never used with its old IV,
// which would give names the other cannot read.
func TestSharedRemadeDirs(t *testing.T) {
	lower, a := stack(t)
	b := open(t, lower)
	layer.ShareStack(a)
	layer.ShareStack(b)
	ctx := context.Background()
	read := func(fs *FS, p, want string) {
		t.Helper()
		got, err := layer.ReadFile(ctx, fs, p)
		if err != nil || string(got) != want {
			t.Fatalf("%s: %q, %v; want %q", p, got, err, want)
		}
	}
	for i := range 50 {
		s := fmt.Sprint(i)
		// a knows x and x/y (their IVs are cached).
		if err := layer.MkdirAll(ctx, a, "x/y", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := layer.WriteFile(ctx, a, "x/y/f", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		read(b, "x/y/f", s)
		// b removes them and makes them again; a writes into the new
		// ones, and b reads what a wrote.
		for _, p := range []string{"x/y/f", "x/y", "x"} {
			if err := removeAny(ctx, b, p); err != nil {
				t.Fatal(err)
			}
		}
		if err := layer.MkdirAll(ctx, b, "x/y", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := layer.WriteFile(ctx, a, "x/y/g", []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		read(b, "x/y/g", s)
		// b renames x; a sees the new name, not the old one.
		if err := b.Rename(ctx, "x", "z", 0); err != nil {
			t.Fatal(err)
		}
		read(a, "z/y/g", s)
		if _, err := a.Getattr(ctx, "x/y"); !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("x/y after b renamed x: %v", err)
		}
		for _, p := range []string{"z/y/g", "z/y", "z"} {
			if err := removeAny(ctx, a, p); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func removeAny(ctx context.Context, fs *FS, p string) error {
	if a, err := fs.Getattr(ctx, p); err == nil && a.IsDir() {
		return fs.Rmdir(ctx, p)
	}
	return fs.Unlink(ctx, p)
}
