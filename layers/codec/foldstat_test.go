package codec

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestFoldShowsInStat: a fold at rest changes the file's blocks after its
// last close, with no operation through the mount; the kernel, which keeps
// a stack's attributes for a day when the stack is the only writer of its
// lower, is told (layer.ChangeReporter), so a stat through the mount shows
// the folded file's blocks, not those it had before.
func TestFoldShowsInStat(t *testing.T) {
	dir := t.TempDir()
	fs := newStackAt(t, dir, "zstd", Options{FastTails: true, FoldDelay: time.Second})
	m := mounttest.Mount(t, fs)
	// The stat through the mount must come before the fold (else the
	// test shows nothing): on a machine slow enough to fold in between,
	// try again with another file.
	var want []byte
	var before, lower unix.Stat_t
	name := ""
	for try := 0; ; try++ {
		name = fmt.Sprintf("log%d", try)
		want = appendLines(t, m.Path(name), 200, 0)
		if err := unix.Stat(m.Path(name), &before); err != nil { // the kernel keeps these
			t.Fatal(err)
		}
		if err := unix.Stat(filepath.Join(dir, name), &lower); err != nil {
			t.Fatal(err)
		}
		if lower.Size >= int64(len(want)) {
			break // not folded yet
		}
		if try == 3 {
			t.Fatal("folded before a stat could follow the last append, 4 times in a row")
		}
	}
	lp := filepath.Join(dir, name)
	deadline := time.Now().Add(20 * time.Second)
	for {
		unix.Stat(lp, &lower)
		if lower.Size < int64(len(want))/4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not folded: the lower holds %d bytes", lower.Size)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The notice reaches the kernel just after the fold's last write.
	var got unix.Stat_t
	for {
		if err := unix.Stat(m.Path(name), &got); err != nil {
			t.Fatal(err)
		}
		if got.Blocks == lower.Blocks || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got.Blocks != lower.Blocks || got.Size != int64(len(want)) {
		t.Fatalf("after the fold the mount shows %d blocks and %d bytes (before: %d blocks); the lower has %d blocks",
			got.Blocks, got.Size, before.Blocks, lower.Blocks)
	}
	if before.Blocks == lower.Blocks {
		t.Fatalf("the fold did not change the blocks (%d): the test shows nothing", before.Blocks)
	}
	if b, err := os.ReadFile(m.Path(name)); err != nil || string(b) != string(want) {
		t.Fatalf("read %d bytes, %v", len(b), err)
	}
}
