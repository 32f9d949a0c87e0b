//go:build linux

package fusefs_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/null"
	"cairnfs.dev/cairn/layers/union"
)

// dropCaches makes the kernel forget the dentries and inodes it does not
// use, the mount's (it sends FORGET) and the lower's alike.
func dropCaches(t *testing.T) {
	t.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Fatalf("drop caches: %v", err)
	}
}

func handleOf(t *testing.T, p string) unix.FileHandle {
	t.Helper()
	h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, p, 0)
	if err != nil {
		t.Fatalf("name_to_handle_at %s: %v", p, err)
	}
	return h
}

// openHandle opens h on the mount at dir.
func openHandle(dir string, h unix.FileHandle, flags int) (int, error) {
	mfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(mfd)
	return unix.OpenByHandleAt(mfd, h, flags)
}

// cryptAgain is a crypt layer over lower: a new volume the first time, the
// same one unlocked again after.
func cryptAgain(t *testing.T, lower string) layer.FS {
	l := localLower(t, lower)
	if _, err := os.Stat(filepath.Join(lower, crypt.ConfigName)); err != nil {
		return newCrypt(t, l)
	}
	fs, err := crypt.Unlock(context.Background(), l, []byte("caps test"), false, crypt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// handleCase is one object of TestFileHandles: its handle, and what opening
// it must give.
type handleCase struct {
	name string
	h    unix.FileHandle
	ino  uint64 // st_ino it must show; 0: opening must give ESTALE
	data string // a file's bytes
	dir  bool
}

func checkHandles(t *testing.T, when, mnt string, cases []handleCase) {
	t.Helper()
	for _, c := range cases {
		flags := unix.O_RDONLY
		if c.dir {
			flags |= unix.O_DIRECTORY
		}
		fd, err := openHandle(mnt, c.h, flags)
		if c.ino == 0 {
			if err != unix.ESTALE {
				if err == nil {
					unix.Close(fd)
				}
				t.Errorf("%s: open_by_handle_at of removed %s: %v, want ESTALE", when, c.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: open_by_handle_at %s: %v", when, c.name, err)
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Ino != c.ino {
			t.Errorf("%s: %s opened by handle has st_ino %d (%v), want %d", when, c.name, st.Ino, err, c.ino)
		}
		if c.dir {
			if _, err := unix.Getdents(fd, make([]byte, 4096)); err != nil {
				t.Errorf("%s: listing %s opened by handle: %v", when, c.name, err)
			}
		} else {
			b := make([]byte, 64)
			n, err := unix.Pread(fd, b, 0)
			if err != nil || string(b[:max(n, 0)]) != c.data {
				t.Errorf("%s: %s opened by handle reads %q (%v), want %q", when, c.name, b[:max(n, 0)], err, c.data)
			}
		}
		unix.Close(fd)
	}
}

// File handles of a mount open files and directories after the kernel has
// forgotten them (drop_caches), after renames, through a hard link whose
// first name is gone, and after a remount of the stack; a removed file's
// handle is stale. On null, crypt and zstd stacks over ext4, and over a tmpfs
// mounted inside the lower, whose handles hold only while the stack is
// mounted (tmpfs does not open objects by inode number).
// unionOver is a union of d (RW) over a read-only branch beside it, the
// same one at a remount.
func unionOver(t *testing.T, d string) layer.FS {
	ro := filepath.Join(filepath.Dir(d), "union-ro")
	os.MkdirAll(ro, 0o755)
	u, err := union.New([]fanout.Branch{{FS: localLower(t, d), Mode: fanout.RW}, {FS: localLower(t, ro), Mode: fanout.RO}}, union.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestFileHandles(t *testing.T) {
	mounttest.NeedRoot(t)
	stacks := []struct {
		name string
		sub  string // the directory of the lower the objects are in
		new  func(t *testing.T, lower string) layer.FS
		// remount: handles open after a remount (the objects' file
		// system opens them by inode number).
		remount bool
		opts    []string // mount options
	}{
		{"null", "", func(t *testing.T, d string) layer.FS { return null.New(localLower(t, d)) }, true, nil},
		{"crypt", "", cryptAgain, true, nil},
		{"zstd", "", func(t *testing.T, d string) layer.FS { return newCodec(t, localLower(t, d), "zstd") }, true, nil},
		{"null-tmpfs-inside", "sub", func(t *testing.T, d string) layer.FS { return null.New(localLower(t, d)) }, false, nil},
		// Options other than the lower's: local reaches it through a
		// private bind mount (see TestAtimeOptions).
		{"null-strictatime", "", func(t *testing.T, d string) layer.FS { return null.New(localLower(t, d)) }, true, []string{"strictatime"}},
		{"crypt-noatime", "", cryptAgain, true, []string{"noatime"}},
		{"union", "", unionOver, true, nil},
		{"null-tmpfs-inside-nodiratime", "sub", func(t *testing.T, d string) layer.FS { return null.New(localLower(t, d)) }, false, []string{"nodiratime"}},
	}
	for _, s := range stacks {
		t.Run(s.name, func(t *testing.T) {
			lower := t.TempDir()
			if s.sub != "" {
				mounttest.Tmpfs(t, filepath.Join(lower, s.sub))
			}
			o := fusefs.Options{AllowOther: true, MountFlags: s.opts}
			m := mounttest.MountOpts(t, s.new(t, lower), o)
			b := func(names ...string) string { return m.Path(append([]string{s.sub}, names...)...) }
			for _, d := range []string{"d", "d/e"} {
				if err := os.Mkdir(b(d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			mustWrite(t, b("f"), "file f")
			mustWrite(t, b("d", "g"), "file g")
			mustWrite(t, b("x"), "file x")
			if err := os.Link(b("f"), b("d", "l")); err != nil {
				t.Fatal(err)
			}
			ino := func(p string) uint64 { return lstat(t, p).Ino }
			cases := []handleCase{
				{name: "f", h: handleOf(t, b("f")), ino: ino(b("f")), data: "file f"},
				{name: "d/l", h: handleOf(t, b("d", "l")), ino: ino(b("f")), data: "file f"},
				{name: "d/g", h: handleOf(t, b("d", "g")), ino: ino(b("d", "g")), data: "file g"},
				{name: "x", h: handleOf(t, b("x"))},
				// Directories last: listing one makes the kernel know its
				// entries again (READDIRPLUS).
				{name: "d/e", h: handleOf(t, b("d", "e")), ino: ino(b("d", "e")), dir: true},
				{name: "d", h: handleOf(t, b("d")), ino: ino(b("d")), dir: true},
			}
			// A rename in the directory, one to another directory, the
			// first name of a hard link gone, a removed file.
			if err := os.Rename(b("d", "g"), b("d", "g2")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(b("d", "e"), b("e2")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(b("f")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(b("x")); err != nil {
				t.Fatal(err)
			}
			checkHandles(t, "cached", m.Dir, cases)
			dropCaches(t)
			checkHandles(t, "after drop_caches", m.Dir, cases)
			dropCaches(t)
			// A file moved to another directory after its handle was made.
			if err := os.Rename(b("d", "l"), b("e2", "l")); err != nil {
				t.Fatal(err)
			}
			checkHandles(t, "after a move", m.Dir, cases)

			// A new stack over the same lower, mounted elsewhere.
			m.Unmount()
			m2 := mounttest.MountOpts(t, s.new(t, lower), o)
			if !s.remount {
				for i := range cases {
					cases[i].ino = 0
				}
			}
			checkHandles(t, "after a remount", m2.Dir, cases)
		})
	}
}

// removedOpen opens a file of dir, takes its handle, removes it and makes
// the kernel forget what it can; then opens it by handle for writing, reads,
// writes and fchmods through the new descriptor; then closes everything and
// opens the handle once more. It says what it saw.
func removedOpen(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "removed")
	mustWrite(t, p, "data")
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := handleOf(t, p)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	dropCaches(t)
	var out []string
	say := func(f string, args ...any) { out = append(out, fmt.Sprintf(f, args...)) }
	fd2, err := openHandle(dir, h, unix.O_RDWR)
	say("open by handle: %v", err)
	if err == nil {
		b := make([]byte, 8)
		n, err := unix.Pread(fd2, b, 0)
		say("read %q %v", b[:max(n, 0)], err)
		_, err = unix.Pwrite(fd2, []byte("more"), 4)
		say("write: %v", err)
		say("fchmod: %v", unix.Fchmod(fd2, 0o600))
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		say("fstat of the first: nlink %d, mode %o, size %d, %v", st.Nlink, st.Mode, st.Size, err)
		n, err = unix.Pread(fd, b, 0)
		say("read through the first %q %v", b[:max(n, 0)], err)
		unix.Close(fd2)
	}
	unix.Close(fd)
	// The kernel sends RELEASE after close(2) returns: until the daemon
	// has it, the file is still open there. Wait for it, up to 5 s (each
	// try that opens is closed and waited for in turn).
	for try := 0; ; try++ {
		dropCaches(t)
		fd2, err = openHandle(dir, h, unix.O_RDONLY)
		if err != nil || try == 50 {
			break
		}
		unix.Close(fd2)
		time.Sleep(100 * time.Millisecond)
	}
	say("closed, open by handle: %v", err)
	if err == nil {
		unix.Close(fd2)
	}
	return strings.Join(out, "\n")
}

// TestHandleOfRemovedOpenFile: a file removed while open is opened by its
// handle, as on ext4 (xfstests generic/467 -dk), through one of its open
// files (layer.ReopenFile): on null, crypt and under a Hooked layer. Once
// it is closed, its handle is stale. Stacks whose files cannot reopen
// (zstd, union) answer ESTALE.
func TestHandleOfRemovedOpenFile(t *testing.T) {
	mounttest.NeedRoot(t)
	want := removedOpen(t, ext4Dir(t))
	if !strings.HasPrefix(want, "open by handle: <nil>\n") {
		t.Fatalf("ext4:\n%s", want)
	}
	t.Logf("ext4:\n%s", want)
	stale := fmt.Sprintf("open by handle: %v\nclosed, open by handle: %[1]v", unix.ESTALE)
	for _, s := range stackNames {
		t.Run(s, func(t *testing.T) {
			st := mountStack(t, s)
			w := want
			if s == "zstd" || s == "union" {
				w = stale
			}
			if got := removedOpen(t, st.m.Path()); got != w {
				t.Errorf("on the mount:\n%s\nwant:\n%s", got, w)
			}
		})
	}
}
