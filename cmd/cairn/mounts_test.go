package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn/internal/mounttest"
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
	for i := 0; i < 100 && !isDead(mnt); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	out, code = cairn(t, "mount", spec, mnt)
	expect(out, code, 4, "mountpoint "+mnt+" is a dead cairn mount (the process that served it is gone); run 'cairn umount "+mnt+"' first")
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
