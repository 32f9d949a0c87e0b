package mounttest

import (
	"os"
	"syscall"
	"testing"
)

// Tmpfs mounts a new, small tmpfs on dir (made if missing; a new temporary
// directory if dir is "") and unmounts it when the test ends. Each tmpfs is
// its own file system, with its own device number and inode numbers counted
// from the start: two of them, or one inside a lower directory, give files
// of different file systems with equal inode numbers. Needs root.
func Tmpfs(t testing.TB, dir string) string {
	t.Helper()
	return TmpfsFlags(t, dir, 0)
}

// TmpfsFlags is Tmpfs with mount(2) flags (MS_NOATIME, MS_STRICTATIME...).
func TmpfsFlags(t testing.TB, dir string, flags uintptr) string {
	t.Helper()
	return tmpfs(t, dir, flags, "64m")
}

// TmpfsSize is Tmpfs of size bytes (tmpfs's size= option: "16m"), for
// tests that fill it (ENOSPC).
func TmpfsSize(t testing.TB, dir, size string) string {
	t.Helper()
	return tmpfs(t, dir, 0, size)
}

func tmpfs(t testing.TB, dir string, flags uintptr, size string) string {
	t.Helper()
	NeedRoot(t)
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mountTmpfs(dir, flags, size); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			syscall.Unmount(dir, mntDetach)
		}
	})
	return dir
}
