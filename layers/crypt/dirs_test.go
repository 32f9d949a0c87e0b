//go:build linux

package crypt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// smallCache stacks a crypt layer over dir with a tiny name cache.
func smallCache(t *testing.T, dir string, dirs, names int) *FS {
	t.Helper()
	l, err := openLocal(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := Unlock(context.Background(), l, testPass, false, Options{CacheDirs: dirs, CacheNames: names})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestNameCacheIssueSequence is the sequence of issue 26 that corrupted a
// directory with CacheDirs = 4: the cache was cleared at its limit while
// a/b stayed cached without a, and the drop of an uncached a returned early.
func TestNameCacheIssueSequence(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	fs := smallCache(t, dir, 4, 1000)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"a", "a/b", "y", "y/b", "x0"} {
		_, err := fs.Mkdir(ctx, d, 0o755)
		must(err)
	}
	_, err := fs.ReadDir(ctx, "a/b", false)
	must(err)
	must(fs.Rename(ctx, "a", "z", 0))
	must(fs.Rmdir(ctx, "z/b"))
	_, err = fs.Mkdir(ctx, "z/b", 0o755)
	must(err)
	must(fs.Rename(ctx, "z", "a", 0))
	must(layer.WriteFile(ctx, fs, "a/b/secret", []byte("s"), 0o644))
	fresh := open(t, dir)
	ents, err := fresh.ReadDir(ctx, "a/b", false)
	if err != nil || len(ents) != 1 || ents[0].Name != "secret" {
		t.Fatalf("a/b after a remount: %v, %v", ents, err)
	}
	if b, err := layer.ReadFile(ctx, fresh, "a/b/secret"); err != nil || string(b) != "s" {
		t.Fatalf("a/b/secret: %q %v", b, err)
	}
}

// TestNameCacheModel runs random mkdir, rmdir, rename, create and unlink
// against a model of the tree through a layer with a tiny name cache, and
// checks every directory and file through a fresh stack (now and then) and
// a fresh mount (at the end).
func TestNameCacheModel(t *testing.T) {
	seed := uint64(rand.Int64())
	if s := os.Getenv("CAIRN_CRYPT_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (CAIRN_CRYPT_SEED replays it)", seed)
	r := rand.New(rand.NewPCG(seed, 26))
	dir, _ := newVolume(t, InitParams{})
	fs := smallCache(t, dir, 4, 12)
	// ref shares fs's lower (whose own directory cache must see the
	// renames) and gets an empty name cache for each check.
	ref, err := Unlock(context.Background(), fs.Lower, testPass, false, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	model := map[string]string{"": "/"} // path -> "/" for a directory, content for a file
	paths := func(wantDir bool) []string {
		var out []string
		for p, v := range model {
			if (v == "/") == wantDir {
				out = append(out, p)
			}
		}
		sort.Strings(out)
		return out
	}
	names := []string{"a", "b", strings.Repeat("L", 200)}
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	// Paths that were renamed away or removed come back often: a stale
	// cache entry does damage when a path it describes is used again.
	var gone []string
	newPath := func() string {
		if len(gone) > 0 && r.IntN(2) == 0 {
			p := gone[r.IntN(len(gone))]
			if d, _ := layer.Split(p); model[d] == "/" {
				return p
			}
		}
		return layer.Join(pick(paths(true)), pick(names))
	}
	// Small, shallow trees (at most 10 directories, 4 levels) make the
	// same paths come back often, which is what a stale cache entry needs
	// to do damage.
	tooDeep := func(p string) bool { return strings.Count(p, "/") >= 4 }
	isEmptyDir := func(p string) bool {
		for q := range model {
			if strings.HasPrefix(q, p+"/") {
				return false
			}
		}
		return true
	}
	ops := 3000
	if os.Getenv("CAIRN_LONG") != "" {
		ops = 30000
	}
	for i := 0; i < ops; i++ {
		if len(gone) > 8 {
			gone = gone[1:]
		}
		switch op := r.IntN(11); {
		case op == 10: // list a directory (which caches its path)
			p := pick(paths(true))
			ents, err := fs.ReadDir(ctx, p, false)
			var got []string
			for _, e := range ents {
				got = append(got, layer.Join(p, e.Name))
			}
			if want := children(model, p); err != nil || fmt.Sprint(sorted(got)) != fmt.Sprint(want) {
				t.Fatalf("op %d: %s lists %q, %v; want %q", i, p, sorted(got), err, want)
			}
		case op < 3: // mkdir
			p := newPath()
			if tooDeep(p) || len(paths(true)) >= 10 {
				continue
			}
			_, err := fs.Mkdir(ctx, p, 0o755)
			if _, ok := model[p]; ok {
				if !errors.Is(err, syscall.EEXIST) {
					t.Fatalf("op %d: mkdir %s over an existing one: %v", i, p, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("op %d: mkdir %s: %v", i, p, err)
			}
			model[p] = "/"
		case op < 5: // create
			p := newPath()
			if model[p] == "/" {
				continue
			}
			c := fmt.Sprintf("%s #%d", p, i)
			if err := layer.WriteFile(ctx, fs, p, []byte(c), 0o644); err != nil {
				t.Fatalf("op %d: write %s: %v", i, p, err)
			}
			model[p] = c
		case op < 6: // rmdir
			ds := paths(true)[1:]
			if len(ds) == 0 {
				continue
			}
			p := pick(ds)
			err := fs.Rmdir(ctx, p)
			if !isEmptyDir(p) {
				if !errors.Is(err, syscall.ENOTEMPTY) {
					t.Fatalf("op %d: rmdir of non-empty %s: %v", i, p, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("op %d: rmdir %s: %v", i, p, err)
			}
			delete(model, p)
			gone = append(gone, p)
		case op < 7: // unlink
			fl := paths(false)
			if len(fl) == 0 {
				continue
			}
			p := pick(fl)
			if err := fs.Unlink(ctx, p); err != nil {
				t.Fatalf("op %d: unlink %s: %v", i, p, err)
			}
			delete(model, p)
		default: // rename, of a directory mostly
			var from string
			if r.IntN(4) == 0 && len(paths(false)) > 0 {
				from = pick(paths(false))
			} else if ds := paths(true)[1:]; len(ds) > 0 {
				from = pick(ds)
			} else {
				continue
			}
			to := newPath()
			if to == from || strings.HasPrefix(to, from+"/") {
				continue
			}
			deep := false
			for q := range model {
				if q == from || strings.HasPrefix(q, from+"/") {
					deep = deep || tooDeep(to+q[len(from):])
				}
			}
			if deep {
				continue
			}
			fv, tv, exists := model[from], model[to], false
			_, exists = model[to]
			if exists && ((fv == "/") != (tv == "/") || tv == "/" && !isEmptyDir(to)) {
				continue // EISDIR, ENOTDIR, ENOTEMPTY: not the point here
			}
			if err := fs.Rename(ctx, from, to, 0); err != nil {
				t.Fatalf("op %d: rename %s %s: %v", i, from, to, err)
			}
			moved := map[string]string{}
			for q, v := range model {
				if q == from || strings.HasPrefix(q, from+"/") {
					moved[to+q[len(from):]] = v
					delete(model, q)
				}
			}
			for q, v := range moved {
				model[q] = v
			}
			gone = append(gone, from)
		}
		checkCache(t, i, fs, ref, model)
		if i%500 == 499 {
			checkTree(t, fmt.Sprintf("op %d, a fresh stack", i), open(t, dir), model)
		}
	}
	checkTree(t, "the layer itself", fs, model)
	m := mounttest.Mount(t, open(t, dir))
	checkMount(t, m.Dir, model)
}

// checkCache checks that every directory in fs's name cache exists and has
// the lower path and IV that a layer with an empty cache finds for it.
func checkCache(t *testing.T, op int, fs, ref *FS, model map[string]string) {
	t.Helper()
	fs.cache.mu.Lock()
	dirs := map[string]*dirEntry{}
	for p, d := range fs.cache.dirs {
		dirs[p] = d
	}
	fs.cache.mu.Unlock()
	ref.cache = newNameCache(1<<10, 1<<10)
	for p, d := range dirs {
		if model[p] != "/" {
			t.Fatalf("op %d: directory %q is cached but gone", op, p)
		}
		want, err := ref.dir(context.Background(), p)
		if err != nil || want.lower != d.lower || !bytes.Equal(want.iv, d.iv) {
			t.Fatalf("op %d: directory %q cached as %s (IV %x), is %v (%v)", op, p, d.lower, d.iv, want, err)
		}
	}
}

// checkTree lists every directory of the model through fs and reads every
// file.
func checkTree(t *testing.T, what string, fs *FS, model map[string]string) {
	t.Helper()
	ctx := context.Background()
	for p, v := range model {
		if v != "/" {
			b, err := layer.ReadFile(ctx, fs, p)
			if err != nil || string(b) != v {
				t.Fatalf("%s: %s reads %q, %v; want %q", what, p, b, err, v)
			}
			continue
		}
		ents, err := fs.ReadDir(ctx, p, false)
		if err != nil {
			t.Fatalf("%s: listing %s: %v", what, p, err)
		}
		var got []string
		for _, e := range ents {
			got = append(got, layer.Join(p, e.Name))
		}
		if want := children(model, p); fmt.Sprint(sorted(got)) != fmt.Sprint(want) {
			t.Fatalf("%s: %s lists %q, want %q", what, p, sorted(got), want)
		}
	}
}

// checkMount does the same through a mount.
func checkMount(t *testing.T, root string, model map[string]string) {
	t.Helper()
	for p, v := range model {
		full := filepath.Join(root, p)
		if v != "/" {
			b, err := os.ReadFile(full)
			if err != nil || !bytes.Equal(b, []byte(v)) {
				t.Fatalf("mount: %s reads %q, %v; want %q", p, b, err, v)
			}
			continue
		}
		ents, err := os.ReadDir(full)
		if err != nil {
			t.Fatalf("mount: listing %s: %v", p, err)
		}
		var got []string
		for _, e := range ents {
			got = append(got, layer.Join(p, e.Name()))
		}
		if want := children(model, p); fmt.Sprint(sorted(got)) != fmt.Sprint(want) {
			t.Fatalf("mount: %s lists %q, want %q", p, sorted(got), want)
		}
	}
}

func children(model map[string]string, dir string) []string {
	var out []string
	for q := range model {
		if d, _ := layer.Split(q); q != "" && d == dir {
			out = append(out, q)
		}
	}
	return sorted(out)
}

func sorted(s []string) []string {
	s = append([]string{}, s...)
	sort.Strings(s)
	return s
}

// errnoOf gives the errno of an error ("ok" for none), to compare with ext4.
func errnoOf(err error) string {
	var e syscall.Errno
	if err == nil {
		return "ok"
	}
	if errors.As(err, &e) {
		return e.Error()
	}
	return err.Error()
}

// TestEmptyDirectories: rename of a directory onto an empty one, and rmdir,
// see a directory that holds only the layer's own files as empty, as ext4
// does; onto a non-empty one they fail and leave it whole. Compared with a
// plain directory, op by op.
func TestEmptyDirectories(t *testing.T) {
	lower, fs := stack(t)
	m := mounttest.MountOpts(t, fs, fusefs.Options{AllowOther: true})
	plain := t.TempDir()
	type step struct {
		what string
		do   func(root string) error
	}
	w := func(p string) func(string) error {
		return func(root string) error { return os.WriteFile(filepath.Join(root, p), []byte(p), 0o644) }
	}
	mk := func(p string) func(string) error {
		return func(root string) error { return os.Mkdir(filepath.Join(root, p), 0o755) }
	}
	mv := func(a, b string) func(string) error {
		// (os.Rename refuses an existing directory as the target by itself)
		return func(root string) error { return unix.Rename(filepath.Join(root, a), filepath.Join(root, b)) }
	}
	rm := func(p string) func(string) error {
		return func(root string) error { return syscall.Rmdir(filepath.Join(root, p)) }
	}
	long := strings.Repeat("n", 220)
	steps := []step{
		{"mkdir src", mk("src")}, {"write src/f", w("src/f")}, {"mkdir empty", mk("empty")},
		{"rename src onto empty", mv("src", "empty")},
		{"mkdir full", mk("full")}, {"write full/g", w("full/g")}, {"mkdir src2", mk("src2")},
		{"rename src2 onto full", mv("src2", "full")},
		{"rename empty onto full", mv("empty", "full")},
		{"rmdir full", rm("full")},
		{"mkdir " + long, mk(long)}, {"mkdir e2", mk("e2")},
		{"rename e2 onto long", mv("e2", long)},
		{"rename long onto src2", mv(long, "src2")},
		{"rmdir src2", rm("src2")},
		{"mkdir d", mk("d")}, {"write d/x", w("d/x")},
		{"rmdir d (not empty)", rm("d")},
		{"rename file onto empty dir", func(root string) error {
			os.Mkdir(filepath.Join(root, "e3"), 0o755)
			return unix.Rename(filepath.Join(root, "d", "x"), filepath.Join(root, "e3"))
		}},
		{"rmdir e3", rm("e3")},
	}
	for _, s := range steps {
		want, got := errnoOf(s.do(plain)), errnoOf(s.do(m.Dir))
		if want != got {
			t.Errorf("%s: %s through the mount, %s on ext4", s.what, got, want)
		}
	}
	// The trees are the same, and every directory still lists.
	model := map[string]string{}
	filepath.WalkDir(plain, func(p string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(plain, p)
		if rel == "." {
			rel = ""
		}
		if d.IsDir() {
			model[rel] = "/"
		} else {
			b, _ := os.ReadFile(p)
			model[rel] = string(b)
		}
		return nil
	})
	checkMount(t, m.Dir, model)
	checkTree(t, "a fresh stack", open(t, lower), model)

	// What a crash between removing the IV and the rmdir (or rename) can
	// leave: an empty directory without its IV, with an orphan side file.
	ctx := context.Background()
	if err := os.Mkdir(m.Path("crashed"), 0o755); err != nil {
		t.Fatal(err)
	}
	lp, _ := fs.lowerPath(ctx, "crashed")
	os.Remove(filepath.Join(lower, lp, dirIVName))
	os.WriteFile(filepath.Join(lower, lp, longPrefix+"orphan"+longSuffix), []byte("x"), 0o444)
	fresh := open(t, lower)
	// Whoever lists it first, even a user who may only read it.
	os.Chmod(filepath.Join(lower, lp), 0o755)
	nobody := layer.WithCaller(ctx, &layer.Caller{Uid: 65534, Gid: 65534})
	if ents, err := fresh.ReadDir(nobody, "crashed", false); err != nil || len(ents) != 0 {
		t.Fatalf("empty directory without its IV: %v, %v", ents, err)
	}
	if err := fresh.Rmdir(ctx, "crashed"); err != nil {
		t.Fatalf("rmdir of a directory with only an orphan side file: %v", err)
	}
}

// TestWhiteoutLongName: renameat2(RENAME_WHITEOUT) leaves a whiteout (a
// character device 0:0) under the old name, as on ext4; a long old name
// keeps its side file, so the directory still lists.
func TestWhiteoutLongName(t *testing.T) {
	mounttest.NeedRoot(t) // RENAME_WHITEOUT needs CAP_MKNOD
	lower, fs := stack(t)
	m := mounttest.MountOpts(t, fs, fusefs.Options{AllowOther: true})
	plain := t.TempDir()
	long := strings.Repeat("w", 200)
	list := func(dir string) string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err.Error()
		}
		var out []string
		for _, e := range ents {
			fi, _ := e.Info()
			st, _ := fi.Sys().(*syscall.Stat_t)
			out = append(out, fmt.Sprintf("%s %v %d", e.Name(), fi.Mode().Type(), st.Rdev))
		}
		return strings.Join(out, ", ")
	}
	for _, root := range []string{plain, m.Dir} {
		for _, n := range []string{long, "short"} {
			if err := os.WriteFile(filepath.Join(root, n), []byte(n), 0o644); err != nil {
				t.Fatal(err)
			}
			err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, n), unix.AT_FDCWD, filepath.Join(root, n+".moved"), layer.RenameWhiteout)
			if err != nil {
				t.Fatalf("%s: renameat2 %s: %v", root, n[:5], err)
			}
		}
	}
	if got, want := list(m.Dir), list(plain); got != want {
		t.Errorf("listing through the mount:\n%s\non ext4:\n%s", got, want)
	}
	ents, err := open(t, lower).ReadDir(context.Background(), "", false)
	if err != nil || len(ents) != 4 {
		t.Errorf("a fresh stack lists %d entries, %v", len(ents), err)
	}
	// And the whiteout goes away with its side file.
	if err := os.Remove(m.Path(long)); err != nil {
		t.Fatal(err)
	}
	for _, n := range lowerNames(t, lower) {
		if isSide(n) {
			if _, err := os.Lstat(filepath.Join(lower, strings.TrimSuffix(n, longSuffix))); err != nil {
				t.Errorf("side file %s without its entry", n)
			}
		}
	}
}

// TestLongNameCanonical: a long-name entry whose side file holds an
// encoded name short enough to be stored as itself is refused (left out
// of the listing), so one name cannot have two lower entries.
func TestLongNameCanonical(t *testing.T) {
	lower, fs := stack(t)
	ctx := context.Background()
	if err := layer.WriteFile(ctx, fs, "short", []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	lp, _ := fs.lowerPath(ctx, "short")
	enc := filepath.Base(lp)
	h := sha256.Sum256([]byte(enc))
	planted := longPrefix + b64.EncodeToString(h[:])
	os.WriteFile(filepath.Join(lower, planted+longSuffix), []byte(enc), 0o444)
	os.Link(filepath.Join(lower, lp), filepath.Join(lower, planted))
	ents, err := open(t, lower).ReadDir(ctx, "", false)
	if err != nil || len(ents) != 1 || ents[0].Name != "short" {
		t.Fatalf("listing: %v, %v", ents, err)
	}
}

// spy is a lower layer that records, in order, the entries made in it and
// the files written and synced.
type spy struct {
	layer.Base
	mu     sync.Mutex
	events []string
}

type spyFile struct {
	layer.BaseFile
	s    *spy
	path string
}

func (s *spy) rec(what, path string) {
	s.mu.Lock()
	s.events = append(s.events, what+" "+path)
	s.mu.Unlock()
}

func (s *spy) Create(ctx context.Context, path string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	f, a, err := s.Lower.Create(ctx, path, flags, mode)
	if err != nil {
		return f, a, err
	}
	s.rec("entry", path)
	return &spyFile{layer.BaseFile{Lower: f}, s, path}, a, nil
}

func (s *spy) Mkdir(ctx context.Context, path string, mode uint32) (layer.Attr, error) {
	a, err := s.Lower.Mkdir(ctx, path, mode)
	if err == nil {
		s.rec("entry", path)
	}
	return a, err
}

func (s *spy) Rename(ctx context.Context, oldpath, newpath string, flags uint32) error {
	err := s.Lower.Rename(ctx, oldpath, newpath, flags)
	if err == nil {
		s.rec("entry", newpath)
	}
	return err
}

func (f *spyFile) Fsync(ctx context.Context, datasync bool) error {
	err := f.Lower.Fsync(ctx, datasync)
	if err == nil {
		f.s.rec("fsync", f.path)
	}
	return err
}

// TestIVDurable: a new directory's IV file is synced before any entry is
// made in the directory, and a long name's side file before its entry: a
// crash cannot leave names whose IV or encoded form is lost. (A kill -9 of
// the daemon cannot show this: the lower's page cache survives it.)
func TestIVDurable(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	l, err := openLocal(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	s := &spy{Base: layer.Base{Lower: l}}
	fs, err := Unlock(context.Background(), s, testPass, false, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, fs)
	long := strings.Repeat("l", 200)
	if err := os.MkdirAll(m.Path("a", long, "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.Path("a", long, "c", long), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.Path("a", long, "c", long), m.Path("a", long+"2")); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	events := append([]string{}, s.events...)
	s.mu.Unlock()
	synced := map[string]bool{}
	checked := 0
	for _, e := range events {
		what, p, _ := strings.Cut(e, " ")
		if what == "fsync" {
			synced[p] = true
			continue
		}
		d, name := layer.Split(p)
		if name != dirIVName && !isSide(name) && d != "" {
			checked++
			if !synced[layer.Join(d, dirIVName)] {
				t.Errorf("%s made before its directory's IV was synced", p)
			}
		}
		if isLong(name) && !synced[p+longSuffix] {
			t.Errorf("%s made before its side file was synced", p)
		}
	}
	if checked < 4 {
		t.Errorf("only %d entries checked: %q", checked, events)
	}
}

// TestSetgidDirectory: a directory made in a set-group-ID directory is
// set-group-ID too, as on ext4, whatever mode is asked for.
func TestSetgidDirectory(t *testing.T) {
	_, fs := stack(t)
	m := mounttest.MountOpts(t, fs, fusefs.Options{AllowOther: true})
	plain := t.TempDir()
	for _, root := range []string{plain, m.Dir} {
		p := filepath.Join(root, "sg")
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(p, 0o2775); err != nil {
			t.Fatal(err)
		}
		for _, mode := range []uint32{0o755, 0o700, 0o555} {
			if err := unix.Mkdir(filepath.Join(p, fmt.Sprint(mode)), mode); err != nil {
				t.Fatal(err)
			}
		}
	}
	// And as another user, in a set-group-ID directory of root's group.
	mounttest.NeedRoot(t)
	nobody := mounttest.User{Uid: 65534, Gid: 65534}
	for _, root := range []string{plain, m.Dir} {
		for d := root; d != "/"; d = filepath.Dir(d) {
			if fi, _ := os.Stat(d); fi.Mode().Perm()&0o005 != 0o005 {
				os.Chmod(d, fi.Mode().Perm()|0o005)
			}
		}
		unix.Chmod(filepath.Join(root, "sg"), 0o2777)
		if out, err := nobody.Sh(t, filepath.Join(root, "sg"), "mkdir -m 700 user"); err != nil {
			t.Fatalf("%s: %v %s", root, err, out)
		}
	}
	for _, mode := range []any{0o755, 0o700, 0o555, "user"} {
		var want, got unix.Stat_t
		unix.Stat(filepath.Join(plain, "sg", fmt.Sprint(mode)), &want)
		unix.Stat(m.Path("sg", fmt.Sprint(mode)), &got)
		if got.Mode != want.Mode || got.Gid != want.Gid || got.Uid != want.Uid || want.Mode&unix.S_ISGID == 0 {
			t.Errorf("mkdir %v in a set-group-ID directory: mode %o uid %d gid %d through the mount, %o %d %d on ext4",
				mode, got.Mode, got.Uid, got.Gid, want.Mode, want.Uid, want.Gid)
		}
	}
}

// TestLongPaths: paths up to PATH_MAX (4,095 bytes) work through the mount
// as on ext4, although their lower paths are longer (names of 159 bytes
// have 255-character lower names): mkdir, create, write, stat, list,
// rename, unlink and rmdir, relative to a descriptor of the root; one byte
// more is ENAMETOOLONG on both.
func TestLongPaths(t *testing.T) {
	lower, fs := stack(t)
	m := mounttest.MountOpts(t, fs, fusefs.Options{AllowOther: true})
	plain := t.TempDir()
	for _, size := range []int{255, 159} {
		var comps []string
		n := 0
		for n+size+1 <= unix.PathMax-1 {
			comps = append(comps, strings.Repeat(string(rune('a'+len(comps)%26)), size))
			n += size + 1
		}
		// The last name fills the path up to 4,095 bytes.
		comps = append(comps, strings.Repeat("z", unix.PathMax-1-n))
		dirs := comps[:len(comps)-1]
		file := strings.Join(comps, "/")
		if len(file) != unix.PathMax-1 {
			t.Fatalf("path of %d bytes", len(file))
		}
		run := func(root string) []string {
			rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(rfd)
			var res []string
			rec := func(what string, err error) { res = append(res, what+": "+errnoOf(err)) }
			for i := range dirs {
				rec("mkdir", unix.Mkdirat(rfd, strings.Join(dirs[:i+1], "/"), 0o755))
			}
			fd, err := unix.Openat(rfd, file, unix.O_CREAT|unix.O_RDWR, 0o644)
			rec("create", err)
			if err == nil {
				_, err = unix.Write(fd, []byte("deep"))
				rec("write", err)
				unix.Close(fd)
			}
			var st unix.Stat_t
			err = unix.Fstatat(rfd, file, &st, unix.AT_SYMLINK_NOFOLLOW)
			rec(fmt.Sprintf("stat (size %d)", st.Size), err)
			fd, err = unix.Openat(rfd, strings.Join(dirs, "/"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
			rec("open dir", err)
			if err == nil {
				f := os.NewFile(uintptr(fd), "dir")
				names, err := f.Readdirnames(-1)
				rec(fmt.Sprintf("list %d", len(names)), err)
				f.Close()
			}
			fd, err = unix.Openat(rfd, file, unix.O_RDONLY, 0)
			rec("open", err)
			if err == nil {
				b := make([]byte, 10)
				k, err := unix.Read(fd, b)
				rec("read "+string(b[:max(k, 0)]), err)
				unix.Close(fd)
			}
			rec("create one byte longer", func() error {
				fd, err := unix.Openat(rfd, file+"z", unix.O_CREAT|unix.O_RDWR, 0o644)
				if err == nil {
					unix.Close(fd)
				}
				return err
			}())
			moved := strings.Join(dirs, "/") + "/" + strings.Repeat("y", len(comps[len(comps)-1]))
			rec("rename", unix.Renameat(rfd, file, rfd, moved))
			rec("unlink", unix.Unlinkat(rfd, moved, 0))
			for i := len(dirs); i > 0; i-- {
				rec("rmdir", unix.Unlinkat(rfd, strings.Join(dirs[:i], "/"), unix.AT_REMOVEDIR))
			}
			return res
		}
		want, got := run(plain), run(m.Dir)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("names of %d bytes:\nthrough the mount: %q\non ext4:           %q", size, got, want)
		}
		if ents, _ := os.ReadDir(lower); len(ents) != 2 { // the IV and the configuration
			t.Errorf("left in the lower: %d entries", len(ents))
		}
	}
}

// TestLongSymlinkTargets: symlink targets up to 4,095 bytes, as on ext4
// (longer ones than a lower symlink holds once encrypted are stored in a
// file of their own); their size, readlink, a hard link and a rename keep
// working, and the target file goes with the last name.
func TestLongSymlinkTargets(t *testing.T) {
	lower, fs := stack(t)
	m := mounttest.MountOpts(t, fs, fusefs.Options{AllowOther: true})
	plain := t.TempDir()
	// The longest target a lower symlink holds: 3,071 bytes in base64 make
	// 4,095 characters, less the cipher's nonce and tag.
	edge := 3071 - fs.meta.NonceSize() - fs.meta.Overhead()
	targets := map[string]string{
		"short": "a/b", "edge": strings.Repeat("e", edge), "over": strings.Repeat("o", edge+1),
		"max": strings.Repeat("m/", 2047) + "x", "toolong": strings.Repeat("t", 4096),
	}
	run := func(root string) []string {
		var res []string
		for _, n := range []string{"short", "edge", "over", "max", "toolong"} {
			p := filepath.Join(root, n)
			err := os.Symlink(targets[n], p)
			res = append(res, n+" symlink: "+errnoOf(err))
			if err != nil {
				continue
			}
			got, err := os.Readlink(p)
			fi, _ := os.Lstat(p)
			res = append(res, fmt.Sprintf("%s readlink %v size %d: %s", n, got == targets[n], fi.Size(), errnoOf(err)))
		}
		res = append(res, "link: "+errnoOf(os.Link(filepath.Join(root, "max"), filepath.Join(root, "max2"))))
		res = append(res, "rename: "+errnoOf(os.Rename(filepath.Join(root, "over"), filepath.Join(root, "max"))))
		got, err := os.Readlink(filepath.Join(root, "max2"))
		res = append(res, fmt.Sprintf("max2 after rename over max: %v %s", got == targets["max"], errnoOf(err)))
		got, err = os.Readlink(filepath.Join(root, "max"))
		res = append(res, fmt.Sprintf("max after rename: %v %s", got == targets["over"], errnoOf(err)))
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			fi, _ := e.Info()
			res = append(res, fmt.Sprintf("listed %s %d", e.Name(), fi.Size()))
		}
		return res
	}
	want, got := run(plain), run(m.Dir)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("through the mount:\n%q\non ext4:\n%q", got, want)
	}
	// A fresh stack reads them too.
	if got, err := open(t, lower).Readlink(context.Background(), "max2"); err != nil || got != targets["max"] {
		t.Errorf("fresh stack: %d bytes, %v", len(got), err)
	}
	stores := func() int {
		ents, _ := os.ReadDir(filepath.Join(lower, longLinkDir))
		return len(ents)
	}
	if n := stores(); n != 2 { // max (as max2) and over (as max)
		t.Errorf("%d target files, want 2", n)
	}
	// A changed target file, or a target file swapped for another, does
	// not authenticate.
	ctx := context.Background()
	lt, _ := os.Readlink(filepath.Join(lower, must1(fs.lowerPath(ctx, "max2"))))
	_, store, _ := parseLongLink(lt)
	b, _ := os.ReadFile(filepath.Join(lower, store))
	os.Chmod(filepath.Join(lower, store), 0o644)
	b[100] ^= 1
	os.WriteFile(filepath.Join(lower, store), b, 0o444)
	if _, err := open(t, lower).Readlink(ctx, "max2"); !IsCorrupt(err) {
		t.Errorf("changed target file: %v", err)
	}
	b[100] ^= 1
	os.WriteFile(filepath.Join(lower, store), b, 0o444)
	for _, n := range []string{"max", "max2", "edge", "short"} {
		if err := os.Remove(m.Path(n)); err != nil {
			t.Fatal(err)
		}
	}
	if n := stores(); n != 0 {
		t.Errorf("%d target files left after the last names went", n)
	}
}

func must1[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestTrustedXattrs: trusted.* attributes on a symlink, a device node, a
// FIFO, a file and a directory work as on ext4 (as root); user.* ones
// are refused on symlinks and device nodes on both.
func TestTrustedXattrs(t *testing.T) {
	mounttest.NeedRoot(t)
	lower, fs := stack(t)
	m := mounttest.MountOpts(t, fs, fusefs.Options{AllowOther: true})
	plain := t.TempDir()
	run := func(root string) []string {
		p := func(n string) string { return filepath.Join(root, n) }
		os.Symlink("target", p("link"))
		unix.Mknod(p("dev"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3)))
		unix.Mkfifo(p("fifo"), 0o644)
		os.WriteFile(p("file"), nil, 0o644)
		os.Mkdir(p("dir"), 0o755)
		var res []string
		for _, n := range []string{"link", "dev", "fifo", "file", "dir"} {
			for _, a := range []string{"trusted.t", "user.u"} {
				err := unix.Lsetxattr(p(n), a, []byte("v-"+n), 0)
				buf := make([]byte, 64)
				k, gerr := unix.Lgetxattr(p(n), a, buf)
				res = append(res, fmt.Sprintf("%s %s: set %s, get %q %s", n, a, errnoOf(err), buf[:max(k, 0)], errnoOf(gerr)))
			}
			buf := make([]byte, 256)
			k, err := unix.Llistxattr(p(n), buf)
			var names []string
			for _, x := range strings.Split(string(buf[:max(k, 0)]), "\x00") {
				if strings.HasPrefix(x, "trusted.") || strings.HasPrefix(x, "user.") {
					names = append(names, x)
				}
			}
			res = append(res, fmt.Sprintf("%s list %q %s", n, sorted(names), errnoOf(err)))
			res = append(res, fmt.Sprintf("%s remove trusted.t: %s", n, errnoOf(unix.Lremovexattr(p(n), "trusted.t"))))
		}
		return res
	}
	want, got := run(plain), run(m.Dir)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("through the mount:\n%q\non ext4:\n%q", got, want)
	}
	// The lower holds no plaintext name.
	lp, _ := fs.lowerPath(context.Background(), "link")
	unix.Lsetxattr(m.Path("link"), "trusted.secretname", []byte("x"), 0)
	buf := make([]byte, 1024)
	k, _ := unix.Llistxattr(filepath.Join(lower, lp), buf)
	if bytes.Contains(buf[:max(k, 0)], []byte("secretname")) || !bytes.HasPrefix(buf, []byte("trusted.")) {
		t.Errorf("lower attributes: %q", buf[:max(k, 0)])
	}
}

// TestDirectoriesAsAnotherUser: the same directory and name operations as
// uid 65534, through the mount and on ext4, with the same results.
func TestDirectoriesAsAnotherUser(t *testing.T) {
	mounttest.NeedRoot(t)
	_, fs := stack(t)
	m := mounttest.MountOpts(t, fs, fusefs.Options{AllowOther: true})
	plain := t.TempDir()
	nobody := mounttest.User{Uid: 65534, Gid: 65534}
	long := strings.Repeat("n", 200)
	target := strings.Repeat("t/", 2000)
	var deep []string // 4,089 bytes of 159-byte names: a lower path of over 6,000
	for i := 0; i < 25; i++ {
		deep = append(deep, strings.Repeat(string(rune('a'+i)), 159))
	}
	deepPath := strings.Join(deep, "/") + "/" + strings.Repeat("z", 89)
	script := `
mkdir -p ` + filepath.Dir(deepPath) + ` && echo deep > ` + deepPath + ` && cat ` + deepPath + ` && rm -r ` + deep[0] + `; echo "deep path: $?"` + `
mkdir src empty full sg && echo x > src/f && echo y > full/g || exit 1
mv -T src empty; echo "rename onto empty: $?"
mkdir src2; mv -T src2 full 2>/dev/null; echo "rename onto full: $?"
rmdir full 2>/dev/null; echo "rmdir full: $?"
mkdir ` + long + ` && mkdir e2 && mv -T e2 ` + long + `; echo "rename onto long: $?"
rmdir ` + long + `; echo "rmdir long: $?"
ln -s ` + target + ` link; echo "long symlink: $? $(readlink link | wc -c) $(stat -c %s link)"
chmod 2777 sg && mkdir -m 700 sg/d && stat -c "setgid child: %a" sg/d
find . | sort
`
	for _, root := range []string{plain, m.Dir} {
		for d := root; d != "/"; d = filepath.Dir(d) {
			if fi, _ := os.Stat(d); fi.Mode().Perm()&0o005 != 0o005 {
				os.Chmod(d, fi.Mode().Perm()|0o005)
			}
		}
		os.Chmod(root, 0o777)
	}
	want, err := nobody.Sh(t, plain, script)
	if err != nil {
		t.Fatalf("ext4: %v %s", err, want)
	}
	got, err := nobody.Sh(t, m.Dir, script)
	if err != nil || got != want {
		t.Errorf("as uid 65534 through the mount (%v):\n%s\non ext4:\n%s", err, got, want)
	}
	// A long symlink of a second user, after the first user's.
	other := mounttest.User{Uid: 65533, Gid: 65533}
	for _, root := range []string{plain, m.Dir} {
		if out, err := other.Sh(t, root, "ln -s "+target+"x link2 && readlink link2 | wc -c"); err != nil || out != "4002\n" {
			t.Errorf("%s: second user's long symlink: %v %q", root, err, out)
		}
	}
}

// TestNameCacheConcurrent: lookups deep in a tree race with renames of its
// top directories back and forth; afterwards every cached directory must
// still be right. A stress test for the race detector and the cache's
// invariant: the window that the cache's generation count closes (an
// entry built from its parent's while the parent is renamed) is too narrow
// for it to hit reliably, so it passes without that count too.
func TestNameCacheConcurrent(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	fs := smallCache(t, dir, 1<<10, 1<<12)
	ctx := context.Background()
	model := map[string]string{"": "/"}
	for _, p := range []string{"a", "a/x", "a/x/y", "a/x/y/z", "b", "b/x", "b/x/y", "b/x/y/z"} {
		if _, err := fs.Mkdir(ctx, p, 0o755); err != nil {
			t.Fatal(err)
		}
		model[p] = "/"
	}
	ref, err := Unlock(ctx, fs.Lower, testPass, false, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 3; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, p := range []string{"a/x/y/z", "b/x/y/z", "a/x/y", "b/x"} {
					fs.ReadDir(ctx, p, false)
				}
			}
		}()
	}
	for i := 0; i < 300; i++ {
		// a and b swap places through c: each rename changes the lower
		// path of everything below it.
		for _, r := range [][2]string{{"a", "c"}, {"b", "a"}, {"c", "b"}} {
			if err := fs.Rename(ctx, r[0], r[1], 0); err != nil {
				t.Fatal(err)
			}
		}
		if i%50 == 49 {
			close(stop)
			wg.Wait()
			checkCache(t, i, fs, ref, model)
			stop = make(chan struct{})
			for w := 0; w < 3; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						for _, p := range []string{"a/x/y/z", "b/x/y/z", "a/x/y", "b/x"} {
							fs.ReadDir(ctx, p, false)
						}
					}
				}()
			}
		}
	}
	close(stop)
	wg.Wait()
	checkCache(t, 300, fs, ref, model)
}
