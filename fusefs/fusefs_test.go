//go:build linux

package fusefs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/mux"
	"cairnfs.dev/cairn/layers/null"
)

// nullStack mounts null over local and returns the mount and the lower dir.
func nullStack(t *testing.T) (*mounttest.Mounted, string) {
	t.Helper()
	lower := t.TempDir()
	os.Chmod(lower, 0o755)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	top := null.New(l)
	t.Cleanup(func() { layer.CloseStack(top) })
	return mounttest.Mount(t, top), lower
}

func mustWrite(t *testing.T, p string, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestReadWriteAppendTruncate(t *testing.T) {
	m, lower := nullStack(t)
	p := m.Path("f")
	mustWrite(t, p, "hello world")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("!!")
	f.Close()
	if got := mustRead(t, p); got != "hello world!!" {
		t.Fatalf("after append: %q", got)
	}
	if err := os.Truncate(p, 5); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, filepath.Join(lower, "f")); got != "hello" {
		t.Fatalf("lower after truncate: %q", got)
	}
	f, _ = os.OpenFile(p, os.O_RDWR, 0)
	f.WriteAt([]byte("J"), 0)
	f.Truncate(8)
	f.Close()
	if got := mustRead(t, p); got != "Jello\x00\x00\x00" {
		t.Fatalf("after write+extend: %q", got)
	}
	if got := mustRead(t, filepath.Join(lower, "f")); got != "Jello\x00\x00\x00" {
		t.Fatalf("lower: %q", got)
	}
	// O_TRUNC through open.
	f, _ = os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	f.Close()
	if fi, _ := os.Stat(filepath.Join(lower, "f")); fi.Size() != 0 {
		t.Fatalf("O_TRUNC left %d bytes", fi.Size())
	}
}

func TestRenameFlags(t *testing.T) {
	m, lower := nullStack(t)
	mustWrite(t, m.Path("a"), "A")
	mustWrite(t, m.Path("b"), "B")
	if err := unix.Renameat2(unix.AT_FDCWD, m.Path("a"), unix.AT_FDCWD, m.Path("b"), layer.RenameNoreplace); err != unix.EEXIST {
		t.Fatalf("RENAME_NOREPLACE over an existing file: %v, want EEXIST", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, m.Path("a"), unix.AT_FDCWD, m.Path("b"), layer.RenameExchange); err != nil {
		t.Fatal(err)
	}
	if mustRead(t, m.Path("a")) != "B" || mustRead(t, filepath.Join(lower, "b")) != "A" {
		t.Fatal("RENAME_EXCHANGE did not swap")
	}
	if err := unix.Renameat2(unix.AT_FDCWD, m.Path("a"), unix.AT_FDCWD, m.Path("c"), layer.RenameNoreplace); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.Path("c"), m.Path("b")); err != nil {
		t.Fatal(err)
	}
	if mustRead(t, m.Path("b")) != "B" {
		t.Fatal("plain rename over a file")
	}
	if _, err := os.Stat(filepath.Join(lower, "a")); !os.IsNotExist(err) {
		t.Fatal("a still in the lower directory")
	}
	// A directory with content, then a file in it through the new name.
	if err := os.MkdirAll(m.Path("d1/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, m.Path("d1/sub/x"), "x")
	if err := os.Rename(m.Path("d1"), m.Path("d2")); err != nil {
		t.Fatal(err)
	}
	if mustRead(t, m.Path("d2/sub/x")) != "x" || mustRead(t, filepath.Join(lower, "d2/sub/x")) != "x" {
		t.Fatal("directory rename")
	}
	// Inode numbers survive renames.
	var before, after unix.Stat_t
	if err := unix.Stat(m.Path("d2/sub/x"), &before); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.Path("d2/sub/x"), m.Path("y")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(m.Path("y"), &after); err != nil {
		t.Fatal(err)
	}
	if before.Ino == 0 || before.Ino != after.Ino {
		t.Fatalf("inode changed on rename: %d -> %d", before.Ino, after.Ino)
	}
}

func TestLinks(t *testing.T) {
	m, lower := nullStack(t)
	mustWrite(t, m.Path("f"), "data")
	if err := os.Link(m.Path("f"), m.Path("h")); err != nil {
		t.Fatal(err)
	}
	var a, b, l unix.Stat_t
	unix.Stat(m.Path("f"), &a)
	unix.Stat(m.Path("h"), &b)
	unix.Stat(filepath.Join(lower, "f"), &l)
	if a.Ino != b.Ino || a.Nlink != 2 || a.Ino != l.Ino {
		t.Fatalf("hard link: ino %d/%d (lower %d), nlink %d", a.Ino, b.Ino, l.Ino, a.Nlink)
	}
	mustWrite(t, m.Path("h"), "changed")
	if mustRead(t, m.Path("f")) != "changed" {
		t.Fatal("hard link does not share data")
	}
	if err := os.Symlink("f", m.Path("s")); err != nil {
		t.Fatal(err)
	}
	if tgt, _ := os.Readlink(m.Path("s")); tgt != "f" {
		t.Fatalf("readlink: %q", tgt)
	}
	if tgt, _ := os.Readlink(filepath.Join(lower, "s")); tgt != "f" {
		t.Fatalf("lower readlink: %q", tgt)
	}
	if mustRead(t, m.Path("s")) != "changed" {
		t.Fatal("following the symlink")
	}
	if err := unix.Mkfifo(m.Path("fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Lstat(filepath.Join(lower, "fifo"), &st)
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Fatalf("mkfifo made mode %o", st.Mode)
	}
}

func TestXattrs(t *testing.T) {
	m, lower := nullStack(t)
	mustWrite(t, m.Path("f"), "x")
	if err := unix.Setxattr(m.Path("f"), "user.color", []byte("blue"), 0); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := unix.Getxattr(m.Path("f"), "user.color", buf)
	if err != nil || string(buf[:n]) != "blue" {
		t.Fatalf("getxattr: %q %v", buf[:n], err)
	}
	n, _ = unix.Getxattr(filepath.Join(lower, "f"), "user.color", buf)
	if string(buf[:n]) != "blue" {
		t.Fatalf("lower xattr: %q", buf[:n])
	}
	n, _ = unix.Listxattr(m.Path("f"), buf)
	if !strings.Contains(string(buf[:n]), "user.color") {
		t.Fatalf("listxattr: %q", buf[:n])
	}
	if err := unix.Setxattr(m.Path("f"), "user.color", []byte("red"), layer.XattrCreate); err != unix.EEXIST {
		t.Fatalf("XATTR_CREATE on existing: %v", err)
	}
	if err := unix.Removexattr(m.Path("f"), "user.color"); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Getxattr(m.Path("f"), "user.color", buf); err != layer.ENOATTR {
		t.Fatalf("after remove: %v", err)
	}
	// On a symlink itself.
	os.Symlink("f", m.Path("s"))
	if err := unix.Lsetxattr(m.Path("s"), "trusted.t", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Lgetxattr(filepath.Join(lower, "s"), "trusted.t", buf); err != nil || string(buf[:n]) != "1" {
		t.Fatalf("lower symlink xattr: %v", err)
	}
}

// as runs a shell command as another user.
func as(uid, gid uint32, groups []uint32, script string) (string, error) {
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	cmd.Dir = "/"
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func owner(t *testing.T, p string) (uint32, uint32) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

// refused runs script as uid (gid = uid) and checks that it failed with the
// message of errno want (EPERM and EACCES are different refusals: ext4 gives
// EPERM for chmod, chown and the sticky bit, EACCES for modes).
func refused(t *testing.T, want unix.Errno, uid uint32, groups []uint32, script, what string) {
	t.Helper()
	out, err := as(uid, uid, groups, script)
	if err == nil {
		t.Fatalf("%s succeeded", what)
	}
	if !strings.Contains(strings.ToLower(out), want.Error()) {
		t.Fatalf("%s: %v %q, want %s (%v)", what, err, out, unix.ErrnoName(want), want)
	}
}

func TestNonRootOwnershipAndPermissions(t *testing.T) {
	mounttest.NeedRoot(t)
	m, lower := nullStack(t)
	if err := os.Mkdir(m.Path("pub"), 0o777); err != nil {
		t.Fatal(err)
	}
	unix.Chmod(m.Path("pub"), 0o1777) // sticky, like /tmp
	// Created objects belong to their creator, in the lower directory too.
	out, err := as(1000, 1000, nil, "echo a > "+m.Path("pub/f1")+" && mkdir "+m.Path("pub/d1")+" && ln -s f1 "+m.Path("pub/s1")+" && mkfifo "+m.Path("pub/p1"))
	if err != nil {
		t.Fatalf("create as 1000: %v %s", err, out)
	}
	for _, n := range []string{"f1", "d1", "s1", "p1"} {
		if u, g := owner(t, filepath.Join(lower, "pub", n)); u != 1000 || g != 1000 {
			t.Fatalf("lower %s owned by %d:%d, want 1000:1000", n, u, g)
		}
	}
	// The owner may chmod; another user may not, nor give the file away.
	if out, err := as(1000, 1000, nil, "chmod 600 "+m.Path("pub/f1")); err != nil {
		t.Fatalf("owner chmod: %v %s", err, out)
	}
	if fi, _ := os.Stat(filepath.Join(lower, "pub/f1")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("lower mode %v", fi.Mode())
	}
	refused(t, unix.EPERM, 1001, nil, "chmod 666 "+m.Path("pub/f1"), "another user's chmod")
	refused(t, unix.EPERM, 1000, nil, "chown 1001 "+m.Path("pub/f1"), "giving a file away")
	refused(t, unix.EACCES, 1001, nil, "cat "+m.Path("pub/f1"), "another user reading a 0600 file")
	// Root may chown.
	if err := os.Chown(m.Path("pub/f1"), 1002, 1002); err != nil {
		t.Fatal(err)
	}
	if u, g := owner(t, filepath.Join(lower, "pub/f1")); u != 1002 || g != 1002 {
		t.Fatalf("after chown: %d:%d", u, g)
	}
	os.Chown(m.Path("pub/f1"), 1000, 1000)
	// Sticky directory: 1001 may not remove or rename 1000's file.
	refused(t, unix.EPERM, 1001, nil, "rm -f "+m.Path("pub/f1"), "another user removing a file of a sticky directory")
	refused(t, unix.EPERM, 1001, nil, "mv "+m.Path("pub/f1")+" "+m.Path("pub/f2"), "another user renaming a file of a sticky directory")
	if out, err := as(1000, 1000, nil, "rm "+m.Path("pub/f1")); err != nil {
		t.Fatalf("owner rm in sticky dir: %v %s", err, out)
	}
	// Supplementary groups count, and setgid directories pass their group on.
	os.Mkdir(m.Path("team"), 0o770)
	os.Chown(m.Path("team"), 0, 2000)
	unix.Chmod(m.Path("team"), 0o2770)
	refused(t, unix.EACCES, 1001, nil, "touch "+m.Path("team/x"), "a user outside the group creating in a 0770 directory")
	if out, err := as(1001, 1001, []uint32{2000}, "touch "+m.Path("team/x")+" && mkdir "+m.Path("team/sub")); err != nil {
		t.Fatalf("member of the group: %v %s", err, out)
	}
	if u, g := owner(t, filepath.Join(lower, "team/x")); u != 1001 || g != 2000 {
		t.Fatalf("file in setgid dir: %d:%d, want 1001:2000", u, g)
	}
	if fi, _ := os.Stat(filepath.Join(lower, "team/sub")); fi.Mode()&os.ModeSetgid == 0 {
		t.Fatal("subdirectory of a setgid directory lost setgid")
	}
}

func TestLargeSparseFile(t *testing.T) {
	m, lower := nullStack(t)
	f, err := os.Create(m.Path("big"))
	if err != nil {
		t.Fatal(err)
	}
	const off = 5 << 30 // beyond 4 GiB
	if _, err := f.WriteAt([]byte("tail"), off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fi, err := os.Stat(m.Path("big"))
	if err != nil || fi.Size() != off+4 {
		t.Fatalf("size %d, %v", fi.Size(), err)
	}
	g, _ := os.Open(m.Path("big"))
	defer g.Close()
	buf := make([]byte, 8)
	n, _ := g.ReadAt(buf, off-4)
	if string(buf[:n]) != "\x00\x00\x00\x00tail" {
		t.Fatalf("read at 5 GiB: %q", buf[:n])
	}
	// SEEK_DATA finds the data after the hole and SEEK_HOLE the hole
	// before it and the end, exactly where the lower file (ext4) has them.
	l, err := os.Open(filepath.Join(lower, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct {
		from   int64
		whence int
		want   int64
	}{{0, unix.SEEK_DATA, off}, {0, unix.SEEK_HOLE, 0}, {off, unix.SEEK_HOLE, off + 4}, {off + 2, unix.SEEK_DATA, off + 2}} {
		d, err := unix.Seek(int(g.Fd()), c.from, c.whence)
		ld, lerr := unix.Seek(int(l.Fd()), c.from, c.whence)
		if err != nil || lerr != nil || d != c.want || d != ld {
			t.Fatalf("lseek(%d, whence %d) = %d %v, want %d (lower: %d %v)", c.from, c.whence, d, err, c.want, ld, lerr)
		}
	}
	if _, err := unix.Seek(int(g.Fd()), off+4, unix.SEEK_DATA); err != unix.ENXIO {
		t.Fatalf("SEEK_DATA at the end: %v, want ENXIO", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(lower, "big"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != off+4 || st.Blocks > 1024 {
		t.Fatalf("lower: size %d, %d blocks (not sparse?)", st.Size, st.Blocks)
	}
}

func TestConcurrentWriters(t *testing.T) {
	m, lower := nullStack(t)
	const writers, chunk, rounds = 8, 4096, 64
	os.WriteFile(m.Path("c"), nil, 0o644)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			f, err := os.OpenFile(m.Path("c"), os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			buf := bytes.Repeat([]byte{byte('a' + w)}, chunk)
			for r := 0; r < rounds; r++ {
				if _, err := f.WriteAt(buf, int64((r*writers+w)*chunk)); err != nil {
					t.Error(err)
				}
			}
		}(w)
	}
	wg.Wait()
	got, _ := os.ReadFile(filepath.Join(lower, "c"))
	if len(got) != writers*chunk*rounds {
		t.Fatalf("size %d", len(got))
	}
	for i := 0; i < len(got); i += chunk {
		want := byte('a' + (i/chunk)%writers)
		if !bytes.Equal(got[i:i+chunk], bytes.Repeat([]byte{want}, chunk)) {
			t.Fatalf("chunk at %d is not all %c", i, want)
		}
	}
}

func TestStatfsAndCopyFileRange(t *testing.T) {
	m, lower := nullStack(t)
	var a, b unix.Statfs_t
	if err := unix.Statfs(m.Dir, &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(lower, &b); err != nil {
		t.Fatal(err)
	}
	if a.Blocks == 0 || a.Blocks != b.Blocks || a.Bsize != b.Bsize || a.Files != b.Files {
		t.Fatalf("statfs differs from the lower: %+v vs %+v", a, b)
	}
	mustWrite(t, m.Path("src"), "0123456789")
	src, err := os.Open(m.Path("src"))
	if err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(m.Path("dst"))
	if err != nil {
		t.Fatal(err)
	}
	var offIn, offOut int64 = 2, 0
	n, err := unix.CopyFileRange(int(src.Fd()), &offIn, int(dst.Fd()), &offOut, 5, 0)
	src.Close()
	dst.Close()
	if err != nil || n != 5 || mustRead(t, filepath.Join(lower, "dst")) != "23456" {
		t.Fatalf("copy_file_range: %d %v", n, err)
	}
}

// counter counts the reads and writes that reach the layer.
type counter struct {
	layer.Base
	io *atomic.Int64
}

type countFile struct {
	layer.BaseFile
	io *atomic.Int64
}

func (c *counter) Open(ctx context.Context, p string, flags int) (layer.File, error) {
	f, err := c.Base.Open(ctx, p, flags)
	if err != nil {
		return nil, err
	}
	return &countFile{layer.BaseFile{Lower: f}, c.io}, nil
}

func (c *countFile) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	c.io.Add(1)
	return c.BaseFile.ReadAt(ctx, p, off)
}

// TestPassthroughInUse shows that with passthrough the kernel does the I/O:
// no read reaches the stack. Without it, every read does.
func TestPassthroughInUse(t *testing.T) {
	for _, pt := range []bool{true, false} {
		lower := t.TempDir()
		os.WriteFile(filepath.Join(lower, "f"), bytes.Repeat([]byte("x"), 1<<20), 0o644)
		l, _ := local.New(lower)
		var n atomic.Int64
		m := mounttest.MountOpts(t, &counter{layer.Base{Lower: l}, &n}, fusefs.Options{NoPassthrough: !pt})
		if m.Server.Passthrough != pt {
			t.Fatalf("Passthrough = %v, want %v", m.Server.Passthrough, pt)
		}
		if got := mustRead(t, m.Path("f")); len(got) != 1<<20 {
			t.Fatalf("read %d bytes", len(got))
		}
		if pt && n.Load() != 0 {
			t.Fatalf("passthrough on, but %d reads reached the stack", n.Load())
		}
		if !pt && n.Load() == 0 {
			t.Fatal("passthrough off, but no read reached the stack")
		}
		m.Unmount()
		l.Close()
	}
}

// recorder records who created what.
type recorder struct {
	layer.Base
	mu   sync.Mutex
	seen []layer.Caller
}

func (r *recorder) Create(ctx context.Context, p string, flags int, mode uint32) (layer.File, layer.Attr, error) {
	c := layer.CallerOf(ctx)
	r.mu.Lock()
	r.seen = append(r.seen, layer.Caller{Uid: c.Uid, Gid: c.Gid, Pid: c.Pid})
	r.mu.Unlock()
	return r.Base.Create(ctx, p, flags, mode)
}

func TestCallerReachesLayers(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	os.Chmod(lower, 0o777)
	l, _ := local.New(lower)
	defer l.Close()
	r := &recorder{Base: layer.Base{Lower: l}}
	m := mounttest.Mount(t, r)
	if out, err := as(1234, 4321, nil, "touch "+m.Path("mine")); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) != 1 || r.seen[0].Uid != 1234 || r.seen[0].Gid != 4321 || r.seen[0].Pid == 0 {
		t.Fatalf("callers seen: %+v", r.seen)
	}
}

func TestFanOutMux(t *testing.T) {
	// Two file systems: their first files have equal inode numbers.
	d0, d1 := mounttest.Tmpfs(t, ""), mounttest.Tmpfs(t, "")
	l0, _ := local.New(d0)
	l1, _ := local.New(d1)
	mx, err := mux.New([]layer.FS{l0, null.New(l1)}, []string{"left", "right"})
	if err != nil {
		t.Fatal(err)
	}
	defer layer.CloseStack(mx)
	m := mounttest.Mount(t, mx)
	ents, err := os.ReadDir(m.Dir)
	if err != nil || len(ents) != 2 || ents[0].Name() != "left" || ents[1].Name() != "right" {
		t.Fatalf("root: %v %v", ents, err)
	}
	mustWrite(t, m.Path("left/a"), "L")
	mustWrite(t, m.Path("right/b"), "R")
	if mustRead(t, filepath.Join(d0, "a")) != "L" || mustRead(t, filepath.Join(d1, "b")) != "R" {
		t.Fatal("files did not land in their lowers")
	}
	if mustRead(t, m.Path("left/a")) != "L" || mustRead(t, m.Path("right/b")) != "R" {
		t.Fatal("the mount does not read back what each lower holds")
	}
	if err := os.Rename(m.Path("left/a"), m.Path("right/a")); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename across lowers: %v, want EXDEV", err)
	}
	if err := os.WriteFile(m.Path("top-level"), nil, 0o644); err == nil {
		t.Fatal("created a file in mux's root")
	}
	if layer.StackChanges(mx)&layer.ChangesPlacement == 0 {
		t.Fatal("mux must declare placement changes")
	}
}

func TestMmapThroughProcess(t *testing.T) {
	for _, extra := range [][]string{nil, {"--no-passthrough"}} {
		lower := t.TempDir()
		p := mounttest.MountSpec(t, "mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = \""+lower+"\"\n[layer.top]\ntype = \"null\"\nover = \"base\"\n", extra...)
		f, err := os.OpenFile(p.Path("m"), os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(8192)
		mem, err := unix.Mmap(int(f.Fd()), 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		copy(mem[4000:], "mapped")
		unix.Msync(mem, unix.MS_SYNC)
		unix.Munmap(mem)
		f.Close()
		b := []byte(mustRead(t, filepath.Join(lower, "m")))
		if string(b[4000:4006]) != "mapped" {
			t.Fatalf("%v: lower does not hold the mmap write", extra)
		}
		p.Unmount()
	}
}

func TestChownDropsSetid(t *testing.T) {
	mounttest.NeedRoot(t)
	m, lower := nullStack(t)
	os.Mkdir(m.Path("u"), 0o777)
	unix.Chmod(m.Path("u"), 0o777)
	lowerMode := func(name string) (uint32, uint32) {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(lower, "u", name), &st); err != nil {
			t.Fatal(err)
		}
		return st.Mode & 07777, st.Gid
	}
	// Each case: a user makes the file set-id (checked), then a change by
	// an unprivileged user must drop the bits, in the mount and the lower.
	for _, c := range []struct {
		name, setup, change string
		want                uint32
	}{
		{"chgrp", "chmod 6775 prog", "chgrp 3000 prog", 0o775},
		{"chmod by a non-member", "chmod 6775 prog && chgrp 3000 prog && chmod 6775 prog", "", 0},
		{"write by another user", "chmod 6777 prog", "65534:echo y >> prog", 0o777},
		{"truncate by another user", "chmod 6777 prog", "65534:truncate -s 1 prog", 0o777},
		{"open O_TRUNC by another user", "chmod 6777 prog", "65534:: > prog", 0o777},
	} {
		os.Remove(m.Path("u/prog"))
		if out, err := as(1000, 1000, []uint32{3000}, "cd "+m.Path("u")+" && echo x > prog && "+c.setup); err != nil {
			t.Fatalf("%s: %v %s", c.name, err, out)
		}
		if mode, _ := lowerMode("prog"); mode&(unix.S_ISUID|unix.S_ISGID) != unix.S_ISUID|unix.S_ISGID {
			t.Fatalf("%s: the set-id bits were not set before the test: mode %04o", c.name, mode)
		}
		if c.change == "" {
			// chmod g+s by the owner, who is no longer in the file's group.
			if out, err := as(1000, 1000, nil, "chmod 2775 "+m.Path("u/prog")); err != nil {
				t.Fatalf("%s: %v %s", c.name, err, out)
			}
			c.want = 0o775
		} else if u, script, ok := strings.Cut(c.change, ":"); ok && u == "65534" {
			if out, err := as(65534, 65534, nil, "cd "+m.Path("u")+" && "+script); err != nil {
				t.Fatalf("%s: %v %s", c.name, err, out)
			}
		} else if out, err := as(1000, 1000, []uint32{3000}, "cd "+m.Path("u")+" && "+c.change); err != nil {
			t.Fatalf("%s: %v %s", c.name, err, out)
		}
		var st unix.Stat_t
		if err := unix.Stat(m.Path("u/prog"), &st); err != nil {
			t.Fatal(err)
		}
		if mode, _ := lowerMode("prog"); mode != c.want || st.Mode&07777 != c.want {
			t.Errorf("%s: mode %04o in the mount, %04o in the lower, want %04o: the set-id bits must be dropped", c.name, st.Mode&07777, mode, c.want)
		}
	}
}

// panicky panics in Getattr of one name: the mount must survive.
type panicky struct{ layer.Base }

func (p *panicky) Getattr(ctx context.Context, path string) (layer.Attr, error) {
	if path == "boom" {
		panic("a bug in a layer")
	}
	return p.Base.Getattr(ctx, path)
}

func TestLayerPanicIsEIO(t *testing.T) {
	lower := t.TempDir()
	os.WriteFile(filepath.Join(lower, "boom"), nil, 0o644)
	os.WriteFile(filepath.Join(lower, "fine"), []byte("ok"), 0o644)
	l, _ := local.New(lower)
	defer l.Close()
	m := mounttest.Mount(t, &panicky{layer.Base{Lower: l}})
	if _, err := os.Stat(m.Path("boom")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("stat of the panicking name: %v, want EIO", err)
	}
	if mustRead(t, m.Path("fine")) != "ok" {
		t.Fatal("the mount did not survive the panic")
	}
}

func TestNoXattr(t *testing.T) {
	lower := t.TempDir()
	l, _ := local.New(lower)
	defer l.Close()
	m := mounttest.MountOpts(t, null.New(l), fusefs.Options{NoXattr: true})
	mustWrite(t, m.Path("f"), "x")
	if err := unix.Setxattr(m.Path("f"), "user.a", []byte("1"), 0); err != unix.EOPNOTSUPP {
		t.Fatalf("setxattr with xattrs off: %v, want EOPNOTSUPP", err)
	}
	if mustRead(t, m.Path("f")) != "x" {
		t.Fatal("read")
	}
}

// A mount without allow_other leaves permission checks to the lower file
// system (no default_permissions): only the mounter gets in, and root's
// answers are those of root on the lower directory.
func TestPrivateMountPermissions(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	os.Chmod(lower, 0o755)
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dirStats := &getattrCounter{Base: layer.Base{Lower: l}, path: "d"}
	m := mounttest.MountOpts(t, dirStats, fusefs.Options{NoPassthrough: true})
	mustWrite(t, m.Path("f"), "secret")
	if out, err := as(1000, 1000, nil, "ls "+m.Path("")); err == nil {
		t.Fatalf("another user listed a mount without allow_other: %s", out)
	}
	// Root reads and writes a file of mode 000, as on ext4.
	if err := os.Chmod(m.Path("f"), 0); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, m.Path("f")); got != "secret" {
		t.Fatalf("root read %q", got)
	}
	if err := unix.Access(m.Path("f"), unix.W_OK); err != nil {
		t.Fatalf("access(W_OK) as root: %v", err)
	}
	// ... but cannot execute a file without any x bit.
	if err := unix.Access(m.Path("f"), unix.X_OK); err != unix.EACCES {
		t.Fatalf("access(X_OK) of a mode-000 file as root: %v, want EACCES", err)
	}
	// The shell execs it: this process must not be inside its own
	// fork/exec (holding syscall.ForkLock) while the kernel asks it to
	// serve the lookup of the file.
	if out, err := as(0, 0, nil, "exec "+m.Path("f")); err == nil || !strings.Contains(out, "ermission denied") {
		t.Fatalf("exec of a mode-000 file: %v %s, want a permission error", err, out)
	}
	// Creates and unlinks in one directory: each one changes the
	// directory, and with default_permissions the kernel would fetch its
	// attributes again (a GETATTR) before the next permission check.
	if err := os.Mkdir(m.Path("d"), 0o755); err != nil {
		t.Fatal(err)
	}
	dirStats.n.Store(0)
	const n = 100
	for i := 0; i < n; i++ {
		mustWrite(t, m.Path(fmt.Sprintf("d/f%d", i)), "y")
	}
	for i := 0; i < n; i++ {
		if err := os.Remove(m.Path(fmt.Sprintf("d/f%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if got := dirStats.n.Load(); got > n/10 {
		t.Fatalf("%d creates and %d unlinks in d made %d GETATTRs of d: the kernel checks permissions itself", n, n, got)
	}
	if ents, _ := os.ReadDir(filepath.Join(lower, "d")); len(ents) != 0 {
		t.Fatalf("lower d not empty after removing everything: %d entries", len(ents))
	}
}

// getattrCounter counts the Getattr calls of one path.
type getattrCounter struct {
	layer.Base
	path string
	n    atomic.Int64
}

func (c *getattrCounter) Getattr(ctx context.Context, p string) (layer.Attr, error) {
	if p == c.path {
		c.n.Add(1)
	}
	return c.Base.Getattr(ctx, p)
}

// TestChownByRootSetidAsExt4: a chown or chgrp by root drops the set-id
// bits as ext4 does (the set-user-ID bit always, the set-group-ID bit of a
// group-executable file), judged without a GETATTR before the change.
func TestChownByRootSetidAsExt4(t *testing.T) {
	mounttest.NeedRoot(t)
	m, _ := nullStack(t)
	ext4 := t.TempDir()
	for _, bits := range []uint32{0o6755, 0o6745, 0o2755, 0o2745, 0o4700} {
		for _, change := range []struct {
			name     string
			uid, gid int
		}{{"chown", 1000, -1}, {"chgrp", -1, 3000}, {"chown both", 1000, 3000}} {
			mode := func(dir string) uint32 {
				p := filepath.Join(dir, "f")
				os.Remove(p)
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := unix.Chmod(p, bits); err != nil {
					t.Fatal(err)
				}
				if err := os.Lchown(p, change.uid, change.gid); err != nil {
					t.Fatal(err)
				}
				var st unix.Stat_t
				if err := unix.Stat(p, &st); err != nil {
					t.Fatal(err)
				}
				return st.Mode & 0o7777
			}
			if want, got := mode(ext4), mode(m.Path("")); got != want {
				t.Errorf("%04o, %s by root: %04o through the mount, %04o on ext4", bits, change.name, got, want)
			}
		}
	}
}
