package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
)

// runCairn runs the cairn binary and returns its exit code and output.
func runCairn(t *testing.T, args ...string) (int, string) {
	t.Helper()
	out, code := mounttest.Run(t, args...)
	return code, out
}

func mountSource(t *testing.T, mp string) (string, bool) {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(info), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && f[4] == mp {
			for i, x := range f {
				if x == "-" && i+2 < len(f) {
					return f[i+2], true
				}
			}
		}
	}
	return "", false
}

// TestMountInline mounts an inline spec (with commas, parentheses and an
// option) through the real command, writes through it and checks the lower
// directory; then checks that bad specs and a mountpoint inside the lower
// are refused before anything is mounted.
func TestMountInline(t *testing.T) {
	mounttest.Need(t)
	dir := t.TempDir()
	lower := filepath.Join(dir, "lower")
	mp := filepath.Join(dir, "mnt")
	os.Mkdir(lower, 0o755)
	os.Mkdir(mp, 0o755)
	inline := "null,mux(names=x),null:" + lower
	if code, out := runCairn(t, "mount", inline, mp); code != 0 {
		t.Fatalf("cairn mount: exit %d\n%s", code, out)
	}
	t.Cleanup(func() { runCairn(t, "umount", "-z", mp) })
	if err := os.WriteFile(filepath.Join(mp, "x", "f"), []byte("through the stack"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(lower, "f")); err != nil || string(b) != "through the stack" {
		t.Fatalf("lower file: %q, %v", b, err)
	}
	if src, ok := mountSource(t, mp); !ok || src != "cairn:"+inline {
		t.Errorf("mount source %q, want %q", src, "cairn:"+inline)
	}
	if code, out := runCairn(t, "umount", mp); code != 0 {
		t.Fatalf("cairn umount: exit %d\n%s", code, out)
	}

	// A spec with mistakes: exit 3, every error with its position, no mount.
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("mount = \"top\"\n[layer.top]\ntype = \"nul\"\nover = \"base\"\n[layer.base]\ntype = \"local\"\npath = \"/nonexistent/cairn\"\n"), 0o644)
	code, out := runCairn(t, "mount", bad, mp)
	if code != exitSpec || !strings.Contains(out, "bad.toml:3:8: unknown layer type \"nul\"") || !strings.Contains(out, "bad.toml:7:8:") {
		t.Errorf("bad spec: exit %d\n%s", code, out)
	}
	if _, ok := mountSource(t, mp); ok {
		t.Errorf("a bad spec was mounted")
	}
	// The mountpoint inside the lower directory.
	inner := filepath.Join(lower, "inner")
	os.Mkdir(inner, 0o755)
	code, out = runCairn(t, "mount", "null:"+lower, inner)
	if code != exitMount || !strings.Contains(out, "is inside the lower directory") {
		t.Errorf("mountpoint inside the lower: exit %d\n%s", code, out)
	}
	if _, ok := mountSource(t, inner); ok {
		t.Errorf("mounted inside the lower")
	}
	// cairn check agrees, with the exit codes documented.
	if code, out := runCairn(t, "check", inline); code != 0 || !strings.Contains(out, "ok") {
		t.Errorf("check: exit %d\n%s", code, out)
	}
	if code, _ := runCairn(t, "check", bad); code != exitSpec {
		t.Errorf("check of a bad spec: exit %d", code)
	}
	if code, _ := runCairn(t, "check"); code != exitUsage {
		t.Errorf("check without a spec: exit %d", code)
	}
}
