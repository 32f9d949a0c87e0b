//go:build linux

package union_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/union"
)

func localFS(t testing.TB, d string) layer.FS {
	l, err := local.New(d)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// mountUnion mounts a union of upper (RW) over lower (RO).
func mountUnion(t testing.TB, upper, lower string) *mounttest.Mounted {
	u, err := union.New([]fanout.Branch{{FS: localFS(t, upper), Mode: fanout.RW}, {FS: localFS(t, lower), Mode: fanout.RO}}, union.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(u) })
	return mounttest.Mount(t, u)
}

func write(t testing.TB, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lowerTree is the read-only branch of the tests.
func lowerTree(t testing.TB, d string) {
	write(t, filepath.Join(d, "f"), "lower f\n")
	write(t, filepath.Join(d, "d", "g"), "lower g\n")
	write(t, filepath.Join(d, "d", "e", "h"), "lower h\n")
	write(t, filepath.Join(d, "d", "k"), "lower k\n")
	if err := os.Symlink("f", filepath.Join(d, "s")); err != nil {
		t.Fatal(err)
	}
	// A sparse file: a copy-up keeps its hole.
	f, err := os.Create(filepath.Join(d, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("end"), 8<<20)
	f.Close()
	if err := unix.Setxattr(filepath.Join(d, "d", "k"), "user.note", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(d, "d", "k"), 0o640)
}

func isWhiteout(t testing.TB, p string) bool {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func opaque(p string) bool {
	b := make([]byte, 8)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", b)
	return err == nil && string(b[:n]) == "y"
}

// TestUnionCopyUpWhiteoutOpaque: the merged view, and what each change
// leaves on the branches.
func TestUnionCopyUpWhiteoutOpaque(t *testing.T) {
	up, lo := t.TempDir(), t.TempDir()
	lowerTree(t, lo)
	m := mountUnion(t, up, lo)

	if got := read(t, m.Path("f")); got != "lower f\n" {
		t.Fatalf("read f: %q", got)
	}
	names := func(d string) string {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, e := range ents {
			n = append(n, e.Name())
		}
		sort.Strings(n)
		return strings.Join(n, " ")
	}
	if got := names(m.Dir); got != "d f s sparse" {
		t.Fatalf("root lists %q", got)
	}

	// A write copies up; the lower branch is not touched.
	before, _ := os.Stat(m.Path("f"))
	f, err := os.OpenFile(m.Path("f"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("upper\n")
	f.Close()
	if got := read(t, m.Path("f")); got != "lower f\nupper\n" {
		t.Fatalf("f after append: %q", got)
	}
	if read(t, filepath.Join(lo, "f")) != "lower f\n" || read(t, filepath.Join(up, "f")) != "lower f\nupper\n" {
		t.Fatal("the copy-up did not go to the upper branch alone")
	}
	if after, _ := os.Stat(m.Path("f")); ino(after) != ino(before) {
		t.Fatalf("the copy-up changed f's inode number: %d, then %d", ino(before), ino(after))
	}

	// chmod of a lower file: copied up with its xattrs and owner, mode
	// changed; its directory copied up with its own mode.
	if err := os.Chmod(m.Path("d", "k"), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(up, "d", "k"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("upper d/k: %v %v", st, err)
	}
	if b := make([]byte, 16); true {
		n, err := unix.Getxattr(m.Path("d", "k"), "user.note", b)
		if err != nil || string(b[:n]) != "kept" {
			t.Fatalf("xattr after copy-up: %q %v", b[:n], err)
		}
	}
	if st, _ := os.Stat(filepath.Join(lo, "d", "k")); st.Mode().Perm() != 0o640 {
		t.Fatal("the lower file changed")
	}

	// A sparse file stays sparse.
	if err := os.Truncate(m.Path("sparse"), 8<<20+3); err != nil {
		t.Fatal(err)
	}
	var sst unix.Stat_t
	if err := unix.Stat(filepath.Join(up, "sparse"), &sst); err != nil || sst.Blocks > 64 {
		t.Fatalf("copied-up sparse file: %d blocks, %v", sst.Blocks, err)
	}

	// Removing a lower name leaves a whiteout; the listing hides it.
	if err := os.Remove(m.Path("d", "g")); err != nil {
		t.Fatal(err)
	}
	if !isWhiteout(t, filepath.Join(up, "d", "g")) {
		t.Fatal("no whiteout for d/g")
	}
	if _, err := os.Stat(m.Path("d", "g")); !os.IsNotExist(err) {
		t.Fatalf("d/g still there: %v", err)
	}
	if got := names(m.Path("d")); got != "e k" {
		t.Fatalf("d lists %q", got)
	}
	// ... and a new file of that name replaces the whiteout.
	write(t, m.Path("d", "g"), "new g\n")
	if read(t, m.Path("d", "g")) != "new g\n" || isWhiteout(t, filepath.Join(up, "d", "g")) {
		t.Fatal("a new d/g over the whiteout")
	}

	// rm -r of a merged directory, then mkdir: opaque.
	if err := os.RemoveAll(m.Path("d", "e")); err != nil {
		t.Fatal(err)
	}
	if !isWhiteout(t, filepath.Join(up, "d", "e")) {
		t.Fatal("no whiteout for directory d/e")
	}
	if err := os.Mkdir(m.Path("d", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !opaque(filepath.Join(up, "d", "e")) {
		t.Fatal("the new d/e is not opaque")
	}
	if got := names(m.Path("d", "e")); got != "" {
		t.Fatalf("the new d/e lists %q", got)
	}

	// A rename of a lower file: the old name is whited out.
	if err := os.Rename(m.Path("s"), m.Path("s2")); err != nil {
		t.Fatal(err)
	}
	if l, err := os.Readlink(m.Path("s2")); err != nil || l != "f" {
		t.Fatalf("renamed symlink: %q %v", l, err)
	}
	if !isWhiteout(t, filepath.Join(up, "s")) {
		t.Fatal("no whiteout for the renamed s")
	}
	// A merged directory cannot be renamed (EXDEV: mv copies).
	if err := os.Rename(m.Path("d"), m.Path("d2")); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename of a merged directory: %v", err)
	}
	// A copy keeps its original's inode number (one link); objects of the
	// two branches never share one.
	var lst, ust unix.Stat_t
	unix.Lstat(filepath.Join(lo, "d", "k"), &lst)
	if err := unix.Lstat(m.Path("d", "k"), &ust); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(m.Path("f")); true {
		// f was copied up while open: its inode number is the same as
		// that of its first lookup, and of fstat on an open copy.
		g, err := os.Open(m.Path("f"))
		if err != nil {
			t.Fatal(err)
		}
		gi, _ := g.Stat()
		g.Close()
		if ino(gi) != ino(fi) {
			t.Fatalf("fstat and stat of f: %d, %d", ino(gi), ino(fi))
		}
	}
	if n, _ := unix.Listxattr(m.Path("d", "k"), make([]byte, 256)); n != len("user.note\x00") {
		t.Fatalf("listxattr of a copy shows %d bytes: the union's side data leaks", n)
	}
	a, _ := os.Stat(m.Path("d", "k"))
	b, _ := os.Stat(m.Path("sparse"))
	c, _ := os.Stat(m.Path("d", "g"))
	if ino(a) == ino(b) || ino(a) == ino(c) || ino(b) == ino(c) {
		t.Fatal("two objects share an inode number")
	}
	// A listing shows the same inode numbers as stat, copies included.
	for name, want := range direntInos(t, m.Path("d")) {
		var st unix.Stat_t
		if err := unix.Lstat(m.Path("d", name), &st); err != nil || st.Ino != want {
			t.Errorf("d/%s: the listing says inode %d, stat %d (%v)", name, want, st.Ino, err)
		}
	}
	// After a remount, copies keep their inode numbers.
	fino, _ := os.Stat(m.Path("f"))
	m.Unmount()
	m = mountUnion(t, up, lo)
	if again, err := os.Stat(m.Path("f")); err != nil || ino(again) != ino(fino) {
		t.Fatalf("f after a remount: %v, inode %d, was %d", err, ino(again), ino(fino))
	}
	// Nothing temporary is left.
	filepath.WalkDir(up, func(p string, e fs.DirEntry, err error) error {
		if strings.Contains(p, ".cairn-union-tmp") {
			t.Errorf("left in the upper branch: %s", p)
		}
		return nil
	})
}

func ino(fi os.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }

// TestUnionModel runs the namespace model through a union whose lower
// branch holds a tree the oracle holds too: operations meet lower names,
// and copy up, white out and make opaque. The upper branch is a plain
// directory, a zstd stack or a crypt stack: a union stacks over anything.
func TestUnionModel(t *testing.T) {
	for _, kind := range []string{"local", "zstd", "crypt", "rw+rw"} {
		t.Run(kind, func(t *testing.T) {
			up, lo, oracle := t.TempDir(), t.TempDir(), t.TempDir()
			for w := 0; w < 2; w++ {
				for _, base := range []string{lo, oracle} {
					sub := filepath.Join(base, fmt.Sprintf("fsx-tree-%d", w))
					for _, p := range []string{"a/a", "a/b", "b", "c/d/a", "d/c"} {
						write(t, filepath.Join(sub, p), "lower "+p+"\n")
					}
					os.MkdirAll(filepath.Join(sub, "c", "c"), 0o755)
					os.Symlink("a/b", filepath.Join(sub, "a", "c"))
				}
			}
			upper := localFS(t, up)
			switch kind {
			case "zstd":
				z, err := codec.New(upper, "zstd", codec.Options{Level: 1})
				if err != nil {
					t.Fatal(err)
				}
				upper = z
			case "crypt":
				ctx, pass := context.Background(), []byte("union")
				if _, err := crypt.Init(ctx, upper, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
					t.Fatal(err)
				}
				c, err := crypt.Unlock(ctx, upper, pass, false, crypt.Options{})
				if err != nil {
					t.Fatal(err)
				}
				upper = c
			}
			loMode := fanout.RO
			if kind == "rw+rw" {
				loMode = fanout.RW // two writable branches, mergerfs's way
			}
			u, err := union.New([]fanout.Branch{{FS: upper, Mode: fanout.RW}, {FS: localFS(t, lo), Mode: loMode}}, union.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { layer.CloseStack(u) })
			m := mounttest.Mount(t, u)
			fsx.RunTree(t, fsx.TreeConfig{Dir: m.Dir, Oracle: oracle, Ops: 1500, Prepared: true, RenameEXDEV: true, NoDirNlink: true})
			// And the bytes: the data model, on new files of the upper branch.
			fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: 2000, MaxSize: 256 << 10})
		})
	}
}

// describe lists a tree as the merged view shows it: names, types, modes,
// sizes, contents, symlink targets, user xattrs.
func describe(t testing.TB, root string) string {
	var out []string
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			out = append(out, p+": "+err.Error())
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			out = append(out, rel+": "+err.Error())
			return nil
		}
		line := fmt.Sprintf("%s %o", rel, st.Mode)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			line += fmt.Sprintf(" %d %q", st.Size, b)
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			line += " -> " + l
		case unix.S_IFCHR:
			line += fmt.Sprintf(" rdev %d", st.Rdev)
		}
		if b := make([]byte, 64); true {
			if n, err := unix.Lgetxattr(p, "user.note", b); err == nil {
				line += " note=" + string(b[:n])
			}
		}
		out = append(out, line)
		return nil
	})
	return strings.Join(out, "\n")
}

// describeUpper lists an upper branch as overlayfs reads it: names, types,
// whiteouts and opaque marks (not the kernel's own bookkeeping xattrs).
func describeUpper(t testing.TB, root string) string {
	var out []string
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		unix.Lstat(p, &st)
		line := fmt.Sprintf("%s %o", rel, st.Mode&unix.S_IFMT)
		if st.Mode&unix.S_IFMT == unix.S_IFCHR {
			line += fmt.Sprintf(" whiteout=%v", st.Rdev == 0)
		}
		if opaque(p) {
			line += " opaque"
		}
		out = append(out, line)
		return nil
	})
	return strings.Join(out, "\n")
}

// script is the same sequence of changes for both unions.
func script(t testing.TB, m string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(filepath.Join(m, "f"), os.O_WRONLY|os.O_APPEND, 0)
	must(err)
	f.WriteString("more\n")
	f.Close()
	must(os.Remove(filepath.Join(m, "d", "g")))
	must(os.RemoveAll(filepath.Join(m, "d", "e")))
	must(os.Mkdir(filepath.Join(m, "d", "e"), 0o750))
	write(t, filepath.Join(m, "d", "e", "new"), "new\n")
	must(os.Chmod(filepath.Join(m, "d", "k"), 0o604))
	must(os.Rename(filepath.Join(m, "s"), filepath.Join(m, "s2")))
	must(os.Mkdir(filepath.Join(m, "n"), 0o755))
	write(t, filepath.Join(m, "n", "x"), "x\n")
	must(os.Symlink("n/x", filepath.Join(m, "nx")))
	must(os.Link(filepath.Join(m, "n", "x"), filepath.Join(m, "n", "y")))
	must(unix.Setxattr(filepath.Join(m, "f"), "user.note", []byte("set"), 0))
}

func overlayMount(t testing.TB, lower, upper string) string {
	work, mnt := t.TempDir(), t.TempDir()
	out, err := exec.Command("mount", "-t", "overlay", "overlay", "-o",
		"lowerdir="+lower+",upperdir="+upper+",workdir="+work, mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("mount -t overlay: %v: %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(mnt, 0) })
	return mnt
}

func copyTree(t testing.TB, src, dst string) {
	if out, err := exec.Command("cp", "-a", src+"/.", dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
}

// TestUnionAgainstOverlayfs runs one script on a cairn union and on the
// kernel's overlayfs over copies of one lower branch: the merged trees and
// the upper branches must be alike. Then each upper is read by the other:
// the kernel mounts cairn's upper, cairn serves the kernel's, and both
// show the same tree.
func TestUnionAgainstOverlayfs(t *testing.T) {
	lo1, lo2 := t.TempDir(), t.TempDir()
	lowerTree(t, lo1)
	copyTree(t, lo1, lo2)
	up1, up2 := t.TempDir(), t.TempDir()

	m := mountUnion(t, up1, lo1)
	k := overlayMount(t, lo2, up2)
	script(t, m.Dir)
	script(t, k)
	cairnView, kernelView := describe(t, m.Dir), describe(t, k)
	if cairnView != kernelView {
		t.Fatalf("merged trees differ:\ncairn:\n%s\nkernel overlayfs:\n%s", cairnView, kernelView)
	}
	if a, b := describeUpper(t, up1), describeUpper(t, up2); a != b {
		t.Fatalf("upper branches differ:\ncairn:\n%s\nkernel overlayfs:\n%s", a, b)
	}
	m.Unmount()
	unix.Unmount(k, 0)

	// Each reads the other's upper branch.
	k1 := overlayMount(t, lo1, up1)
	if got := describe(t, k1); got != cairnView {
		t.Fatalf("the kernel's overlayfs over cairn's upper:\n%s\nwant:\n%s", got, cairnView)
	}
	unix.Unmount(k1, 0)
	m2 := mountUnion(t, up2, lo2)
	if got := describe(t, m2.Dir); got != kernelView {
		t.Fatalf("cairn over the kernel's upper:\n%s\nwant:\n%s", got, kernelView)
	}
	if !bytes.Equal([]byte(read(t, m2.Path("f"))), []byte("lower f\nmore\n")) {
		t.Fatal("f through cairn over the kernel's upper")
	}
}

// TestUnionHardLinksCopyUp: two names of one file of the read-only branch
// stay one file when either is copied up: the other name shows the new
// bytes and the same inode number, and the link count is right once both
// names were looked up.
func TestUnionHardLinksCopyUp(t *testing.T) {
	up, lo := t.TempDir(), t.TempDir()
	write(t, filepath.Join(lo, "a"), "one file\n")
	os.Mkdir(filepath.Join(lo, "d"), 0o755)
	if err := os.Link(filepath.Join(lo, "a"), filepath.Join(lo, "d", "b")); err != nil {
		t.Fatal(err)
	}
	m := mountUnion(t, up, lo)
	sa, _ := os.Stat(m.Path("a"))
	f, err := os.OpenFile(m.Path("a"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("changed\n")
	f.Close()
	if got := read(t, m.Path("d", "b")); got != "one file\nchanged\n" {
		t.Fatalf("the other name reads %q", got)
	}
	var st1, st2 unix.Stat_t
	unix.Stat(m.Path("a"), &st1)
	unix.Stat(m.Path("d", "b"), &st2)
	if st1.Ino != st2.Ino || st1.Ino != ino(sa) || st1.Nlink != 2 || st2.Nlink != 2 {
		t.Fatalf("a: ino %d nlink %d; d/b: ino %d nlink %d; a before: ino %d", st1.Ino, st1.Nlink, st2.Ino, st2.Nlink, ino(sa))
	}
	var u1, u2 unix.Stat_t
	if unix.Stat(filepath.Join(up, "a"), &u1) != nil || unix.Stat(filepath.Join(up, "d", "b"), &u2) != nil || u1.Ino != u2.Ino {
		t.Fatal("the two names are not one file in the upper branch")
	}
	if read(t, filepath.Join(lo, "a")) != "one file\n" {
		t.Fatal("the lower file changed")
	}
	ents, _ := os.ReadDir(m.Dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".cairn-union") {
			t.Fatalf("the root lists %s", e.Name())
		}
	}
	// Removing one name leaves the other.
	if err := os.Remove(m.Path("a")); err != nil {
		t.Fatal(err)
	}
	if got := read(t, m.Path("d", "b")); got != "one file\nchanged\n" {
		t.Fatalf("d/b after a is removed: %q", got)
	}
}

// direntInos lists dir with getdents64 and returns each name's d_ino.
func direntInos(t testing.TB, dir string) map[string]uint64 {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	out := map[string]uint64{}
	buf := make([]byte, 1<<16)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
		for b := buf[:n]; len(b) > 0; {
			ino := binary.LittleEndian.Uint64(b)
			reclen := binary.LittleEndian.Uint16(b[16:])
			name := string(bytes.TrimRight(b[19:reclen], "\x00"))
			if name != "." && name != ".." {
				out[name] = ino
			}
			b = b[reclen:]
		}
	}
}

// TestUnionCopyUpAsAnotherUser: uid 65534 (allow_other) writes its own file
// of the read-only branch, is refused another's 0644 file and a 0000 one,
// and may not remove a name from root's 0755 directory, as on ext4; the
// copy keeps its owner and mode, and the branch is not touched.
func TestUnionCopyUpAsAnotherUser(t *testing.T) {
	mounttest.NeedRoot(t)
	nobody := mounttest.User{Uid: 65534, Gid: 65534}
	up, lo, ext4 := t.TempDir(), t.TempDir(), t.TempDir()
	for _, d := range []string{lo, ext4} {
		os.Chmod(d, 0o755)
		write(t, filepath.Join(d, "mine"), "mine\n")
		os.Chown(filepath.Join(d, "mine"), 65534, 65534)
		os.Chmod(filepath.Join(d, "mine"), 0o640)
		write(t, filepath.Join(d, "roots"), "roots\n")
		write(t, filepath.Join(d, "none"), "none\n")
		os.Chmod(filepath.Join(d, "none"), 0)
	}
	os.Chmod(up, 0o755)
	os.Chmod(filepath.Dir(up), 0o755)
	m := mountUnion(t, up, lo)
	script := `echo more >> mine && echo ok1; echo x >> roots 2>/dev/null || echo refused2; cat none 2>/dev/null || echo refused3; rm -f roots 2>/dev/null || echo refused4; cat mine`
	want, err := nobody.Sh(t, ext4, script)
	if err != nil {
		t.Fatalf("on ext4: %v: %s", err, want)
	}
	got, err := nobody.Sh(t, m.Dir, script)
	if err != nil || got != want {
		t.Fatalf("as uid 65534 through the union:\n%s(%v)\non ext4:\n%s", got, err, want)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(up, "mine"), &st); err != nil || st.Uid != 65534 || st.Gid != 65534 || st.Mode&0o7777 != 0o640 {
		t.Fatalf("the copy: uid %d gid %d mode %o (%v)", st.Uid, st.Gid, st.Mode&0o7777, err)
	}
	if read(t, filepath.Join(lo, "mine")) != "mine\n" || exists(filepath.Join(up, "roots")) || exists(filepath.Join(up, "none")) {
		t.Fatal("the read-only branch changed, or a refused file was copied up")
	}
}
