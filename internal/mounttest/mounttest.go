// Package mounttest mounts cairn stacks through FUSE for tests.
package mounttest

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/layer"
)

// Mounted is a mounted stack.
type Mounted struct {
	Dir    string // the mountpoint
	Server *fusefs.Server
	t      testing.TB
	done   bool
}

// Need skips the test when FUSE mounts cannot be made here. On CI (CI=true)
// FUSE is required: Need fails the test instead of skipping it.
func Need(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("FUSE is required on CI but /dev/fuse is missing: %v", err)
		}
		t.Skipf("no FUSE here (/dev/fuse: %v)", err)
	}
}

// Mount mounts top on a new temporary directory with default options
// (allow_other, short caches) and unmounts it when the test ends.
func Mount(t testing.TB, top layer.FS) *Mounted {
	t.Helper()
	return MountOpts(t, top, fusefs.Options{AllowOther: true})
}

// MountOpts mounts with explicit options.
func MountOpts(t testing.TB, top layer.FS, o fusefs.Options) *Mounted {
	t.Helper()
	Need(t)
	dir := t.TempDir()
	// Tests act as other users too: let them reach the mountpoint.
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	if os.Getenv("CAIRN_FUSE_DEBUG") == "1" {
		// Every FUSE request and reply, on stderr (go-fuse's debug log).
		o.Debug = true
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(&testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	srv, err := fusefs.Mount(dir, top, o)
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	m := &Mounted{Dir: dir, Server: srv, t: t}
	t.Cleanup(func() { m.Unmount() })
	return m
}

// Unmount unmounts now (idempotent). It retries while the mount is busy.
func (m *Mounted) Unmount() {
	if m.done {
		return
	}
	m.done = true
	var err error
	for i := 0; i < 50; i++ {
		if err = m.Server.Unmount(); err == nil {
			m.Server.Wait()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	m.t.Errorf("unmount %s: %v", m.Dir, err)
	fusefs.Unmount(m.Dir, true)
}

// WaitReleased waits until the stack has released every file opened
// through the mount (at most 10 s): the kernel sends RELEASE after
// close(2) returns, and a layer's work at release (a header written, a
// file settled) comes after it.
func (m *Mounted) WaitReleased(t testing.TB) {
	t.Helper()
	m.WaitOpenFiles(t, 0)
}

// WaitOpenFiles waits until the stack has n files open for the mount (at
// most 10 s): the files still open, the others released (see
// WaitReleased).
func (m *Mounted) WaitOpenFiles(t testing.TB, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := m.Server.OpenFiles()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d files open in the stack 10 s on, want %d", got, n)
		}
	}
}

// Path joins names under the mountpoint.
func (m *Mounted) Path(names ...string) string {
	return m.Dir + "/" + strings.Join(names, "/")
}

type testWriter struct{ t testing.TB }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
