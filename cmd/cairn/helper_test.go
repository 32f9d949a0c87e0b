//go:build linux

package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// inNamespace runs script (sh -e) as root in a private mount namespace,
// with cairn's binary in $CAIRN and the mount helper
// (xfstests/mount.fuse.cairn, @CAIRN@ filled in) laid over the directory
// where mount(8) looks for helpers, so that the system's own helper (if
// any) is left alone. Mounts made there are gone when the script ends.
func inNamespace(t *testing.T, script string) (string, int) {
	t.Helper()
	mounttest.Need(t)
	mounttest.NeedRoot(t)
	bin := mounttest.Binary(t)
	src, err := os.ReadFile("../../xfstests/mount.fuse.cairn")
	if err != nil {
		t.Fatal(err)
	}
	helpers := t.TempDir()
	helper := strings.ReplaceAll(string(src), "@CAIRN@", bin)
	if err := os.WriteFile(filepath.Join(helpers, "mount.fuse.cairn"), []byte(helper), 0o755); err != nil {
		t.Fatal(err)
	}
	sbin, err := filepath.EvalSymlinks("/sbin")
	if err != nil {
		t.Fatal(err)
	}
	pre := "mount -t overlay overlay -o lowerdir=" + helpers + ":" + sbin + " " + sbin + "\n"
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-ec", pre+script)
	cmd.Env = append(os.Environ(), "CAIRN="+bin)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// TestFstab: a stack mounts as any file system does, through mount(8) and
// the helper mount.fuse.cairn: from an fstab line (mount -T on a scratch
// fstab) with fstab's own options (noauto, nofail, _netdev,
// x-systemd.automount), which are ignored as mount.fuse ignores them, and
// mount's (ro, allow_other, fsname); with mount -t fuse.cairn SPEC DIR; and
// umount(8) and cairn umount take them away. An option the helper does not
// know is refused with mount(8)'s exit code 32.
func TestFstab(t *testing.T) {
	lower, mnt1, mnt2 := t.TempDir(), t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(lower, "hello"), []byte("hello\n"), 0o644)
	specFile := filepath.Join(t.TempDir(), "stack.toml")
	os.WriteFile(specFile, []byte("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = \""+lower+"\"\n[layer.top]\ntype = \"null\"\nover = \"base\"\n"), 0o644)
	fstab := filepath.Join(t.TempDir(), "fstab")
	os.WriteFile(fstab, []byte("# a scratch fstab\n"+
		specFile+" "+mnt1+" fuse.cairn noauto,nofail,_netdev,x-systemd.automount,allow_other,ro,fsname=mydata 0 0\n"), 0o644)
	script := `
mount -T ` + fstab + ` ` + mnt1 + `
findmnt -n -o FSTYPE,SOURCE,VFS-OPTIONS ` + mnt1 + `
findmnt -n -o FS-OPTIONS ` + mnt1 + ` | tr , '\n' | grep -x allow_other
cat ` + mnt1 + `/hello
touch ` + mnt1 + `/new 2>/dev/null || echo "read-only: touch refused"
$CAIRN umount ` + mnt1 + `
mount -t fuse.cairn null:` + lower + ` ` + mnt2 + `
findmnt -n -o FSTYPE,SOURCE ` + mnt2 + `
echo written > ` + mnt2 + `/new
umount ` + mnt2 + `
cat ` + lower + `/new
mount -t fuse.cairn -o bogus null:` + lower + ` ` + mnt2 + ` || echo "exit $?"
findmnt ` + mnt2 + ` || echo "not mounted"
`
	out, code := inNamespace(t, script)
	want := `fuse.cairn mydata ro,relatime
allow_other
hello
read-only: touch refused
fuse.cairn cairn:null:` + lower + `
written
mount.fuse.cairn: option bogus is not supported
exit 32
not mounted
`
	if code != 0 || out != want {
		t.Errorf("exit %d, output:\n%s\nwant:\n%s", code, out, want)
	}
}

// TestMountLogFallback: a background mount with no syslog to log to (no
// /dev/log) logs to a file, one per mountpoint, and says where on a
// terminal.
func TestMountLogFallback(t *testing.T) {
	lower, mnt := t.TempDir(), t.TempDir()
	mounttest.Binary(t) // sets CAIRN_LOG_DIR for the tests' mounts
	logf := filepath.Join(os.Getenv("CAIRN_LOG_DIR"), strings.ReplaceAll(strings.Trim(mnt, "/"), "/", "-")+".log")
	t.Cleanup(func() { os.Remove(logf) })
	script := `
if [ -e /dev/log ]; then mount --bind /dev/null /dev/log; fi
$CAIRN mount null:` + lower + ` ` + mnt + ` 2>&1 | wc -c
script -qec "$CAIRN umount ` + mnt + `; $CAIRN mount null:` + lower + ` ` + mnt + `" /dev/null
$CAIRN umount ` + mnt + `
`
	out, code := inNamespace(t, script)
	// Said on a terminal only: a script's mount is silent when it works.
	if want := "0\ncairn: no syslog (no /dev/log): the mount logs to " + logf + "\r\n"; code != 0 || out != want {
		t.Errorf("exit %d, output %q, want %q", code, out, want)
	}
	b, err := os.ReadFile(logf)
	if err != nil || !strings.Contains(string(b), `"msg":"mounted","mountpoint":"`+mnt+`"`) || !strings.Contains(string(b), `"msg":"unmounted"`) {
		t.Errorf("log file %s: %v\n%s", logf, err, b)
	}
}

// cairnIn runs cairn with stdin as its standard input.
func cairnIn(t *testing.T, stdin string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(mounttest.Binary(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// TestPassphrases: the passphrase of a crypt stack comes from --passfile,
// --extpass or standard input (when it is not a terminal) for init, mount,
// fsck and passwd alike, without editing the spec; a wrong one exits 7 from
// each; passwd refuses a mounted volume (exit 5).
func TestPassphrases(t *testing.T) {
	mounttest.Need(t)
	lower, mnt := t.TempDir(), t.TempDir()
	dir := t.TempDir()
	good, wrong := filepath.Join(dir, "good"), filepath.Join(dir, "wrong")
	os.WriteFile(good, []byte("right horse\n"), 0o600)
	os.WriteFile(wrong, []byte("wrong horse\n"), 0o600)
	spec := "crypt:" + lower
	kdf := []string{"--argon2-memory", "19MiB", "--argon2-time", "2", "--argon2-threads", "1"}
	if out, code := cairnIn(t, "right horse\n", append([]string{"init"}, append(kdf, spec)...)...); code != 0 {
		t.Fatalf("init: exit %d: %s", code, out)
	}
	wrongMsg := `layer "crypt" (type crypt): wrong passphrase for ` + lower + "/.cairn-crypt.conf"
	for _, c := range []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"wrong horse\n", []string{"mount", spec, mnt}, 7, wrongMsg},
		{"", []string{"mount", "--passfile", wrong, spec, mnt}, 7, wrongMsg},
		{"", []string{"mount", "-f", "--extpass", "echo wrong horse", spec, mnt}, 7, wrongMsg},
		{"wrong horse\n", []string{"fsck", spec}, 7, wrongMsg},
		{"", []string{"fsck", "--passfile", wrong, spec}, 7, wrongMsg},
		{"", []string{"passwd", "--passfile", wrong, "--new-passfile", good, spec}, 7, "cairn: passwd: wrong passphrase"},
		{"right horse\n", []string{"fsck", spec}, 0, "nothing to check"},
		{"", []string{"fsck", "--extpass", "cat " + good, spec}, 0, "nothing to check"},
		{"right horse\n", []string{"mount", spec, mnt}, 0, ""},
		{"", []string{"passwd", "--passfile", good, "--new-passfile", good, spec}, 5,
			"cairn: passwd: the files of the crypt layer in " + lower + " are in use by another cairn process (a mount of this stack or an fsck, here or on another client of the same network file system; only mounts with -shared share it): unmount it first ('cairn umount MOUNTPOINT')"},
		{"", []string{"umount", mnt}, 0, ""},
		{"", []string{"passwd", "--passfile", good, "--new-passfile", good, spec}, 0, `cairn: the passphrase of layer "crypt" is changed`},
		// Both from standard input: the current one on the first line,
		// the new one on the second.
		{"right horse\n", []string{"passwd", spec}, 1, "cairn: no new passphrase: standard input has no line for it (give it on a line of its own, or use a passphrase file)"},
		{"right horse\nnew horse\n", []string{"passwd", spec}, 0, `cairn: the passphrase of layer "crypt" is changed`},
		{"new horse\n", []string{"fsck", spec}, 0, "nothing to check"},
	} {
		out, code := cairnIn(t, c.stdin, c.args...)
		if code != c.code || !strings.Contains(out, c.want) {
			t.Errorf("cairn %s: exit %d, %q; want exit %d and %q", strings.Join(c.args, " "), code, out, c.code, c.want)
		}
	}
	if _, ok := mountAt(mnt); ok {
		cairn(t, "umount", mnt)
	}
}

// TestDemoRelative: cairn demo with a relative directory works (its spec
// names the directory absolutely).
func TestDemoRelative(t *testing.T) {
	mounttest.Need(t)
	cwd := t.TempDir()
	cmd := exec.Command(mounttest.Binary(t), "demo", "rel")
	cmd.Dir = cwd
	out, err := cmd.CombinedOutput()
	if want := "The demo worked: files written through the mount are plain files in " + cwd + "/rel/data.\n"; err != nil || !strings.HasSuffix(string(out), want) {
		t.Errorf("cairn demo rel: %v\n%s\nwant it to end with %q", err, out, want)
	}
}

// TestSdNotify: under systemd (Type=notify), cairn mount -f says READY=1
// once the mount is ready, and STOPPING=1 once it is unmounted.
func TestSdNotify(t *testing.T) {
	mounttest.Need(t)
	lower, mnt := t.TempDir(), t.TempDir()
	sock := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cmd := exec.Command(mounttest.Binary(t), "mount", "-f", "null:"+lower, mnt)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	buf := make([]byte, 256)
	n, err := l.Read(buf)
	if want := fmt.Sprintf("READY=1\nMAINPID=%d", cmd.Process.Pid); err != nil || string(buf[:n]) != want {
		t.Fatalf("notification %q (%v), want %q", buf[:n], err, want)
	}
	if m, ok := mountAt(mnt); !ok || m.Type != cairnType {
		t.Fatalf("READY=1 before the mount was made: %v %v", m, ok)
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
	if n, err = l.Read(buf); err != nil || string(buf[:n]) != "STOPPING=1" {
		t.Errorf("notification %q (%v), want STOPPING=1", buf[:n], err)
	}
}

// TestInstall: install.sh (./setup.sh --install) puts the command, the
// mount helper (pointing at the installed command), the man page and the
// systemd template under PREFIX and SBINDIR, or under DESTDIR for a
// package; systemd-analyze verifies an instance of the unit, its man page
// found.
func TestInstall(t *testing.T) {
	bin := mounttest.Binary(t)
	pfx := t.TempDir()
	run := func(env ...string) string {
		t.Helper()
		cmd := exec.Command("sh", "../../install.sh")
		cmd.Env = append(append(os.Environ(), "BIN="+bin), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install.sh %v: %v\n%s", env, err, out)
		}
		return string(out)
	}
	out := run("PREFIX="+pfx, "SBINDIR="+pfx+"/sbin")
	unit := pfx + "/lib/systemd/system/cairn@.service"
	man := pfx + "/share/man/man1/cairn.1"
	if want := "installed: " + pfx + "/bin/cairn, " + pfx + "/sbin/mount.fuse.cairn, " + man + ", " + unit + "\n"; out != want {
		t.Errorf("install.sh said %q, want %q", out, want)
	}
	if out, err := exec.Command(pfx+"/bin/cairn", "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "cairn ") {
		t.Errorf("installed cairn version: %v %s", err, out)
	}
	for file, want := range map[string]string{
		pfx + "/sbin/mount.fuse.cairn": "CAIRN=${CAIRN:-" + pfx + "/bin/cairn}\n",
		unit:                           "ExecStart=" + pfx + "/bin/cairn mount -f /etc/cairn/%i.toml %f\n",
		man:                            ".SH \"CAIRN MOUNT\"\n",
	} {
		if b, err := os.ReadFile(file); err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s: %v; want it to hold %q", file, err, want)
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		units := t.TempDir()
		b, _ := os.ReadFile(unit)
		os.WriteFile(units+"/cairn@.service", b, 0o644)
		os.Symlink("cairn@.service", units+"/cairn@mnt-data.service")
		args := []string{"verify", units + "/cairn@mnt-data.service"}
		if _, err := exec.LookPath("man"); err != nil {
			args = append(args, "--man=no") // its Documentation= needs man(1) to be checked
		}
		cmd := exec.Command("systemd-analyze", args...)
		cmd.Env = append(os.Environ(), "MANPATH="+pfx+"/share/man")
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("no systemd-analyze: the unit is not verified")
	}
	dest := t.TempDir()
	run("DESTDIR=" + dest)
	if b, err := os.ReadFile(dest + "/sbin/mount.fuse.cairn"); err != nil || !strings.Contains(string(b), "CAIRN=${CAIRN:-/usr/local/bin/cairn}\n") {
		t.Errorf("DESTDIR install: %v", err)
	}
	for _, f := range []string{"/usr/local/bin/cairn", "/usr/local/share/man/man1/cairn.1", "/usr/local/lib/systemd/system/cairn@.service"} {
		if _, err := os.Stat(dest + f); err != nil {
			t.Errorf("DESTDIR install: %v", err)
		}
	}
}

// TestSecondDaemonRefused: two daemons must not serve the same codec or
// crypt lower (each keeps its files' state in memory): a second mount
// elsewhere is refused, saying why; the lock is the kernel's (flock on the
// lower), so once the first daemon is killed (kill -9) the lower mounts
// again, and the dead mount is taken away by cairn umount.
func TestSecondDaemonRefused(t *testing.T) {
	mounttest.Need(t)
	pass := filepath.Join(t.TempDir(), "pass")
	os.WriteFile(pass, []byte("pw\n"), 0o600)
	for _, typ := range []string{"zstd", "crypt"} {
		lower, mnt1, mnt2 := t.TempDir(), t.TempDir(), t.TempDir()
		spec := typ + ":" + lower
		args := []string{"mount", "--passfile", pass}
		if typ == "crypt" {
			if out, code := cairn(t, "init", "--passfile", pass, "--argon2-memory", "19MiB", "--argon2-time", "2", spec); code != 0 {
				t.Fatalf("init: exit %d: %s", code, out)
			}
		}
		if out, code := cairn(t, append(args, spec, mnt1)...); code != 0 {
			t.Fatalf("%s: mount: exit %d: %s", typ, code, out)
		}
		out, code := cairn(t, append(args, spec, mnt2)...)
		want := "cairn: the files of the " + typ + " layer in " + lower + " are in use by another cairn process (a mount of this stack or an fsck, here or on another client of the same network file system; only mounts with -shared share it): unmount it first ('cairn umount MOUNTPOINT')\n"
		if code != 4 || out != want {
			t.Errorf("%s: second mount: exit %d, %q; want exit 4 and %q", typ, code, out, want)
		}
		pid, err := exec.Command("pgrep", "-f", "cairn mount --passfile "+pass+" "+spec+" "+mnt1+"$").Output()
		if err != nil {
			t.Fatalf("%s: the daemon of %s: %v", typ, mnt1, err)
		}
		exec.Command("kill", "-9", strings.TrimSpace(string(pid))).Run()
		waitExited(t, strings.TrimSpace(string(pid)))
		if out, code := cairn(t, append(args, spec, mnt2)...); code != 0 {
			t.Errorf("%s: mount after kill -9 of the first daemon: exit %d: %s", typ, code, out)
		}
		for _, m := range []string{mnt1, mnt2} {
			if out, code := cairn(t, "umount", m); code != 0 {
				t.Errorf("%s: umount %s: exit %d: %s", typ, m, code, out)
			}
		}
	}
}

// waitExited waits until process pid has exited (gone, or a zombie: its
// files, and so its locks, are released by then).
func waitExited(t *testing.T, pid string) {
	t.Helper()
	for i := 0; i < 500; i++ {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return
		}
		// A zombie whose other threads are gone too: the last of them
		// closes the files (a thread of an io_uring transport finishes
		// its ring's cancellations first).
		st, _ := os.ReadFile("/proc/" + pid + "/status")
		if _, after, ok := strings.Cut(string(b), ") "); ok && strings.HasPrefix(after, "Z") && strings.Contains(string(st), "\nThreads:\t1\n") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %s did not exit", pid)
}

// TestUmountDeadBusy: a dead mount (its daemon killed -9) that a process
// still uses (its working directory is under it) is detached lazily by
// cairn umount, which says so; the stack then mounts there again.
func TestUmountDeadBusy(t *testing.T) {
	mounttest.Need(t)
	mounttest.NeedRoot(t)
	lower, mnt := t.TempDir(), t.TempDir()
	spec := "null:" + lower
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	user := exec.Command("sleep", "600")
	user.Dir = mnt
	if err := user.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { user.Process.Kill(); user.Wait() }()
	pid, err := exec.Command("pgrep", "-f", "cairn mount "+spec+" "+mnt+"$").Output()
	if err != nil {
		t.Fatalf("the daemon of %s: %v", mnt, err)
	}
	exec.Command("kill", "-9", strings.TrimSpace(string(pid))).Run()
	waitExited(t, strings.TrimSpace(string(pid)))
	out, code := cairn(t, "umount", mnt)
	if want := "cairn: " + mnt + " is a dead mount still in use (a process's directory or open file is under it): detached lazily\n"; code != 0 || out != want {
		t.Errorf("umount: exit %d, %q; want 0 and %q", code, out, want)
	}
	if _, ok := mountAt(mnt); ok {
		t.Fatal("the dead mount is still there")
	}
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount again: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Errorf("umount: exit %d: %s", code, out)
	}
}

// TestFsckProgress: on a terminal fsck draws a bar (done/total, then the
// rate once it has run a tenth of a second) and clears it before its
// summary; elsewhere it draws nothing.
func TestFsckProgress(t *testing.T) {
	mounttest.Need(t)
	lower, mnt := t.TempDir(), t.TempDir()
	spec := "zstd:" + lower
	if out, code := cairn(t, "mount", spec, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	for i := 0; i < 20; i++ {
		os.WriteFile(filepath.Join(mnt, fmt.Sprint("f", i)), []byte("data"), 0o644)
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
	summary := "zstd layer: 20 files checked, 0 repaired, 0 index problems left, 0 damaged chunks\n"
	if out, code := cairn(t, "fsck", "-q", spec); code != 0 || out != summary {
		t.Errorf("fsck, not on a terminal: exit %d, %q; want %q", code, out, summary)
	}
	out, err := exec.Command("script", "-qec", mounttest.Binary(t)+" fsck -q "+spec, "/dev/null").Output()
	text := strings.ReplaceAll(string(out), "\r\n", "\n")
	if err != nil || !strings.Contains(text, "\r[=") || !strings.Contains(text, "] 19/20 ") || !strings.HasSuffix(text, "\r"+strings.Repeat(" ", 100)+"\r"+summary) {
		t.Errorf("fsck on a terminal: %v, %q", err, text)
	}
}
