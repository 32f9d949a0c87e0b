//go:build linux

package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestMountpointRefusals: cairn mount refuses a mountpoint where a mount
// would hide something (a mount already there, a non-empty directory, a
// dead mount), and cairn umount refuses what is not a cairn mount; each
// message says what to do. After kill -9, cairn umount takes the dead
// mount away and the stack mounts again.
func TestMountpointRefusals(t *testing.T) {
	mounttest.Need(t)
	mounttest.NeedRoot(t)
	lower, mnt := t.TempDir(), t.TempDir()
	spec := "null:" + lower
	expect := func(out string, code, wantCode int, want string) {
		t.Helper()
		if code != wantCode || !strings.Contains(out, want) {
			t.Errorf("exit %d, %q; want exit %d and %q", code, out, wantCode, want)
		}
	}
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	out, code := cairn(t, "mount", spec, mnt)
	expect(out, code, 4, "mountpoint "+mnt+" is already a cairn mount (cairn:"+spec+"); unmount it first: cairn umount "+mnt)
	out, code = cairn(t, "check", spec, mnt)
	expect(out, code, 3, "mountpoint "+mnt+" is already a cairn mount (cairn:"+spec+"); unmount it first: cairn umount "+mnt)

	// A tmpfs is not cairn's to unmount.
	tmp := t.TempDir()
	if err := syscall.Mount("none", tmp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(tmp, syscall.MNT_DETACH) })
	out, code = cairn(t, "umount", tmp)
	expect(out, code, 1, "umount "+tmp+": it is a tmpfs mount (none), not cairn's; cairn umount unmounts only cairn mounts (use umount(8) for others)")
	if _, ok := mountAt(tmp); !ok {
		t.Error("cairn umount unmounted a tmpfs")
	}
	out, code = cairn(t, "mount", spec, tmp)
	expect(out, code, 4, "is already a mount point (tmpfs, none)")

	// A directory with files in it, unless -nonempty.
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "x"), nil, 0o644)
	out, code = cairn(t, "mount", spec, full)
	expect(out, code, 4, "mountpoint "+full+" is not empty (it holds x); its files would be hidden while mounted: choose an empty directory, or pass -nonempty")
	out, code = cairn(t, "check", spec, full)
	expect(out, code, 3, "mountpoint "+full+" is not empty (it holds x); its files would be hidden while mounted: choose an empty directory, or pass -nonempty")
	if out, code := cairn(t, "check", "-nonempty", spec, full); code != 0 {
		t.Errorf("check -nonempty: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "mount", "-nonempty", spec, full); code != 0 {
		t.Fatalf("mount -nonempty: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "umount", full); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
	out, code = cairn(t, "umount", full)
	expect(out, code, 1, "umount "+full+": nothing is mounted there")

	// kill -9 leaves a dead mount: mount says so, umount takes it away.
	pid, err := exec.Command("pgrep", "-f", "cairn mount "+spec+" "+mnt+"$").Output()
	if err != nil {
		t.Fatalf("the daemon of %s: %v", mnt, err)
	}
	exec.Command("kill", "-9", strings.TrimSpace(string(pid))).Run()
	for deadline := time.Now().Add(20 * time.Second); !isDead(mnt); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not dead 20 s after its daemon was killed", mnt)
		}
	}
	out, code = cairn(t, "mount", spec, mnt)
	expect(out, code, 4, "mountpoint "+mnt+" is a dead cairn mount (the process that served it is gone); run 'cairn umount "+mnt+"' first")
	out, code = cairn(t, "check", spec, mnt)
	expect(out, code, 3, "mountpoint "+mnt+" is a dead cairn mount (the process that served it is gone); run 'cairn umount "+mnt+"' first")
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount of a dead mount: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount after umount of the dead mount: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
}

// TestMountDashO: -o takes mount(8)'s options: the kernel gets the
// generic ones (ro is read-only, dev and suid lift FUSE's default nodev
// and nosuid), fsname names the source, fstab's own are ignored, and an
// unknown one is refused before anything is mounted.
func TestMountDashO(t *testing.T) {
	mounttest.Need(t)
	mounttest.NeedRoot(t)
	lower, mnt := t.TempDir(), t.TempDir()
	spec := "null:" + lower
	if out, code := cairn(t, "mount", "-o", "dev,suid,ro,noexec,noatime,fsname=mydata,noauto,x-systemd.automount,_netdev", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	m, ok := mountAt(mnt)
	if !ok || m.Type != cairnType || m.Source != "mydata" {
		t.Errorf("mounted as %+v, want type %s and source mydata", m, cairnType)
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var opts string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == mnt {
			opts = f[5]
		}
	}
	for _, want := range []string{"ro", "noexec", "noatime"} {
		if !strings.Contains(","+opts+",", ","+want+",") {
			t.Errorf("mount options %q lack %s", opts, want)
		}
	}
	for _, not := range []string{"nodev", "nosuid"} {
		if strings.Contains(","+opts+",", ","+not+",") {
			t.Errorf("mount options %q have %s after -o dev,suid", opts, not)
		}
	}
	if err := os.WriteFile(filepath.Join(mnt, "x"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write on a ro mount: %v, want EROFS", err)
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
	// The default is FUSE's: nodev, nosuid.
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	b, _ = os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == mnt && !(strings.Contains(f[5], "nodev") && strings.Contains(f[5], "nosuid")) {
			t.Errorf("default mount options %q, want nodev and nosuid", f[5])
		}
	}
	cairn(t, "umount", mnt)
	out, code := cairn(t, "mount", "-o", "rw,bogus", spec, mnt)
	if code != 2 || !strings.Contains(out, `-o: unknown mount option "bogus"`) {
		t.Errorf("mount -o bogus: exit %d, %q; want exit 2 and the unknown option named", code, out)
	}
}

// TestMountDevSuid: -o dev,suid alone (no other flag set) lifts nodev and
// nosuid too.
func TestMountDevSuid(t *testing.T) {
	mounttest.Need(t)
	mounttest.NeedRoot(t)
	lower, mnt := t.TempDir(), t.TempDir()
	if out, code := cairn(t, "mount", "-o", "dev,suid", "null:"+lower, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	if err := syscall.Mknod(filepath.Join(mnt, "null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "null"), []byte("x"), 0); err != nil {
		t.Errorf("writing to /dev/null's device made on a dev mount: %v", err)
	}
	cairn(t, "umount", mnt)
}

// TestAdvice: mistakes get messages that say what to do, from a background
// mount too (the daemon's real error, not "exit status 1").
func TestAdvice(t *testing.T) {
	mounttest.Need(t)
	lower, mnt := t.TempDir(), t.TempDir()
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o644)
	rel := t.TempDir()
	os.Mkdir(filepath.Join(rel, "data"), 0o755)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"mont"}, 2, `unknown command "mont"; did you mean "mount"?`},
		{[]string{"mount", "-o", "ro,uid=1000", "null:" + lower, mnt}, 2, "cairn: -o uid=1000: not taken: a stack shows the owners and modes of the lower's files as they are (change them there, or stack an acl layer)\n"},
		{[]string{"mount", "-o", "subtype=x", "null:" + lower, mnt}, 2, "cairn: -o subtype=x: the type stays fuse.cairn, by which cairn umount and mount -t fuse.cairn know a cairn mount\n"},
		{[]string{"layers", "nul"}, 2, `cairn: unknown layer type "nul"; did you mean "null"?; run 'cairn layers' for the list`},
		{[]string{"mount", "-log-file", "/nonexistent-dir/x.log", "null:" + lower, mnt}, 4, "cannot open log file: open /nonexistent-dir/x.log: no such file or directory"},
		{[]string{"mount", "null:" + lower, file}, 4, "mountpoint " + file + " is a file, not a directory; choose a directory"},
		{[]string{"mount", "snoop(output=stdout):" + lower, mnt}, 2, `layer "snoop" writes to standard output (output = "stdout"), which a background mount does not have: mount with -f`},
		{[]string{"mount", "-o", "writeback", "chains:" + lower, mnt}, 4, `-writeback: the chains layer refuses the writeback cache (see docs/posix.md, "Caching")`},
		{[]string{"mount", "-writeback", "-shared", "null:" + lower, mnt}, 4, "-writeback: the writeback cache needs an exclusive stack"},
		{[]string{"check", "zstd:null:" + rel + "/data"}, 3, `the layers of a chain are separated by "," (did you mean "zstd,null:` + rel + `/data"?)`},
	} {
		out, code := cairn(t, c.args...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("cairn %s: exit %d, %q; want exit %d and %q", strings.Join(c.args, " "), code, out, c.code, c.want)
		}
	}
	if _, ok := mountAt(mnt); ok {
		t.Error("a failed background mount left a mount")
	}
}

// TestMountAtimeNotRoot: applying atime options to a lower mounted with
// others takes a private bind mount, which a daemon that is not root cannot
// make: the mount fails before anything is mounted, saying why.
func TestMountAtimeNotRoot(t *testing.T) {
	mounttest.NeedRoot(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	lower := mounttest.TmpfsFlags(t, filepath.Join(dir, "lower"), 0) // relatime
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	for _, d := range []string{lower, mnt} {
		if err := os.Chown(d, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	// A copy of the binary that the user may run.
	bin := filepath.Join(dir, "cairn")
	if b, err := os.ReadFile(mounttest.Binary(t)); err != nil || os.WriteFile(bin, b, 0o755) != nil {
		t.Fatal("copying the binary:", err)
	}
	for opt, as := range map[string]string{"noatime": "noatime", "strictatime": "strictatime", "nodiratime": "relatime,nodiratime"} {
		cmd := mounttest.User{Uid: 65534, Gid: 65534}.Command(bin, "mount", "-f", "-o", opt, "null:"+lower, mnt)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 4 || !strings.Contains(string(out), "is mounted relatime; reading it "+as+" takes a private bind mount of it, which needs CAP_SYS_ADMIN") {
			t.Errorf("mount -o %s as uid 65534: %v, want exit 4 saying why: %s", opt, err, out)
		}
	}
}
