//go:build linux

package crypt

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
)

// fsxOps is the length of the model test through a mount (CAIRN_LONG=1:
// ten times more).
func fsxOps(n int) int {
	if os.Getenv("CAIRN_LONG") != "" {
		return 10 * n
	}
	return n
}

func TestFsxThroughMount(t *testing.T) {
	_, fs := stack(t)
	m := mounttest.Mount(t, fs)
	if m.Server.Passthrough {
		t.Fatal("a crypt stack must not use passthrough")
	}
	fsx.Run(t, fsx.Config{Dir: m.Dir, Ops: fsxOps(10000), Punch: true})
}

// TestFsxLong is the long model test (100,000 operations), through a cairn
// process so that the race detector slows only the model, not the server.
func TestFsxLong(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	p := mounttest.MountSpec(t, specFor(t, dir, ""))
	fsx.Run(t, fsx.Config{Dir: p.Dir, Ops: fsxOps(100000), Punch: true})
}

// specFor writes a passphrase file and returns a spec of a crypt layer over
// dir.
func specFor(t *testing.T, dir string, extra string) string {
	pf := filepath.Join(t.TempDir(), "pass")
	if err := os.WriteFile(pf, append(testPass, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return "mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = " + strconv.Quote(dir) +
		"\n[layer.top]\ntype = \"crypt\"\nover = \"base\"\npassfile = " + strconv.Quote(pf) + "\n" + extra
}

func TestFsxMmapProcess(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	p := mounttest.MountSpec(t, specFor(t, dir, ""))
	fsx.Run(t, fsx.Config{Dir: p.Dir, Ops: fsxOps(10000), Mmap: true, Punch: true})
}

// TestFsxWriteback runs the model with mmap over a crypt mount with the
// kernel's writeback cache (cairn mount -writeback): writes come later, in
// larger pieces, through any file of the object open for writing.
func TestFsxWriteback(t *testing.T) {
	dir, _ := newVolume(t, InitParams{})
	p := mounttest.MountSpec(t, "writeback = true\n"+specFor(t, dir, ""))
	fsx.Run(t, fsx.Config{Dir: p.Dir, Ops: fsxOps(10000), Mmap: true, Punch: true})
}
