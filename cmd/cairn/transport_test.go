package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestMountTransport: -transport names how the kernel's requests reach the
// daemon; a bad name is a usage error, io_uring with the kernel's
// enable_uring off is refused saying what to do (checked where it is off),
// and a mount over io_uring says so in its log and serves the stack.
func TestMountTransport(t *testing.T) {
	mounttest.NeedRoot(t)
	lower, mnt := t.TempDir(), t.TempDir()
	logf := filepath.Join(t.TempDir(), "cairn.log")
	if out, code := cairn(t, "mount", "-transport", "pigeon", "null:"+lower, mnt); code != 2 || !strings.Contains(out, `unknown FUSE transport "pigeon" (known: auto, dev, uring)`) {
		t.Errorf("-transport pigeon: exit %d, %q", code, out)
	}
	const param = "/sys/module/fuse/parameters/enable_uring"
	b, err := os.ReadFile(param)
	if err != nil {
		t.Fatalf("this kernel has no FUSE over io_uring: %v", err)
	}
	if strings.TrimSpace(string(b)) != "Y" {
		if out, code := cairn(t, "mount", "-transport", "uring", "null:"+lower, mnt); code != 4 || !strings.Contains(out, "echo Y > "+param) {
			t.Errorf("-transport uring with enable_uring off: exit %d, %q", code, out)
		}
		if err := os.WriteFile(param, []byte("Y"), 0); err != nil {
			t.Fatal(err)
		}
		if tr := os.Getenv("CAIRN_FUSE_TRANSPORT"); tr != "uring" && tr != "auto" {
			t.Cleanup(func() { os.WriteFile(param, []byte("N"), 0) })
		}
	}
	if out, code := cairn(t, "mount", "--log-file", logf, "-transport", "uring", "null:"+lower, mnt); code != 0 {
		t.Fatalf("-transport uring: exit %d, %q", code, out)
	}
	defer cairn(t, "umount", mnt)
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("over io_uring"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(lower, "f")); err != nil || string(b) != "over io_uring" {
		t.Errorf("lower f: %q %v", b, err)
	}
	if b, _ := os.ReadFile(logf); !strings.Contains(string(b), `"transport":"io_uring"`) {
		t.Errorf("the log does not say the mount is served over io_uring:\n%s", b)
	}
}
