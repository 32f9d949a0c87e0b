package codec

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// appendLines appends n lines to p through the mount, each in an open of
// its own (a log written by a program that opens, appends and closes).
func appendLines(t *testing.T, p string, n, from int) []byte {
	t.Helper()
	var all []byte
	for i := range n {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("%06d the quick brown fox jumps over the lazy dog, again and again and again\n", from+i)
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		all = append(all, line...)
	}
	return all
}

// TestFoldAtRest: a file appended to in many opens (each close stores its
// bytes as an unencoded fast tail) and then left alone is folded: its
// chunks encoded again and the log compacted, so that what is at rest is
// compressed; its bytes, size and mtime are unchanged, it reads back the
// same after a remount, and fsck finds it clean. Files pushed out of the
// idle states before their fold (more than maxIdle closed files) are folded
// too, before the unmount returns.
func TestFoldAtRest(t *testing.T) {
	dir := t.TempDir()
	// The delay is long enough that a slow release (or a test descheduled
	// on a busy machine) still finds the file unfolded before it.
	fs := newStackAt(t, dir, "zstd", Options{FastTails: true, FoldDelay: 2 * time.Second})
	m := mounttest.Mount(t, fs)
	want := appendLines(t, m.Path("log"), 300, 0)
	lp := filepath.Join(dir, "log")
	// The last release (after the last close) writes the header: the
	// times to keep are those it leaves.
	waitReleased(t, fs)
	var before unix.Stat_t
	unix.Stat(lp, &before)
	if before.Size < int64(len(want)) {
		t.Fatalf("before the fold the lower holds %d bytes for %d appended: not fast tails?", before.Size, len(want))
	}
	deadline := time.Now().Add(20 * time.Second)
	var after unix.Stat_t
	for {
		unix.Stat(lp, &after)
		if after.Size < int64(len(want))/4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if after.Size >= int64(len(want))/4 {
		t.Fatalf("not folded: the lower holds %d bytes for %d of text", after.Size, len(want))
	}
	// The log is compacted before the fold puts the times back: the fold
	// holds the file open until it is done.
	waitReleased(t, fs)
	unix.Stat(lp, &after)
	t.Logf("%d bytes appended in 300 opens: %d bytes stored before the fold, %d after", len(want), before.Size, after.Size)
	if after.Mtim != before.Mtim {
		t.Errorf("the fold moved the lower mtime: %v -> %v", before.Mtim, after.Mtim)
	}
	if b, err := os.ReadFile(m.Path("log")); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("after the fold: %d bytes, %v", len(b), err)
	}
	// Appends after a fold are fast tails again, and fold again.
	want = append(want, appendLines(t, m.Path("log"), 50, 300)...)

	// More closed files than the engine keeps: the oldest are folded as
	// they are let go of, the others at the unmount.
	wants := map[string][]byte{}
	for i := range maxIdle + 8 {
		name := fmt.Sprintf("f%02d", i)
		wants[name] = appendLines(t, m.Path(name), 20, 0)
	}
	// The last closes' releases come after close(2) returns; those the
	// kernel has not sent when it unmounts are made by the mount before
	// Unmount returns. Closing the engine folds what is due then.
	m.Unmount()
	layer.CloseStack(fs)
	for name, w := range wants {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Size() >= int64(len(w)) {
			t.Errorf("%s: %d bytes stored for %d of text after the unmount (%v)", name, fi.Size(), len(w), err)
		}
	}
	fs2 := newStackAt(t, dir, "zstd", Options{FastTails: true})
	ctx := context.Background()
	if b, err := layer.ReadFile(ctx, fs2, "log"); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("after a remount: %d bytes, %v", len(b), err)
	}
	for name, w := range wants {
		if b, err := layer.ReadFile(ctx, fs2, name); err != nil || !bytes.Equal(b, w) {
			t.Errorf("%s after a remount: %d bytes, %v", name, len(b), err)
		}
	}
	for _, name := range append([]string{"log"}, keys(wants)...) {
		rep, err := fs2.Check(ctx, name, CheckOnly)
		if err != nil || !rep.OK() {
			t.Errorf("fsck %s: %s, %v", name, rep.String(), err)
		}
	}
}

// waitReleased waits until no file of fs is open in its engine: the
// kernel's RELEASE, which comes after close(2) returns, has reached it.
func waitReleased(t *testing.T, fs *FS) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		open := 0
		fs.e.mu.Lock()
		for _, st := range fs.e.states {
			if st.refs > 0 {
				open++
			}
		}
		fs.e.mu.Unlock()
		if open == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d files still open in the engine 10 s after their close", open)
		}
	}
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestFoldDueAfterLastClose: the fold is due FoldDelay after the file's
// last close, not its first: a log appended to in opens closer together
// than FoldDelay stays as fast tails however long it goes on (a fold in
// between would encode chunks that the next append rewrites).
func TestFoldDueAfterLastClose(t *testing.T) {
	const delay = 600 * time.Millisecond
	ctx := context.Background()
	dir := t.TempDir()
	fs := newStackAt(t, dir, "zstd", Options{FastTails: true, FoldDelay: delay})
	// Each append is 40 lines: compressed, even one is far smaller.
	line := bytes.Repeat([]byte("the quick brown fox jumps over the lazy dog, again and again and again\n"), 40)
	if err := layer.WriteFile(ctx, fs, "log", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var lastClose time.Time
	appendOne := func() {
		f, err := fs.Open(ctx, "log", unix.O_WRONLY|unix.O_APPEND)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, line, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lastClose = time.Now()
	}
	// The first append to a new file is encoded at its flush; the
	// others are fast tails, stored as they are.
	appendOne()
	var base unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "log"), &base); err != nil {
		t.Fatal(err)
	}
	// since is the size the lower had after the last round that may have
	// been folded rightly, and tails the appends since then.
	n, conclusive, since, tails := 1, 0, base.Size, 0
	for round := 0; round < 6; round++ {
		idle := time.Since(lastClose) // since the last close, before this open
		appendOne()
		n++
		tails++
		time.Sleep(delay / 2)
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(dir, "log"), &st); err != nil {
			t.Fatal(err)
		}
		if idle >= delay || time.Since(lastClose) >= delay {
			// Stalled past the delay (before this open, or before the
			// look): a fold would be right, and the next rounds count
			// from what is stored once one under way is done (a fold
			// holds the file open).
			waitReleased(t, fs)
			if err := unix.Stat(filepath.Join(dir, "log"), &st); err != nil {
				t.Fatal(err)
			}
			since, tails = st.Size, 0
			continue
		}
		conclusive++
		if st.Size < since+int64(tails*len(line)) {
			t.Fatalf("folded %v after the last close (fold delay %v, %v idle before it), %d since the first: the lower holds %d bytes for %d appended",
				time.Since(lastClose).Round(time.Millisecond), delay, idle.Round(time.Millisecond), round, st.Size, n*len(line))
		}
	}
	if conclusive < 2 {
		t.Fatalf("only %d of 6 rounds took less than the fold delay: the machine is too slow to tell", conclusive)
	}
	// And left alone, it is folded.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st unix.Stat_t
		unix.Stat(filepath.Join(dir, "log"), &st)
		if st.Size < base.Size+int64((n-1)*len(line)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not folded %v after the last close", time.Since(lastClose))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, err := layer.ReadFile(ctx, fs, "log"); err != nil || !bytes.Equal(b, bytes.Repeat(line, n)) {
		t.Fatalf("after the fold: %d bytes, %v", len(b), err)
	}
}
