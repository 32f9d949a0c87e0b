//go:build linux

package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// identity checks st_ino across the stack's directories (which may be
// different file systems: a tmpfs inside the lower, the lowers of a fan-out
// layer): no two live files share an inode number, hard links share one,
// a number stays across renames, and every file reads its own bytes and
// size after the others have been looked up (a shared node would show
// another file's).
func identity(t *testing.T, mnt string, dirs []string) {
	type file struct{ path, data string }
	var files []file
	for i, d := range dirs {
		base := filepath.Join(mnt, d, "conf-identity")
		if err := os.MkdirAll(base, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 40; j++ {
			p := filepath.Join(base, fmt.Sprintf("f%d", j))
			data := fmt.Sprintf("dir %d file %d %s", i, j, make([]byte, i*100+j))
			must(t, os.WriteFile(p, []byte(data), 0o644))
			files = append(files, file{p, data})
		}
		must(t, os.Link(filepath.Join(base, "f0"), filepath.Join(base, "link")))
		must(t, os.Mkdir(filepath.Join(base, "sub"), 0o755))
	}
	stat := func(p string) unix.Stat_t {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	seen := map[uint64]string{}
	inos := map[string]uint64{}
	for _, f := range files {
		st := stat(f.path)
		if o, ok := seen[st.Ino]; ok {
			t.Errorf("%s and %s share st_ino %d", o, f.path, st.Ino)
		}
		seen[st.Ino] = f.path
		inos[f.path] = st.Ino
	}
	for _, d := range dirs {
		base := filepath.Join(mnt, d, "conf-identity")
		sub := stat(filepath.Join(base, "sub")).Ino
		if o, ok := seen[sub]; ok {
			t.Errorf("%s/sub and %s share st_ino %d", base, o, sub)
		}
		seen[sub] = base + "/sub"
		if l, f := stat(filepath.Join(base, "link")).Ino, inos[filepath.Join(base, "f0")]; l != f {
			t.Errorf("%s: hard links have st_ino %d and %d", base, l, f)
		}
	}
	// every file shows its own size and bytes, in reverse order of lookup
	for i := len(files) - 1; i >= 0; i-- {
		f := files[i]
		if st := stat(f.path); st.Size != int64(len(f.data)) || st.Ino != inos[f.path] {
			t.Errorf("%s: size %d st_ino %d, want %d and %d", f.path, st.Size, st.Ino, len(f.data), inos[f.path])
		}
		if b, err := os.ReadFile(f.path); err != nil || string(b) != f.data {
			t.Errorf("%s reads %q (%v), want %q", f.path, b, err, f.data)
		}
	}
	// renames keep the number
	for _, d := range dirs {
		base := filepath.Join(mnt, d, "conf-identity")
		from, to := filepath.Join(base, "f1"), filepath.Join(base, "sub", "moved")
		must(t, os.Rename(from, to))
		if got := stat(to).Ino; got != inos[from] {
			t.Errorf("%s: st_ino %d after rename, %d before", to, got, inos[from])
		}
	}
	// a new file made after an unlink, while the old one is still open,
	// is another file: the open one keeps its bytes
	for i, d := range dirs {
		base := filepath.Join(mnt, d, "conf-identity")
		old := filepath.Join(base, "f2")
		f, err := os.Open(old)
		must(t, err)
		must(t, os.Remove(old))
		for j := 0; j < 5; j++ {
			must(t, os.WriteFile(filepath.Join(base, fmt.Sprintf("new%d", j)), []byte("new"), 0o644))
		}
		buf := make([]byte, 200)
		n, _ := f.ReadAt(buf, 0)
		if want := fmt.Sprintf("dir %d file 2 %s", i, make([]byte, i*100+2)); string(buf[:n]) != want {
			t.Errorf("%s, unlinked and open, reads %q after new files were made, want %q", old, buf[:n], want)
		}
		var st unix.Stat_t
		must(t, unix.Fstat(int(f.Fd()), &st))
		for j := 0; j < 5; j++ {
			p := filepath.Join(base, fmt.Sprintf("new%d", j))
			if nst := stat(p); nst.Ino == st.Ino {
				t.Errorf("%s has the st_ino of the unlinked, open file", p)
			}
		}
		f.Close()
	}
}

// reusedInode: behind the mount's back, a file the kernel knows is removed
// and new files are made until one gets its inode number (ext4 reuses freed
// numbers). The new file is another object: the old file's handle
// (name_to_handle_at) must not open it, as on ext4 (there: ESTALE).
func reusedInode(t *testing.T, mnt, lower string) {
	var (
		st     unix.Stat_t
		h      unix.FileHandle
		reused string
	)
	// Other programs on the same file system may take the freed number
	// first: try again.
	for try := 0; try < 20 && reused == ""; try++ {
		name := fmt.Sprintf("conf-reuse-old%d", try)
		must(t, os.WriteFile(filepath.Join(lower, name), []byte("old file"), 0o644))
		must(t, unix.Lstat(filepath.Join(mnt, name), &st))
		var err error
		h, _, err = unix.NameToHandleAt(unix.AT_FDCWD, filepath.Join(mnt, name), 0)
		if err != nil {
			t.Fatalf("name_to_handle_at through the mount: %v", err)
		}
		must(t, os.Remove(filepath.Join(lower, name)))
		for i := 0; i < 20 && reused == ""; i++ {
			n := fmt.Sprintf("conf-reuse-new%d-%d", try, i)
			must(t, os.WriteFile(filepath.Join(lower, n), []byte("the new file"), 0o644))
			var nst unix.Stat_t
			must(t, unix.Lstat(filepath.Join(lower, n), &nst))
			if nst.Ino == st.Ino {
				reused = n
			}
		}
	}
	if reused == "" {
		t.Logf("the lower never reused a freed inode number: nothing to check")
		return
	}
	must(t, unix.Lstat(filepath.Join(mnt, reused), &st))
	mfd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	defer unix.Close(mfd)
	fd, err := unix.OpenByHandleAt(mfd, h, unix.O_RDONLY)
	if err == nil {
		b := make([]byte, 64)
		n, _ := unix.Read(fd, b)
		unix.Close(fd)
		t.Fatalf("the old file's handle opens the new file %s (reads %q); ext4 answers ESTALE", reused, b[:max(n, 0)])
	}
	if b, err := os.ReadFile(filepath.Join(mnt, reused)); err != nil || string(b) != "the new file" {
		t.Errorf("%s reads %q, %v", reused, b, err)
	}
}
