//go:build linux

package fusefs_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
)

// statxAttrs are the file attributes chattr sets (stx_attributes bits equal
// to their FS_*_FL flags).
const statxAttrs = unix.STATX_ATTR_APPEND | unix.STATX_ATTR_COMPRESSED | unix.STATX_ATTR_NODUMP | unix.STATX_ATTR_IMMUTABLE

// Inode flags (FS_*_FL, linux/fs.h).
const (
	flCompr     = 0x4
	flImmutable = 0x10
	flAppend    = 0x20
	flNodump    = 0x40
)

// statxFlagSets are the inode flag sets TestStatxAttributes sets, as
// generic/424 does: none, each alone, all.
var statxFlagSets = []uint32{0, flAppend, flCompr, flNodump, flImmutable,
	flAppend | flCompr | flNodump | flImmutable}

// statxProbe sets each flag set of statxFlagSets on a new file and a new
// directory in dir and says, for each, what a statx(2) asking for every
// field shows of them (stx_attributes and stx_attributes_mask), and what a
// second one does; a set that setflags refuses says so.
func statxProbe(t *testing.T, dir string, refused func(uint32) bool) string {
	t.Helper()
	var b strings.Builder
	for i, fl := range statxFlagSets {
		for _, kind := range []string{"file", "dir"} {
			p := filepath.Join(dir, fmt.Sprintf("%s%d", kind, i))
			var err error
			if kind == "file" {
				err = os.WriteFile(p, nil, 0o644)
			} else {
				err = os.Mkdir(p, 0o755)
			}
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %#x:", kind, fl)
			if refused(fl) {
				b.WriteString(" not tried\n")
				continue
			}
			if err := setFlags(p, fl); err != nil {
				fmt.Fprintf(&b, " setflags: %v\n", err)
				continue
			}
			for range 2 {
				var st unix.Statx_t
				if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_ALL, &st); err != nil {
					t.Fatal(err)
				}
				fmt.Fprintf(&b, " attributes %#x of %#x;", st.Attributes&statxAttrs, st.Attributes_mask&statxAttrs)
			}
			b.WriteString("\n")
			if err := setFlags(p, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	return b.String()
}

// setFlags is chattr: FS_IOC_SETFLAGS on path.
func setFlags(path string, fl uint32) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(fl))
}

// TestStatxAttributes: after chattr, a statx(2) on the mount that asks for
// every field (the kernel then asks with FUSE_STATX) shows the file
// attributes (append, compressed, nodump, immutable) as ext4 does, or,
// where the kernel drops those of FUSE_STATX's reply (Linux 6.18: see
// statx.go), none at all, never others. Stacks that refuse a flag (crypt:
// append; zstd: append and immutable) are compared on the others.
func TestStatxAttributes(t *testing.T) {
	mounttest.NeedRoot(t)
	want := statxProbe(t, ext4Dir(t), func(uint32) bool { return false })
	if !strings.Contains(want, fmt.Sprintf("attributes %#x of", statxAttrs)) {
		t.Fatalf("ext4 shows no attributes:\n%s", want)
	}
	eachStack(t, func(t *testing.T, s posixStack) {
		var lacks uint32
		switch s.name {
		case "crypt":
			lacks = flAppend
		case "zstd":
			lacks = flAppend | flImmutable
		}
		for _, fl := range []uint32{flAppend, flImmutable} {
			f := s.m.Path(fmt.Sprintf("probe%#x", fl))
			os.WriteFile(f, nil, 0o644)
			err := setFlags(f, fl)
			setFlags(f, 0)
			if refused := errors.Is(err, unix.EOPNOTSUPP); refused != (lacks&fl != 0) {
				t.Fatalf("setflags %#x on %s: %v", fl, s.name, err)
			}
		}
		refused := func(fl uint32) bool { return fl&lacks != 0 }
		want := statxProbe(t, ext4Dir(t), refused)
		dropped := regexp.MustCompile(`attributes 0x[0-9a-f]+ of 0x[0-9a-f]+`).ReplaceAllString(want, "attributes 0x0 of 0x0")
		switch got := statxProbe(t, s.m.Path(), refused); got {
		case want:
		case dropped:
			t.Logf("the kernel shows no file attributes of a FUSE file system")
		default:
			t.Errorf("on the mount:\n%s\nwant (ext4):\n%s", got, want)
		}
	})
}

// TestStatxBtime: statx(2) on the mount gives a file's and a directory's
// birth time, the lower object's (found by inode number), as ext4 gives it,
// before and after a write and a rename.
func TestStatxBtime(t *testing.T) {
	mounttest.NeedRoot(t)
	btime := func(p string) (unix.StatxTimestamp, uint64) {
		t.Helper()
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mask&unix.STATX_BTIME == 0 {
			t.Fatalf("%s: no birth time (mask %#x)", p, st.Mask)
		}
		return st.Btime, st.Ino
	}
	lowerBtime := func(lower string, ino uint64) unix.StatxTimestamp {
		t.Helper()
		var bt *unix.StatxTimestamp
		filepath.WalkDir(lower, func(p string, d fs.DirEntry, err error) error {
			if b, i := btime(p); i == ino {
				bt = &b
				return filepath.SkipAll
			}
			return nil
		})
		if bt == nil {
			t.Fatalf("no object with inode number %d in the lower", ino)
		}
		return *bt
	}
	eachStack(t, func(t *testing.T, s posixStack) {
		if err := os.WriteFile(s.m.Path("f"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(s.m.Path("d"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"f", "d"} {
			bt, ino := btime(s.m.Path(p))
			if want := lowerBtime(s.lower, ino); bt != want {
				t.Errorf("%s: birth time %v on the mount, %v in the lower", p, bt, want)
			}
		}
		bt, _ := btime(s.m.Path("f"))
		if err := os.WriteFile(s.m.Path("f"), []byte("more"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(s.m.Path("f"), s.m.Path("d", "g")); err != nil {
			t.Fatal(err)
		}
		if bt2, _ := btime(s.m.Path("d", "g")); bt2 != bt {
			t.Errorf("birth time %v after a write and a rename, %v before", bt2, bt)
		}
	})
}
