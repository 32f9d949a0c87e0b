//go:build linux

package conformance

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// cases are run in order, each in a directory of its own, on the oracle and
// on the mount.
var cases = []tcase{
	{"files", files},
	{"sparse", sparse},
	{"dirs", dirs},
	{"rename", rename},
	{"links", links},
	{"fifo", fifo},
	{"modes", modes},
	{"setid", setid},
	{"times", times},
	{"xattr", xattrs},
	{"names", names},
	{"statfs", statfs},
	{"inodes", inodes},
	{"edges", edges},
	{"more", more},
	{"access", access},
	{"concurrent", concurrent},
}

func write(c *C, name string, data string) {
	c.E("write "+name, os.WriteFile(c.P(name), []byte(data), 0o644))
}

func read(c *C, name string) {
	b, err := os.ReadFile(c.P(name))
	if err != nil {
		c.E("read "+name, err)
		return
	}
	c.V("read "+name, "%q", b)
}

func files(c *C) {
	fd, err := unix.Open(c.P("f"), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o644)
	c.E("create f", err)
	_, err = unix.Open(c.P("f"), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o644)
	c.E("create f again", err)
	if fd >= 0 {
		n, err := unix.Pwrite(fd, []byte("hello world"), 0)
		c.E("pwrite", err)
		c.V("pwrite n", "%d", n)
		buf := make([]byte, 32)
		n, err = unix.Pread(fd, buf, 6)
		c.E("pread", err)
		c.V("pread", "%q", buf[:n])
		c.E("ftruncate 20", unix.Ftruncate(fd, 20))
		n, _ = unix.Pread(fd, buf, 0)
		c.V("pread after grow", "%q", buf[:n])
		c.E("ftruncate 5", unix.Ftruncate(fd, 5))
		n, _ = unix.Pread(fd, buf, 0)
		c.V("pread after shrink", "%q", buf[:n])
		n, err = unix.Pread(fd, buf, 100)
		c.E("pread past end", err)
		c.V("pread past end n", "%d", n)
		unix.Close(fd)
	}
	c.Stat("f")
	fd, err = unix.Open(c.P("f"), unix.O_WRONLY|unix.O_APPEND, 0)
	c.E("open append", err)
	if fd >= 0 {
		unix.Write(fd, []byte(" more"))
		unix.Pwrite(fd, []byte("!"), 0) // O_APPEND: pwrite appends on Linux
		unix.Close(fd)
	}
	read(c, "f")
	c.E("truncate 3", os.Truncate(c.P("f"), 3))
	read(c, "f")
	fd, err = unix.Open(c.P("f"), unix.O_WRONLY|unix.O_TRUNC, 0)
	c.E("open trunc", err)
	if fd >= 0 {
		unix.Close(fd)
	}
	c.Stat("f")
	_, err = unix.Open(c.P("missing"), unix.O_RDONLY, 0)
	c.E("open missing", err)
	_, err = unix.Open(c.P("f/x"), unix.O_RDONLY, 0)
	c.E("open f/x", err)
	_, err = unix.Open(c.P("f"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	c.E("open f O_DIRECTORY", err)
	_, err = unix.Open(c.dir, unix.O_WRONLY, 0)
	c.E("open dir for writing", err)
	c.E("create in missing dir", os.WriteFile(c.P("no/f"), nil, 0o644))
	c.E("unlink missing", unix.Unlink(c.P("missing")))
	c.E("rmdir file", unix.Rmdir(c.P("f")))
	// a file written through two descriptors, read through a third
	a, _ := os.OpenFile(c.P("g"), os.O_CREATE|os.O_RDWR, 0o644)
	b, _ := os.OpenFile(c.P("g"), os.O_RDWR, 0)
	if a != nil && b != nil {
		a.WriteAt([]byte("aaaa"), 0)
		b.WriteAt([]byte("bb"), 2)
		a.Close()
		b.Close()
	}
	read(c, "g")
	// unlinked while open: still readable and writable
	f, err := os.OpenFile(c.P("g"), os.O_RDWR, 0)
	c.E("open g", err)
	if f != nil {
		c.E("unlink open g", os.Remove(c.P("g")))
		f.WriteAt([]byte("Z"), 0)
		buf := make([]byte, 8)
		n, _ := f.ReadAt(buf, 0)
		c.V("read unlinked", "%q", buf[:n])
		var st unix.Stat_t
		c.E("fstat unlinked", unix.Fstat(int(f.Fd()), &st))
		c.V("fstat unlinked", "nlink %d size %d", st.Nlink, st.Size)
		f.Close()
	}
}

func sparse(c *C) {
	f, err := os.OpenFile(c.P("s"), os.O_CREATE|os.O_RDWR, 0o644)
	c.E("create s", err)
	if f == nil {
		return
	}
	defer f.Close()
	fd := int(f.Fd())
	f.WriteAt([]byte("tail"), 1<<20)
	f.WriteAt([]byte("head"), 0)
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	c.V("size", "%d", st.Size)
	buf := make([]byte, 8192)
	n, _ := f.ReadAt(buf, 500<<10)
	c.V("hole reads zeros", "%v %d", bytes.Count(buf[:n], []byte{0}) == n, n)
	if !c.Has(Holes) {
		c.V("blocks below size", "%v", st.Blocks*512 < 512<<10)
	}
	for _, off := range []int64{0, 100, 300 << 10, 1 << 20, 1<<20 + 4, 2 << 20} {
		d, errd := unix.Seek(fd, off, unix.SEEK_DATA)
		h, errh := unix.Seek(fd, off, unix.SEEK_HOLE)
		if c.Has(Holes) {
			// What ext4 and the fallback (data wherever there are bytes,
			// the only hole at the end) agree on.
			c.E("SEEK_DATA at "+itoa(off), errd)
			c.E("SEEK_HOLE at "+itoa(off), errh)
			c.V("SEEK_DATA/HOLE in range at "+itoa(off), "%v", (errd != nil || d >= off && d < st.Size) && (errh != nil || h >= off && h <= st.Size))
			continue
		}
		c.E("SEEK_DATA at "+itoa(off), errd)
		c.E("SEEK_HOLE at "+itoa(off), errh)
		if errd == nil {
			c.V("SEEK_DATA at "+itoa(off), "%d", d)
		}
		if errh == nil {
			c.V("SEEK_HOLE at "+itoa(off), "%d", h)
		}
	}
	// punch a hole, zero a range, extend with fallocate
	c.E("punch", unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1, 2))
	n, _ = f.ReadAt(buf[:4], 0)
	c.V("after punch", "%q", buf[:n])
	c.E("fallocate grow", unix.Fallocate(fd, 0, 0, 3<<20))
	unix.Fstat(fd, &st)
	c.V("size after fallocate", "%d", st.Size)
	c.E("fallocate keep size", unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 0, 4<<20))
	unix.Fstat(fd, &st)
	c.V("size after keep-size fallocate", "%d", st.Size)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

type dirent struct {
	name string
	ino  uint64
	typ  uint8
}

// dirents reads a directory with getdents64, "." and ".." included.
func dirents(dir string) ([]dirent, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []dirent
	buf := make([]byte, 4096)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return out, err
		}
		if n <= 0 {
			return out, nil
		}
		for b := buf[:n]; len(b) > 19; {
			reclen := int(binary.LittleEndian.Uint16(b[16:18]))
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			out = append(out, dirent{string(name), binary.LittleEndian.Uint64(b[0:8]), b[18]})
			b = b[reclen:]
		}
	}
}

// listing records a directory's names, sorted, with "." and ".." and
// each entry's type.
func listing(c *C, dir string) {
	ents, err := dirents(dir)
	if err != nil {
		c.E("list", err)
		return
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.name+"/"+itoa(int64(e.typ)))
	}
	sort.Strings(names)
	c.V("list "+strings.TrimPrefix(dir, c.dir), "%v", names)
}

func dirs(c *C) {
	c.E("mkdir d", os.Mkdir(c.P("d"), 0o755))
	c.E("mkdir d again", os.Mkdir(c.P("d"), 0o755))
	c.E("mkdir d/e", os.Mkdir(c.P("d/e"), 0o700))
	write(c, "d/f", "x")
	c.Stat("d")
	c.Stat("d/e")
	listing(c, c.P("d"))
	listing(c, c.P("d/e"))
	c.E("rmdir nonempty", unix.Rmdir(c.P("d")))
	c.E("rmdir d/e/.", unix.Rmdir(c.P("d/e/.")))
	c.E("rmdir d/e/..", unix.Rmdir(c.P("d/e/..")))
	c.E("unlink dir", unix.Unlink(c.P("d/e")))
	c.E("mkdir in file", os.Mkdir(c.P("d/f/x"), 0o755))
	c.E("rmdir d/e", unix.Rmdir(c.P("d/e")))
	c.E("rmdir d/e again", unix.Rmdir(c.P("d/e")))
	c.Stat("d")
	// many entries, listed in full
	for i := 0; i < 300; i++ {
		f, err := os.Create(c.P("d/n" + itoa(int64(i))))
		if err != nil {
			c.E("create many", err)
			break
		}
		f.Close()
	}
	listing(c, c.P("d"))
	// a directory removed while open lists nothing
	fd, err := unix.Open(c.P("d/e2"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	c.E("open missing dir", err)
	os.Mkdir(c.P("gone"), 0o755)
	fd, err = unix.Open(c.P("gone"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == nil {
		c.E("rmdir open dir", unix.Rmdir(c.P("gone")))
		n, err := unix.Getdents(fd, make([]byte, 4096))
		c.E("getdents removed dir", err)
		c.V("getdents removed dir", "%d", n)
		unix.Close(fd)
	}
}

func rename(c *C) {
	r := func(op, a, b string, flags uint) {
		c.E(op, unix.Renameat2(unix.AT_FDCWD, c.P(a), unix.AT_FDCWD, c.P(b), flags))
	}
	write(c, "a", "A")
	write(c, "b", "B")
	os.Mkdir(c.P("d"), 0o755)
	os.Mkdir(c.P("e"), 0o755)
	os.Mkdir(c.P("full"), 0o755)
	write(c, "full/x", "X")
	r("a over b", "a", "b", 0)
	read(c, "b")
	c.Stat("a")
	r("missing", "a", "c", 0)
	r("b over dir", "b", "d", 0)
	r("dir over file", "d", "b", 0)
	r("dir over nonempty dir", "d", "full", 0)
	r("dir over empty dir", "d", "e", 0)
	c.Stat("d")
	os.Mkdir(c.P("d"), 0o755)
	r("dir into own subtree", "e", "e/sub", 0)
	os.Mkdir(c.P("e/sub"), 0o755)
	r("dir onto own child", "e", "e/sub/x", 0)
	r("to itself", "b", "b", 0)
	r("dot", "e/.", "x", 0)
	r("noreplace existing", "b", "full/x", unix.RENAME_NOREPLACE)
	r("noreplace new", "b", "c", unix.RENAME_NOREPLACE)
	read(c, "c")
	r("exchange file and dir", "c", "d", unix.RENAME_EXCHANGE)
	c.Stat("c")
	c.Stat("d")
	r("exchange missing", "c", "zz", unix.RENAME_EXCHANGE)
	r("exchange with noreplace", "c", "d", unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE)
	r("exchange back", "c", "d", unix.RENAME_EXCHANGE)
	read(c, "d")
	// hard links of one file: rename of one onto the other does nothing
	c.E("link", os.Link(c.P("d"), c.P("d2")))
	r("link onto link", "d", "d2", 0)
	c.Stat("d")
	c.Stat("d2")
	// across directories, then back
	r("into dir", "d2", "full/d2", 0)
	read(c, "full/d2")
	r("dir with contents", "full", "e/sub/full", 0)
	read(c, "e/sub/full/x")
	listing(c, c.dir)
	// an open file keeps working across its rename
	f, err := os.OpenFile(c.P("d"), os.O_RDWR, 0)
	if err == nil {
		r("open file", "d", "moved", 0)
		f.WriteAt([]byte("W"), 1)
		f.Close()
		read(c, "moved")
	}
}

func links(c *C) {
	write(c, "f", "data")
	c.E("link", os.Link(c.P("f"), c.P("l")))
	c.Stat("f")
	c.E("link existing", os.Link(c.P("f"), c.P("l")))
	os.Mkdir(c.P("d"), 0o755)
	c.E("link dir", os.Link(c.P("d"), c.P("dl")))
	c.E("link missing", os.Link(c.P("x"), c.P("xl")))
	write(c, "l", "new")
	read(c, "f")
	c.E("unlink f", os.Remove(c.P("f")))
	c.Stat("l")
	c.E("symlink", os.Symlink("l", c.P("s")))
	c.E("symlink existing", os.Symlink("l", c.P("s")))
	c.Stat("s")
	t, err := os.Readlink(c.P("s"))
	c.E("readlink", err)
	c.V("readlink", "%q", t)
	_, err = os.Readlink(c.P("l"))
	c.E("readlink file", err)
	read(c, "s")
	long := strings.Repeat("x/", 1000) + "end"
	c.E("long symlink", os.Symlink(long, c.P("ls")))
	t, _ = os.Readlink(c.P("ls"))
	c.V("long readlink", "%v", t == long)
	c.E("dangling", os.Symlink("nowhere", c.P("dang")))
	_, err = os.Stat(c.P("dang"))
	c.E("stat dangling", err)
	_, err = unix.Open(c.P("s"), unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	c.E("open symlink O_NOFOLLOW", err)
	c.E("unlink symlink", os.Remove(c.P("s")))
	c.Stat("l")
	c.E("hard link to symlink", unix.Linkat(unix.AT_FDCWD, c.P("dang"), unix.AT_FDCWD, c.P("dang2"), 0))
	c.Stat("dang2")
}

func fifo(c *C) {
	c.E("mkfifo", unix.Mkfifo(c.P("p"), 0o640))
	c.Stat("p")
	c.E("mkfifo existing", unix.Mkfifo(c.P("p"), 0o640))
	fd, err := unix.Open(c.P("p"), unix.O_RDONLY|unix.O_NONBLOCK, 0)
	c.E("open fifo", err)
	if err == nil {
		w, err := unix.Open(c.P("p"), unix.O_WRONLY|unix.O_NONBLOCK, 0)
		c.E("open fifo for writing", err)
		if err == nil {
			unix.Write(w, []byte("through the pipe"))
			buf := make([]byte, 64)
			n, _ := unix.Read(fd, buf)
			c.V("fifo read", "%q", buf[:max(n, 0)])
			unix.Close(w)
		}
		unix.Close(fd)
	}
	c.E("mknod socket", unix.Mknod(c.P("sock"), unix.S_IFSOCK|0o644, 0))
	c.Stat("sock")
	c.E("rename fifo", os.Rename(c.P("p"), c.P("q")))
	c.Stat("q")
	c.E("unlink fifo", os.Remove(c.P("q")))
}

func modes(c *C) {
	write(c, "f", "secret")
	c.E("chmod 0000", os.Chmod(c.P("f"), 0))
	c.Stat("f")
	read(c, "f") // root reads anyway
	c.As(func() {
		_, err := os.ReadFile(c.P("f"))
		c.E("read 0000 as other", err)
		c.E("chmod as other", os.Chmod(c.P("f"), 0o644))
		c.E("chown as other", os.Chown(c.P("f"), 65534, 65534))
		c.E("create as other", os.WriteFile(c.P("o"), []byte("o"), 0o600))
		c.E("chmod own", os.Chmod(c.P("o"), 0o640))
		c.E("chown own to root", os.Chown(c.P("o"), 0, 0))
		c.E("chgrp own to group 0", os.Chown(c.P("o"), -1, 0))
		c.E("mkdir as other", os.Mkdir(c.P("od"), 0o700))
	})
	c.Stat("o")
	c.Stat("od")
	c.E("chmod 0755", os.Chmod(c.P("f"), 0o755))
	c.E("chown", os.Chown(c.P("f"), 65534, 65534))
	c.Stat("f")
	c.E("chmod 07777", os.Chmod(c.P("f"), 0o7777))
	c.Stat("f")
	c.E("chmod dir 0", os.Chmod(c.P("od"), 0))
	c.As(func() {
		_, err := os.ReadDir(c.P("od"))
		c.E("list 0 dir as owner", err)
		_, err = os.Stat(c.P("od/x"))
		c.E("stat in 0 dir as owner", err)
	})
	os.Chmod(c.P("od"), 0o700)
	// sticky directory: others may not remove root's files
	os.Mkdir(c.P("tmp"), 0o1777)
	os.Chmod(c.P("tmp"), 0o1777)
	write(c, "tmp/root", "r")
	c.As(func() {
		c.E("unlink in sticky dir", os.Remove(c.P("tmp/root")))
		c.E("create in sticky dir", os.WriteFile(c.P("tmp/mine"), nil, 0o644))
		c.E("unlink own in sticky dir", os.Remove(c.P("tmp/mine")))
	})
	// a directory others cannot write
	os.Mkdir(c.P("ro"), 0o755)
	c.As(func() {
		c.E("create in 0755 root dir", os.WriteFile(c.P("ro/x"), nil, 0o644))
		c.E("rename into 0755 root dir", os.Rename(c.P("o"), c.P("ro/o")))
	})
}

func setid(c *C) {
	// a file of the other user with set-id bits: its writes clear them
	write(c, "f", "x")
	os.Chown(c.P("f"), 65534, 65534)
	c.E("chmod 06755", os.Chmod(c.P("f"), 0o6755))
	c.Stat("f")
	c.As(func() {
		f, err := os.OpenFile(c.P("f"), os.O_WRONLY, 0)
		c.E("open own set-id file", err)
		if err == nil {
			f.WriteAt([]byte("y"), 0)
			f.Close()
		}
	})
	c.Stat("f")
	// truncate by the owner clears them too
	c.E("chmod 06755 again", os.Chmod(c.P("f"), 0o6755))
	c.As(func() { c.E("truncate as owner", os.Truncate(c.P("f"), 0)) })
	c.Stat("f")
	// chown clears them
	c.E("chmod 06755 third", os.Chmod(c.P("f"), 0o6755))
	c.E("chown root", os.Chown(c.P("f"), 0, 0))
	c.Stat("f")
	// setgid without group exec stays (mandatory-locking mark)
	c.E("chmod 02644", os.Chmod(c.P("f"), 0o2644))
	c.E("chown again", os.Chown(c.P("f"), 65534, 65534))
	c.Stat("f")
	// a world-writable set-id file written by another user
	write(c, "w", "x")
	c.E("chmod 06777", os.Chmod(c.P("w"), 0o6777))
	c.As(func() {
		f, err := os.OpenFile(c.P("w"), os.O_WRONLY, 0)
		c.E("open root's set-id file", err)
		if err == nil {
			f.WriteAt([]byte("y"), 0)
			f.Close()
		}
	})
	c.Stat("w")
	// root's writes keep the bits (CAP_FSETID)
	c.E("chmod 06755 root's", os.Chmod(c.P("w"), 0o6755))
	f, err := os.OpenFile(c.P("w"), os.O_WRONLY, 0)
	if err == nil {
		f.WriteAt([]byte("root"), 0)
		f.Close()
	}
	c.Stat("w")
	// an owner outside the file's group cannot set setgid: chmod drops it
	write(c, "g", "x")
	os.Chown(c.P("g"), 65534, 0)
	c.As(func() {
		c.E("chmod 02755 outside the group", os.Chmod(c.P("g"), 0o2755))
		c.E("chmod 04755 own", os.Chmod(c.P("g"), 0o4755))
	})
	c.Stat("g")
	// fallocate by the owner clears set-id bits
	c.As(func() {
		f, err := os.OpenFile(c.P("g"), os.O_WRONLY, 0)
		if err == nil {
			c.E("fallocate own set-id file", unix.Fallocate(int(f.Fd()), 0, 0, 8192))
			f.Close()
		}
	})
	c.Stat("g")
	// setgid directory: new entries take its group, subdirectories the bit
	os.Mkdir(c.P("sg"), 0o777)
	os.Chown(c.P("sg"), 0, 65534)
	c.E("chmod 02777 dir", os.Chmod(c.P("sg"), 0o2777))
	write(c, "sg/f", "x")
	os.Mkdir(c.P("sg/d"), 0o755)
	c.Stat("sg/f")
	c.Stat("sg/d")
	c.As(func() {
		c.E("create in setgid dir as other", os.WriteFile(c.P("sg/o"), nil, 0o2755))
		c.E("mkdir in setgid dir as other", os.Mkdir(c.P("sg/od"), 0o755))
	})
	c.Stat("sg/o")
	c.Stat("sg/od")
}

func times(c *C) {
	write(c, "f", "x")
	ts := []unix.Timespec{{Sec: 1000000000, Nsec: 123456789}, {Sec: 1200000000, Nsec: 987654321}}
	c.E("utimens", unix.UtimesNano(c.P("f"), ts))
	var st unix.Stat_t
	unix.Lstat(c.P("f"), &st)
	c.V("times", "atime %d.%09d mtime %d.%09d", st.Atim.Sec, st.Atim.Nsec, st.Mtim.Sec, st.Mtim.Nsec)
	os.Symlink("f", c.P("s"))
	c.E("utimens symlink", unix.UtimesNanoAt(unix.AT_FDCWD, c.P("s"), ts[:], unix.AT_SYMLINK_NOFOLLOW))
	unix.Lstat(c.P("s"), &st)
	c.V("symlink mtime", "%d.%09d", st.Mtim.Sec, st.Mtim.Nsec)
	omit := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Sec: 5, Nsec: 0}}
	c.E("utimens omit", unix.UtimesNano(c.P("f"), omit))
	unix.Lstat(c.P("f"), &st)
	c.V("times after omit", "atime %d.%09d mtime %d.%09d", st.Atim.Sec, st.Atim.Nsec, st.Mtim.Sec, st.Mtim.Nsec)
	// writes move mtime forward
	f, _ := os.OpenFile(c.P("f"), os.O_WRONLY, 0)
	if f != nil {
		f.Write([]byte("y"))
		f.Close()
	}
	unix.Lstat(c.P("f"), &st)
	c.V("write sets mtime", "%v", st.Mtim.Sec > 1000000000)
	// other users: explicit times need ownership, "now" needs write access
	os.Chmod(c.P("f"), 0o666)
	c.As(func() {
		c.E("utimens as other", unix.UtimesNano(c.P("f"), ts))
		c.E("utimens now as other", unix.UtimesNanoAt(unix.AT_FDCWD, c.P("f"), nil, 0))
	})
	os.Chmod(c.P("f"), 0o644)
	c.As(func() {
		c.E("utimens now as other, read-only", unix.UtimesNanoAt(unix.AT_FDCWD, c.P("f"), nil, 0))
	})
}

func xattrs(c *C) {
	write(c, "f", "x")
	p := c.P("f")
	c.E("setxattr", unix.Setxattr(p, "user.a", []byte("one"), 0))
	c.E("setxattr b", unix.Setxattr(p, "user.b", []byte(""), 0))
	c.E("setxattr create existing", unix.Setxattr(p, "user.a", []byte("x"), unix.XATTR_CREATE))
	c.E("setxattr replace missing", unix.Setxattr(p, "user.c", []byte("x"), unix.XATTR_REPLACE))
	c.E("setxattr replace", unix.Setxattr(p, "user.a", []byte("two"), unix.XATTR_REPLACE))
	buf := make([]byte, 256)
	n, err := unix.Getxattr(p, "user.a", buf)
	c.E("getxattr", err)
	c.V("getxattr", "%q", buf[:max(n, 0)])
	n, err = unix.Getxattr(p, "user.a", nil)
	c.E("getxattr size", err)
	c.V("getxattr size", "%d", n)
	_, err = unix.Getxattr(p, "user.a", buf[:1])
	c.E("getxattr small buffer", err)
	_, err = unix.Getxattr(p, "user.none", buf)
	c.E("getxattr missing", err)
	n, err = unix.Listxattr(p, buf)
	c.E("listxattr", err)
	var names []string
	for _, s := range strings.Split(string(buf[:max(n, 0)]), "\x00") {
		if strings.HasPrefix(s, "user.") {
			names = append(names, s)
		}
	}
	sort.Strings(names)
	c.V("listxattr user.*", "%v", names)
	c.E("removexattr", unix.Removexattr(p, "user.a"))
	c.E("removexattr again", unix.Removexattr(p, "user.a"))
	big := bytes.Repeat([]byte("v"), 4000)
	if c.Has(XattrOverhead) {
		big = big[:3500]
	}
	c.E("setxattr big", unix.Setxattr(p, "user.big", big, 0))
	n, _ = unix.Getxattr(p, "user.big", make([]byte, 8192))
	c.V("big size", "%d", n)
	c.E("setxattr long name", unix.Setxattr(p, "user."+strings.Repeat("n", 300), []byte("x"), 0))
	os.Symlink("f", c.P("s"))
	c.E("lsetxattr user on symlink", unix.Lsetxattr(c.P("s"), "user.a", []byte("x"), 0))
	os.Mkdir(c.P("d"), 0o755)
	c.E("setxattr dir", unix.Setxattr(c.P("d"), "user.d", []byte("dir"), 0))
	n, _ = unix.Getxattr(c.P("d"), "user.d", buf)
	c.V("getxattr dir", "%q", buf[:max(n, 0)])
	c.As(func() {
		c.E("setxattr as other", unix.Setxattr(p, "user.o", []byte("x"), 0))
		_, err := unix.Getxattr(p, "user.b", buf)
		c.E("getxattr as other", err)
	})
	// xattrs follow renames
	os.Rename(p, c.P("g"))
	n, err = unix.Getxattr(c.P("g"), "user.b", buf)
	c.E("getxattr after rename", err)
}

func names(c *C) {
	n255 := strings.Repeat("a", 255)
	n256 := strings.Repeat("b", 256)
	write(c, n255, "long")
	read(c, n255)
	c.E("create 256", os.WriteFile(c.P(n256), nil, 0o644))
	c.E("mkdir 255", os.Mkdir(c.P("d"+n255[1:]), 0o755))
	c.E("mkdir 256", os.Mkdir(c.P(n256), 0o755))
	c.E("symlink 256", os.Symlink("x", c.P(n256)))
	c.E("rename to 256", os.Rename(c.P(n255), c.P(n256)))
	c.E("link to 256", os.Link(c.P(n255), c.P(n256)))
	_, err := os.Lstat(c.P(n256))
	c.E("lstat 256", err)
	c.E("rename 255 to 255", os.Rename(c.P(n255), c.P(strings.Repeat("c", 255))))
	listing(c, c.dir)
	for _, n := range []string{"sp ace", "ü-ñ-日本", "-dash", ".hidden", "new\nline", "back\\slash", "*?[]"} {
		write(c, n, n)
		read(c, n)
	}
	listing(c, c.dir)
	// a deep path longer than PATH_MAX, made a piece at a time
	d := c.dir
	for i := 0; i < 20; i++ {
		d += "/" + strings.Repeat("p", 250)
		if err := os.Mkdir(d, 0o755); err != nil {
			c.E("deep mkdir", err)
			break
		}
	}
	c.E("stat deep", func() error { _, err := os.Lstat(d); return err }())
}

func statfs(c *C) {
	var s unix.Statfs_t
	c.E("statfs", unix.Statfs(c.dir, &s))
	c.V("statfs sane", "bsize>0 %v blocks>=bfree %v bfree>=bavail %v namelen %d", s.Bsize > 0, s.Blocks >= s.Bfree, s.Bfree >= s.Bavail, s.Namelen)
	var f unix.Statfs_t
	write(c, "f", "x")
	c.E("statfs file", unix.Statfs(c.P("f"), &f))
	c.V("statfs file same", "%v", f.Bsize == s.Bsize && f.Namelen == s.Namelen)
}

// inodes records how inode numbers relate (not their values): distinct
// files, hard links, renames, and a file's number across an unlink and a new
// create.
func inodes(c *C) {
	ino := func(name string) uint64 {
		var st unix.Stat_t
		if err := unix.Lstat(c.P(name), &st); err != nil {
			c.E("lstat "+name, err)
			return 0
		}
		return st.Ino
	}
	write(c, "a", "a")
	write(c, "b", "b")
	os.Mkdir(c.P("d"), 0o755)
	os.Symlink("a", c.P("s"))
	os.Link(c.P("a"), c.P("d/la"))
	a, b, d, s, la := ino("a"), ino("b"), ino("d"), ino("s"), ino("d/la")
	c.V("distinct", "%v", a != b && a != d && a != s && b != d && b != s && d != s)
	c.V("hard link shares", "%v", a == la)
	os.Rename(c.P("a"), c.P("d/a2"))
	os.Rename(c.P("d"), c.P("d2"))
	c.V("stable across rename", "%v %v", ino("d2/a2") == a, ino("d2") == d)
	// fstat and stat agree, and readdir's d_ino matches
	f, err := os.Open(c.P("b"))
	if err == nil {
		var st unix.Stat_t
		unix.Fstat(int(f.Fd()), &st)
		c.V("fstat agrees", "%v", st.Ino == b)
		f.Close()
	}
	ents, _ := dirents(c.dir)
	dino := map[string]uint64{}
	for _, e := range ents {
		dino[e.name] = e.ino
	}
	c.V("d_ino agrees", "%v %v", dino["b"] == b, dino["."] == ino("."))
}

// edges are the corners that FUSE frontends tend to get wrong.
func edges(c *C) {
	// a file created read-only is writable through the descriptor that
	// created it, for its owner too
	fd, err := unix.Open(c.P("ro"), unix.O_CREAT|unix.O_RDWR|unix.O_EXCL, 0o444)
	c.E("create 0444", err)
	if err == nil {
		_, err = unix.Write(fd, []byte("written"))
		c.E("write through creating fd", err)
		unix.Close(fd)
	}
	read(c, "ro")
	c.As(func() {
		fd, err := unix.Open(c.P("mine"), unix.O_CREAT|unix.O_RDWR|unix.O_EXCL, 0)
		c.E("create 0000 as other", err)
		if err == nil {
			_, err = unix.Write(fd, []byte("mine"))
			c.E("write through creating fd as other", err)
			unix.Close(fd)
		}
		_, err = unix.Open(c.P("mine"), unix.O_RDONLY, 0)
		c.E("reopen 0000 as other", err)
		c.E("access ro W_OK as other", unix.Access(c.P("ro"), unix.W_OK))
		c.E("access ro R_OK as other", unix.Access(c.P("ro"), unix.R_OK))
		_, err = unix.Open(c.P("ro"), unix.O_RDONLY|unix.O_TRUNC, 0)
		c.E("O_TRUNC without write permission", err)
	})
	c.Stat("mine")
	// wrong descriptors
	fd, _ = unix.Open(c.P("ro"), unix.O_RDONLY, 0)
	if fd >= 0 {
		_, err = unix.Write(fd, []byte("x"))
		c.E("write to O_RDONLY", err)
		c.E("ftruncate O_RDONLY", unix.Ftruncate(fd, 0))
		unix.Close(fd)
	}
	_, err = unix.Open(c.dir, unix.O_CREAT|unix.O_RDWR, 0o644)
	c.E("O_CREAT on a directory", err)
	// symlinks and O_CREAT
	os.Symlink("target", c.P("dang"))
	_, err = unix.Open(c.P("dang"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
	c.E("O_EXCL on dangling symlink", err)
	fd, err = unix.Open(c.P("dang"), unix.O_CREAT|unix.O_WRONLY, 0o644)
	c.E("O_CREAT through dangling symlink", err)
	if err == nil {
		unix.Close(fd)
	}
	c.Stat("target")
	c.E("chmod symlink nofollow", unix.Fchmodat(unix.AT_FDCWD, c.P("dang"), 0o600, unix.AT_SYMLINK_NOFOLLOW))
	c.E("lchown symlink", os.Lchown(c.P("dang"), 65534, 65534))
	c.Stat("dang")
	// O_TMPFILE, then linked into place
	if !c.Has(Tmpfile) {
		fd, err = unix.Open(c.dir, unix.O_TMPFILE|unix.O_RDWR, 0o600)
		c.E("O_TMPFILE", err)
	}
	if !c.Has(Tmpfile) && err == nil {
		unix.Write(fd, []byte("tmp"))
		c.E("linkat tmpfile", unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+itoa(int64(fd)), unix.AT_FDCWD, c.P("fromtmp"), unix.AT_SYMLINK_FOLLOW))
		unix.Close(fd)
		read(c, "fromtmp")
		c.Stat("fromtmp")
	}
	// copy_file_range between two files
	write(c, "src", "0123456789abcdef")
	in, _ := os.Open(c.P("src"))
	out, _ := os.OpenFile(c.P("dst"), os.O_CREATE|os.O_RDWR, 0o644)
	if in != nil && out != nil {
		offIn, offOut := int64(4), int64(2)
		n, err := unix.CopyFileRange(int(in.Fd()), &offIn, int(out.Fd()), &offOut, 8, 0)
		c.E("copy_file_range", err)
		c.V("copy_file_range n", "%d", n)
		in.Close()
		out.Close()
	}
	read(c, "dst")
	// rename over an open file: the open file keeps the old bytes
	write(c, "victim", "victim")
	write(c, "winner", "winner")
	f, err := os.Open(c.P("victim"))
	if err == nil {
		c.E("rename over open file", os.Rename(c.P("winner"), c.P("victim")))
		b := make([]byte, 16)
		n, _ := f.ReadAt(b, 0)
		c.V("open victim reads", "%q", b[:n])
		f.Close()
	}
	read(c, "victim")
	// a moved directory's ".." is its new parent
	os.MkdirAll(c.P("p1/child"), 0o755)
	os.Mkdir(c.P("p2"), 0o755)
	c.E("move dir", os.Rename(c.P("p1/child"), c.P("p2/child")))
	c.Stat("p1")
	c.Stat("p2")
	var a, b unix.Stat_t
	unix.Stat(c.P("p2/child/.."), &a)
	unix.Stat(c.P("p2"), &b)
	c.V(".. after move", "%v", a.Ino == b.Ino)
	// fsync of a directory and of a file opened read-only
	dfd, err := unix.Open(c.dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == nil {
		c.E("fsync dir", unix.Fsync(dfd))
		unix.Close(dfd)
	}
	fd, _ = unix.Open(c.P("ro"), unix.O_RDONLY, 0)
	if fd >= 0 {
		c.E("fsync read-only file", unix.Fsync(fd))
		c.E("fdatasync read-only file", unix.Fdatasync(fd))
		unix.Close(fd)
	}
	// a directory with mode 0 is still usable by root
	os.Mkdir(c.P("zero"), 0)
	c.E("create in 0 dir as root", os.WriteFile(c.P("zero/f"), []byte("z"), 0o644))
	read(c, "zero/f")
	os.Chmod(c.P("zero"), 0o755)
}

// more: rarer calls whose errno or result a program may depend on.
func more(c *C) {
	// device nodes (root): the type and device number
	c.E("mknod char", unix.Mknod(c.P("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	var st unix.Stat_t
	if unix.Lstat(c.P("null"), &st) == nil {
		c.V("char rdev", "%o %d:%d", st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	c.E("mknod block", unix.Mknod(c.P("blk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 200))))
	if unix.Lstat(c.P("blk"), &st) == nil {
		c.V("block rdev", "%o %d:%d", st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	// rename with RENAME_WHITEOUT leaves a 0:0 character device
	if !c.Has(NoWhiteout) {
		write(c, "w", "w")
		c.E("rename whiteout", unix.Renameat2(unix.AT_FDCWD, c.P("w"), unix.AT_FDCWD, c.P("w2"), unix.RENAME_WHITEOUT))
		if unix.Lstat(c.P("w"), &st) == nil {
			c.V("whiteout", "%o %d:%d", st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		read(c, "w2")
	}
	// symlink targets: 4095 bytes fit, 4096 do not
	c.E("symlink 4095", os.Symlink(strings.Repeat("t", 4095), c.P("s4095")))
	c.E("symlink 4096", os.Symlink(strings.Repeat("t", 4096), c.P("s4096")))
	if t, err := os.Readlink(c.P("s4095")); err == nil {
		c.V("readlink 4095", "%d", len(t))
	}
	// trusted.* xattrs (root)
	write(c, "x", "x")
	c.E("setxattr trusted", unix.Setxattr(c.P("x"), "trusted.t", []byte("tv"), 0))
	buf := make([]byte, 64)
	n, err := unix.Getxattr(c.P("x"), "trusted.t", buf)
	c.E("getxattr trusted", err)
	c.V("getxattr trusted", "%q", buf[:max(n, 0)])
	c.E("setxattr bad namespace", unix.Setxattr(c.P("x"), "bogus.t", []byte("v"), 0))
	c.E("setxattr empty name", unix.Setxattr(c.P("x"), "", []byte("v"), 0))
	// fallocate modes
	f, err := os.OpenFile(c.P("fa"), os.O_CREATE|os.O_RDWR, 0o644)
	if err == nil {
		fd := int(f.Fd())
		f.Write(bytes.Repeat([]byte("z"), 3*4096))
		if !c.Has(LowerTmpfs) {
			c.E("zero range", unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE, 100, 200))
			b := make([]byte, 400)
			n, _ := f.ReadAt(b, 0)
			c.V("after zero range", "%d zeros", bytes.Count(b[:n], []byte{0}))
		}
		c.E("fallocate bad mode", unix.Fallocate(fd, 0x1000, 0, 10))
		c.E("fallocate zero length", unix.Fallocate(fd, 0, 0, 0))
		c.E("fallocate negative offset", unix.Fallocate(fd, 0, -1, 10))
		f.Close()
	}
	// O_DIRECT with aligned buffers
	fd, err := unix.Open(c.P("direct"), unix.O_CREAT|unix.O_RDWR|unix.O_DIRECT, 0o644)
	c.E("open O_DIRECT", err)
	if err == nil {
		b, _ := unix.Mmap(-1, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		copy(b, bytes.Repeat([]byte("d"), 8192))
		n, err := unix.Pwrite(fd, b[:4096], 4096)
		c.E("pwrite O_DIRECT", err)
		c.V("pwrite O_DIRECT n", "%d", n)
		for i := range b {
			b[i] = 0
		}
		n, err = unix.Pread(fd, b, 0)
		c.E("pread O_DIRECT", err)
		c.V("pread O_DIRECT", "%d bytes, %d d", n, bytes.Count(b[:max(n, 0)], []byte("d")))
		unix.Munmap(b)
		unix.Close(fd)
	}
	// chown to the same owner (-1, -1) changes nothing, and is allowed to anyone who owns it
	write(c, "own", "o")
	os.Chown(c.P("own"), 65534, 65534)
	c.As(func() { c.E("chown -1 -1 as owner", os.Chown(c.P("own"), -1, -1)) })
	c.As(func() { c.E("chown to self as owner", os.Chown(c.P("own"), 65534, 65534)) })
	c.Stat("own")
	// large offsets (only where holes are real: a layer without holes would write them out)
	if !c.Has(Holes) {
		f, err := os.OpenFile(c.P("big"), os.O_CREATE|os.O_RDWR, 0o644)
		if err == nil {
			_, err = f.WriteAt([]byte("far"), 1<<40)
			c.E("pwrite at 1 TiB", err)
			if !c.Has(LowerTmpfs) {
				_, err = f.WriteAt([]byte("x"), 1<<50)
				c.E("pwrite at 1 PiB", err)
				c.E("ftruncate 16 TiB", f.Truncate(16<<40))
			}
			f.Close()
		}
		c.Stat("big")
		os.Remove(c.P("big"))
	}
	// O_APPEND and O_TRUNC together, and O_EXCL without O_CREAT
	write(c, "ap", "old")
	fd, err = unix.Open(c.P("ap"), unix.O_WRONLY|unix.O_APPEND|unix.O_TRUNC, 0)
	if err == nil {
		unix.Write(fd, []byte("new"))
		unix.Close(fd)
	}
	read(c, "ap")
	fd, err = unix.Open(c.P("ap"), unix.O_RDONLY|unix.O_EXCL, 0)
	c.E("O_EXCL without O_CREAT", err)
	if err == nil {
		unix.Close(fd)
	}
}

// access: exec, access(2) and open flags that depend on who asks.
func access(c *C) {
	write(c, "f", "x")
	c.E("access X_OK 0644 as root", unix.Access(c.P("f"), unix.X_OK))
	c.E("faccessat2 X_OK eaccess 0644", unix.Faccessat2(unix.AT_FDCWD, c.P("f"), unix.X_OK, unix.AT_EACCESS))
	os.Chmod(c.P("f"), 0o666)
	c.As(func() {
		_, err := unix.Open(c.P("f"), unix.O_RDONLY|unix.O_NOATIME, 0)
		c.E("O_NOATIME as non-owner", err)
		fd, err := unix.Open(c.P("f"), unix.O_PATH, 0)
		c.E("O_PATH", err)
		if err == nil {
			var st unix.Stat_t
			c.E("fstat O_PATH", unix.Fstat(fd, &st))
			unix.Close(fd)
		}
	})
	// a script runs from the mount
	c.E("write script", os.WriteFile(c.P("run.sh"), []byte("#!/bin/sh\necho ran $1\n"), 0o755))
	os.Chmod(c.P("run.sh"), 0o755)
	// Through a shell: a Go program must not exec a file of a mount it
	// serves itself (its vfork'ed thread holds a P while the kernel waits
	// for the daemon, and the garbage collector waits for that P).
	out, err := exec.Command("sh", "-c", `exec "$0" here`, c.P("run.sh")).CombinedOutput()
	c.E("exec script", err)
	c.V("exec output", "%q", out)
	os.Chmod(c.P("run.sh"), 0o644)
	out, err = exec.Command("sh", "-c", `exec "$0" 2>/dev/null || echo "exit $?"`, c.P("run.sh")).CombinedOutput()
	c.E("exec 0644 script", err)
	c.V("exec 0644 script", "%q", out)
	// odd names
	for _, n := range []string{"\xff\xfe", "...", " ", "a b\tc", strings.Repeat("é", 127)} {
		write(c, n, "odd")
		read(c, n)
	}
	listing(c, c.dir)
	_, err = os.Stat(c.P("f") + "/")
	c.E("file with a trailing slash", err)
}

// concurrent: writers at once on one file, through descriptors of their
// own: O_APPEND records stay whole, disjoint pwrites all land.
func concurrent(c *C) {
	const writers, records, size = 4, 100, 100
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			f, err := os.OpenFile(c.P("log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return
			}
			defer f.Close()
			rec := bytes.Repeat([]byte{byte('a' + w)}, size-1)
			rec = append(rec, '\n')
			for i := 0; i < records; i++ {
				f.Write(rec)
			}
		}(w)
	}
	wg.Wait()
	b, err := os.ReadFile(c.P("log"))
	c.E("read log", err)
	whole := len(b) == writers*records*size
	for i := 0; whole && i < len(b); i += size {
		r := b[i : i+size]
		whole = r[size-1] == '\n' && bytes.Count(r[:size-1], r[:1]) == size-1
	}
	c.V("appended records whole", "%v (%d bytes)", whole, len(b))
	// disjoint regions, each writer its own, in 1000-byte pieces
	f, _ := os.Create(c.P("regions"))
	if f != nil {
		f.Close()
	}
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			f, err := os.OpenFile(c.P("regions"), os.O_WRONLY, 0)
			if err != nil {
				return
			}
			defer f.Close()
			piece := bytes.Repeat([]byte{byte('A' + w)}, 1000)
			for i := 0; i < 50; i++ {
				f.WriteAt(piece, int64((i*writers+w)*1000+3))
			}
		}(w)
	}
	wg.Wait()
	b, _ = os.ReadFile(c.P("regions"))
	sum := sha256.Sum256(b)
	c.V("regions", "%d bytes %x", len(b), sum[:8])
}
