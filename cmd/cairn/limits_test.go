package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/spec"
)

// TestSpecLimits: check and mount refuse, with the same message and exit
// code, a spec path that is a FIFO (instead of waiting for a writer), a
// spec file over the size limit and a stack deeper than spec.MaxDepth (with
// its position); check refuses first what mount would.
func TestSpecLimits(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "stack") // no .toml: not mistaken for the inline form either
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.toml")
	os.WriteFile(big, make([]byte, spec.MaxFileSize+1), 0o644)
	deep := strings.Repeat("null,", spec.MaxDepth) + "null:" + t.TempDir()
	for _, c := range []struct{ arg, want string }{
		{fifo, "is a FIFO (named pipe), not a regular file"},
		{big, fmt.Sprintf("a spec file may hold at most %d bytes", spec.MaxFileSize)},
		{deep, fmt.Sprintf("inline:1:%d: the stack is too deep: layer \"null-%d\" is layer %d down from the mounted layer \"null\", and a stack may be at most %d layers deep",
			5*spec.MaxDepth+1, spec.MaxDepth+1, spec.MaxDepth+1, spec.MaxDepth)},
	} {
		for _, cmd := range []string{"check", "mount"} {
			args := []string{cmd, c.arg}
			if cmd == "mount" {
				args = append(args, t.TempDir())
			}
			out, code := cairn(t, args...)
			if code != exitSpec || !strings.Contains(out, c.want) {
				t.Errorf("cairn %s %.60s: exit %d: %.500s\nwant exit %d and %q", cmd, c.arg, code, out, exitSpec, c.want)
			}
		}
	}
}

// TestCheckMountpoint: check with a MOUNTPOINT refuses one that mount would
// refuse (not a directory), as mount does.
func TestCheckMountpoint(t *testing.T) {
	lower := t.TempDir()
	missing := filepath.Join(t.TempDir(), "nothing")
	want := "mountpoint " + missing + " does not exist; create it first"
	if out, code := cairn(t, "check", "null:"+lower, missing); code != exitSpec || !strings.Contains(out, want) {
		t.Errorf("check: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "mount", "null:"+lower, missing); code != exitMount || !strings.Contains(out, want) {
		t.Errorf("mount: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "check", "null:"+lower, t.TempDir()); code != 0 {
		t.Errorf("check with a good mountpoint: exit %d: %s", code, out)
	}
}
