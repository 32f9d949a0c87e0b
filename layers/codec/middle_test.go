//go:build linux

package codec

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/faultfs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
)

// logRecord is a record of a lower file, as the test reads it.
type logRecord struct {
	r       rec
	off     int64
	payload []byte
}

// recordsFrom parses the records of the lower file raw from offset from on.
func recordsFrom(t *testing.T, raw []byte, from int64) []logRecord {
	t.Helper()
	sl, ok := bestSlot(raw)
	if !ok {
		t.Fatal("no header")
	}
	var out []logRecord
	for p := from; p+recHdrSize <= int64(len(raw)); {
		r, err := parseRec(raw[p:], sl.salt, sl.shift)
		if err != nil {
			t.Fatalf("record at %d: %v", p, err)
		}
		end := p + recHdrSize + int64(r.encLen)
		out = append(out, logRecord{r, p, raw[p+recHdrSize : end]})
		p = end
	}
	return out
}

// hasDeltas says whether path's file has deltas in fs's index (opening
// it in fs).
func hasDeltas(t *testing.T, fs *FS, path string) bool {
	t.Helper()
	ctx := context.Background()
	st, err := fs.e.openState(ctx, path, os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	d := st.hasDeltas()
	st.mu.Unlock()
	fs.e.put(ctx, st)
	return d
}

// statesHaveDeltas says whether a file known to fs's engine has deltas,
// without opening it (an open would put its fold off).
func statesHaveDeltas(fs *FS) bool {
	fs.e.mu.Lock()
	var sts []*state
	for _, st := range fs.e.states {
		sts = append(sts, st)
	}
	fs.e.mu.Unlock()
	for _, st := range sts {
		st.mu.Lock()
		d := st.chunks != nil && st.hasDeltas()
		st.mu.Unlock()
		if d {
			return true
		}
	}
	return false
}

// writeAtClose opens p, writes each of ws at its offset, and closes it.
func writeAtClose(t *testing.T, p string, ws map[int64][]byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for off, w := range ws {
		if _, err := f.WriteAt(w, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestWriteMiddleDelta: a write into the middle of a file, in a chunk the
// log holds, appends a delta record of the written bytes (not the chunk
// encoded again): the lower file grows by the record and nothing before it
// changes but the header. Writes of one open that touch are one delta; a
// write across a chunk boundary is a delta in each. The file reads back
// right, after a remount (the log replayed) and after the fold at rest,
// which encodes the chunks with deltas again; fsck finds it clean
// throughout.
func TestWriteMiddleDelta(t *testing.T) {
	ctx := context.Background()
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			lp := filepath.Join(dir, "f")
			fs := newStackAt(t, dir, name, Options{FastTails: true, FoldDelay: -1})
			cs := int64(1) << fs.e.shift
			r := rand.New(rand.NewPCG(7, 8))
			want := text(r, int(4*cs+cs/3))
			m := mounttest.Mount(t, fs)
			if err := os.WriteFile(m.Path("f"), want, 0o644); err != nil {
				t.Fatal(err)
			}
			waitReleased(t, fs)
			raw0, _ := os.ReadFile(lp)

			// One 4 KiB write in the middle of chunk 1.
			w := bytes.ToUpper(text(r, 4096))
			off := cs + cs/3
			writeAtClose(t, m.Path("f"), map[int64][]byte{off: w})
			copy(want[off:], w)
			waitReleased(t, fs)
			raw1, _ := os.ReadFile(lp)
			if !bytes.Equal(raw1[headerSize:len(raw0)], raw0[headerSize:]) {
				t.Fatalf("the log before the write changed")
			}
			recs := recordsFrom(t, raw1, int64(len(raw0)))
			if len(recs) != 1 || recs[0].r.typ != recDelta || recs[0].r.arg != 1 || int64(recs[0].r.aux) != cs/3 || !bytes.Equal(recs[0].payload, w) {
				t.Fatalf("a 4 KiB write in chunk 1 appended %d bytes: %+v, want one delta record of it", len(raw1)-len(raw0), recs)
			}
			if b, err := os.ReadFile(m.Path("f")); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("after the write: %v, first difference %d", err, firstDiff(b, want))
			}

			// Two writes that touch (one delta), and one across the
			// boundary of chunks 2 and 3 (a delta in each).
			a, b := bytes.ToUpper(text(r, 100)), bytes.ToUpper(text(r, 200))
			x := bytes.ToUpper(text(r, 3000))
			ws := map[int64][]byte{2*cs + 1000: a, 2*cs + 1100: b, 3*cs - 1000: x}
			writeAtClose(t, m.Path("f"), ws)
			for o, p := range ws {
				copy(want[o:], p)
			}
			waitReleased(t, fs)
			raw2, _ := os.ReadFile(lp)
			var got []logRecord
			for _, rc := range recordsFrom(t, raw2, int64(len(raw1))) {
				if rc.r.typ != recIndex {
					got = append(got, rc)
				}
			}
			if len(got) != 3 {
				t.Fatalf("%d records for three writes, want 3 deltas: %+v", len(got), got)
			}
			for i, wantRec := range []struct {
				c, aux int64
				p      []byte
			}{{2, 1000, want[2*cs+1000 : 2*cs+1300]}, {2, cs - 1000, want[3*cs-1000 : 3*cs]}, {3, 0, want[3*cs : 3*cs+2000]}} {
				g := got[i]
				if g.r.typ != recDelta || int64(g.r.arg) != wantRec.c || int64(g.r.aux) != wantRec.aux || !bytes.Equal(g.payload, wantRec.p) {
					t.Errorf("record %d: %+v, want a delta of chunk %d at %d of %d bytes", i, g.r, wantRec.c, wantRec.aux, len(wantRec.p))
				}
			}
			if b, err := os.ReadFile(m.Path("f")); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("after the writes: %v, first difference %d", err, firstDiff(b, want))
			}
			m.Unmount()
			layer.CloseStack(fs)

			// A remount replays the deltas.
			fs2 := newStackAt(t, dir, name, Options{FastTails: true, FoldDelay: 10 * time.Millisecond})
			if rep, err := fs2.Check(ctx, "f", CheckOnly); err != nil || !rep.OK() {
				t.Fatalf("fsck with deltas: %s, %v", rep.String(), err)
			}
			m2 := mounttest.Mount(t, fs2)
			if b, err := os.ReadFile(m2.Path("f")); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("after a remount: %v, first difference %d", err, firstDiff(b, want))
			}
			// The read's close schedules the fold: chunks 1, 2 and 3
			// are encoded again, and their deltas are gone.
			waitReleased(t, fs2)
			for deadline := time.Now().Add(10 * time.Second); statesHaveDeltas(fs2); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("not folded 10 s after the last close")
				}
			}
			waitReleased(t, fs2) // the fold holds the file open until it is done
			if b, err := os.ReadFile(m2.Path("f")); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("after the fold: %v, first difference %d", err, firstDiff(b, want))
			}
			m2.Unmount()
			layer.CloseStack(fs2)
			raw3, _ := os.ReadFile(lp)
			t.Logf("lower file: %d bytes written whole, %d with deltas, %d folded", len(raw0), len(raw2), len(raw3))
			fs3 := newStackAt(t, dir, name, Options{FoldDelay: -1})
			if hasDeltas(t, fs3, "f") {
				t.Fatal("deltas left after the fold")
			}
			if b, err := layer.ReadFile(ctx, fs3, "f"); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("after the fold and a remount: %v, first difference %d", err, firstDiff(b, want))
			}
			if rep, err := fs3.Check(ctx, "f", CheckOnly); err != nil || !rep.OK() {
				t.Fatalf("fsck after the fold: %s, %v", rep.String(), err)
			}
		})
	}
}

// TestWriteMiddleLimits: a chunk takes deltas until they would exceed a
// chunk's bytes (or maxDeltas), then is encoded whole, and takes deltas
// again; writes too scattered within one open (more ranges than maxDeltas)
// encode it whole at once. The file reads back right after each step and
// after a remount.
func TestWriteMiddleLimits(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	lp := filepath.Join(dir, "f")
	fs := newStackAt(t, dir, "gzip", Options{ChunkSize: 16 << 10, FastTails: true, FoldDelay: -1})
	cs := int64(16 << 10)
	r := rand.New(rand.NewPCG(9, 10))
	want := text(r, int(3*cs))
	m := mounttest.Mount(t, fs)
	if err := os.WriteFile(m.Path("f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	waitReleased(t, fs)
	kinds := ""
	for i := range 20 {
		size, _ := os.Stat(lp)
		// 1 KiB at a different place of chunk 1 each time.
		off := cs + int64(i%16)*1024
		w := bytes.ToUpper(text(r, 1000))
		writeAtClose(t, m.Path("f"), map[int64][]byte{off: w})
		copy(want[off:], w)
		waitReleased(t, fs)
		raw, _ := os.ReadFile(lp)
		for _, rc := range recordsFrom(t, raw, size.Size()) {
			switch rc.r.typ {
			case recDelta:
				kinds += "d"
			case recChunk:
				kinds += "C"
			}
		}
		if b, err := os.ReadFile(m.Path("f")); err != nil || !bytes.Equal(b, want) {
			t.Fatalf("after write %d: %v, first difference %d", i, err, firstDiff(b, want))
		}
	}
	// 16 deltas of 1000 bytes fit in 16 KiB; the 17th is over.
	if want := "ddddddddddddddddCddd"; kinds != want {
		t.Errorf("records of 20 writes: %s, want %s", kinds, want)
	}

	// 300 one-byte writes 2 bytes apart in one open: more ranges than
	// maxDeltas (256).
	size, _ := os.Stat(lp)
	ws := map[int64][]byte{}
	for i := range int64(300) {
		ws[2*cs+2*i] = []byte{'#'}
		want[2*cs+2*i] = '#'
	}
	writeAtClose(t, m.Path("f"), ws)
	waitReleased(t, fs)
	raw, _ := os.ReadFile(lp)
	kinds = ""
	for _, rc := range recordsFrom(t, raw, size.Size()) {
		if rc.r.typ == recDelta || rc.r.typ == recChunk {
			kinds += map[uint8]string{recDelta: "d", recChunk: "C"}[rc.r.typ]
		}
	}
	if kinds != "C" {
		t.Errorf("300 scattered bytes in one chunk: records %q, want one chunk record", kinds)
	}
	if b, err := os.ReadFile(m.Path("f")); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("after scattered writes: %v, first difference %d", err, firstDiff(b, want))
	}
	m.Unmount()
	layer.CloseStack(fs)
	fs2 := newStackAt(t, dir, "gzip", Options{})
	if b, err := layer.ReadFile(ctx, fs2, "f"); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("after a remount: %v, first difference %d", err, firstDiff(b, want))
	}
	if rep, err := fs2.Check(ctx, "f", CheckOnly); err != nil || !rep.OK() {
		t.Fatalf("fsck: %s, %v", rep.String(), err)
	}
}

// TestWarmReadKeepsPages: a file read once is read again from the kernel's
// pages, not decoded again, across opens (layer.CapKeepCache): 4 KiB reads
// at random offsets, each in an open of its own, reach the lower file not
// once. Writes in the middle through the mount leave the pages right (the
// kernel drops them when it sees the mtime change: the read after them is
// a cold one).
func TestWarmReadKeepsPages(t *testing.T) {
	dir := t.TempDir()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	cnt := mounttest.CountIO(l)
	fs, err := New(cnt, "zstd", Options{Level: levelOf("zstd"), FastTails: true, FoldDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	m := mounttest.Mount(t, fs)
	r := rand.New(rand.NewPCG(11, 12))
	want := text(r, 4<<20)
	if err := os.WriteFile(m.Path("f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(m.Path("f")); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("first read: %v, first difference %d", err, firstDiff(b, want))
	}
	for i := range 8 {
		w := bytes.ToUpper(text(r, 4096))
		off := int64(i)<<19 + 1000
		writeAtClose(t, m.Path("f"), map[int64][]byte{off: w})
		copy(want[off:], w)
	}
	waitReleased(t, fs)
	if b, err := os.ReadFile(m.Path("f")); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("read after writes in the middle: %v, first difference %d", err, firstDiff(b, want))
	}
	before := cnt.Reads.Load()
	b := make([]byte, 4096)
	for range 100 {
		off := r.Int64N(int64(len(want)) - 4096)
		f, err := os.Open(m.Path("f"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.ReadAt(b, off); err != nil || !bytes.Equal(b, want[off:off+4096]) {
			t.Fatalf("read at %d: %v, first difference %d", off, err, firstDiff(b, want[off:off+4096]))
		}
		f.Close()
	}
	if n := cnt.Reads.Load() - before; n != 0 {
		t.Errorf("100 warm 4 KiB reads, each in an open: %d reads of the lower file, want none", n)
	}
}

// TestCrashPointsFold stops the fold of a file written in the middle
// (deltas on most of its chunks, every write fsync'ed) at a chosen byte: a
// torn write, then nothing, as a crash leaves it. The fold appends chunk
// records, compacts (copies at the end, a reset record, copies at the
// front, a cut), and writes checkpoints and header slots: a crash anywhere
// in that leaves the file reading exactly as it was fsync'ed, on a fresh
// stack, and fsck finds nothing wrong. CAIRN_LONG=1: 400 points per codec
// instead of 25.
func TestCrashPointsFold(t *testing.T) {
	ctx := context.Background()
	points := 25
	if os.Getenv("CAIRN_LONG") == "1" {
		points = 400
	}
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			setup := func(dir string) (*faultfs.FS, *FS, []byte) {
				ff, fs := openFaultStack(t, dir, name, Options{ChunkSize: 4096, FastTails: true, FoldDelay: -1, CompactMin: 8 << 10, Logger: quiet})
				r := rand.New(rand.NewPCG(21, 22))
				want := text(r, 60<<10)
				if err := writeSynced(ctx, fs, "f", want); err != nil {
					t.Fatal(err)
				}
				for range 40 {
					f, err := fs.Open(ctx, "f", unix.O_RDWR)
					if err != nil {
						t.Fatal(err)
					}
					off := r.IntN(len(want) - 600)
					b := bytes.ToUpper(text(r, 1+r.IntN(600)))
					copy(want[off:], b)
					if _, err := f.WriteAt(ctx, b, int64(off)); err != nil {
						t.Fatal(err)
					}
					if err := f.Fsync(ctx, false); err != nil {
						t.Fatal(err)
					}
					if err := f.Release(ctx); err != nil {
						t.Fatal(err)
					}
				}
				return ff, fs, want
			}
			// fold folds f as the engine does once it has been closed for
			// FoldDelay; the errors are the crash's.
			fold := func(fs *FS) {
				st, err := fs.e.openState(ctx, "f", unix.O_RDWR)
				if err != nil {
					t.Fatal(err)
				}
				st.mu.Lock()
				if !st.hasDeltas() {
					t.Fatal("nothing to fold: the writes in the middle left no deltas")
				}
				st.fold(ctx)
				st.mu.Unlock()
				fs.e.put(ctx, st)
			}
			ff, fs, want := setup(t.TempDir())
			ff.Set(faultfs.Faults{})
			fold(fs)
			total := ff.Written()
			layer.CloseStack(fs)
			r := rand.New(rand.NewPCG(uint64(len(name)), 23))
			for range points {
				at := 1 + r.Int64N(total)
				dir := t.TempDir()
				ff, fs, _ := setup(dir)
				ff.Set(faultfs.Faults{CrashAfter: at})
				fold(fs)
				if !ff.Crashed() {
					t.Fatalf("crash point %d of %d not reached", at, total)
				}
				layer.CloseStack(fs)
				_, fresh := openFaultStack(t, dir, name, Options{FoldDelay: -1, Logger: quiet})
				got, err := layer.ReadFile(ctx, fresh, "f")
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("crash at byte %d of the fold's %d: %d bytes (%v), want %d, first difference %d", at, total, len(got), err, len(want), firstDiff(got, want))
				}
				rep, err := fresh.Check(ctx, "f", CheckOnly)
				if err != nil || len(rep.Problems) > 0 || len(rep.Damaged) > 0 || rep.Lost != "" {
					t.Fatalf("crash at byte %d of the fold's %d: fsck: %s, %v", at, total, rep.String(), err)
				}
				layer.CloseStack(fresh)
			}
			t.Logf("%d crash points in a fold that writes %d bytes", points, total)
		})
	}
}

// TestFoldYieldsToOpen: the fold of a file written all over (deltas on
// every chunk) encodes a few chunks at a time, and stops when the file is
// opened meanwhile, rather than keep the opener waiting for every chunk's
// encoding; the rest is folded after the opener's close. The file reads
// right throughout.
func TestFoldYieldsToOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fs := newStackAt(t, dir, "zstd", Options{FastTails: true, FoldDelay: 50 * time.Millisecond})
	cs := int64(1) << fs.e.shift
	m := mounttest.Mount(t, fs)
	r := rand.New(rand.NewPCG(13, 14))
	want := text(r, int(12*cs))
	if err := os.WriteFile(m.Path("f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	ws := map[int64][]byte{}
	for c := range int64(12) {
		w := bytes.ToUpper(text(r, 4096))
		ws[c*cs+cs/2] = w
		copy(want[c*cs+cs/2:], w)
	}
	writeAtClose(t, m.Path("f"), ws)
	waitReleased(t, fs)
	// The fold's own reference (as the timer takes it), then an open
	// through the mount, then the fold.
	st, err := fs.e.openState(ctx, "f", os.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(m.Path("f"))
	if err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	err = st.fold(ctx)
	folded, left := 0, 0
	for _, ops := range st.chunks {
		if chunkHasDelta(ops) {
			left++
		} else {
			folded++
		}
	}
	st.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if n := st.maxDirty(); folded != n || left != 12-n {
		t.Errorf("fold with the file opened meanwhile: %d chunks folded, %d left with deltas; want %d and %d", folded, left, n, 12-n)
	}
	if b, err := io.ReadAll(f); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("read after a partial fold: %v, first difference %d", err, firstDiff(b, want))
	}
	f.Close()
	fs.e.put(ctx, st)
	for deadline := time.Now().Add(10 * time.Second); statesHaveDeltas(fs); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the rest not folded 10 s after the last close")
		}
	}
	waitReleased(t, fs)
	if b, err := os.ReadFile(m.Path("f")); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("after the fold: %v, first difference %d", err, firstDiff(b, want))
	}
}

// TestOpenDuringEvictedFold: a closed file with deltas that the engine lets
// go of (more than maxIdle files closed since) is folded at once, in the
// background; an open of it meanwhile waits for that fold rather than load
// the file beside it (two states of one file would append at the same log
// end). The file is written in the middle again at once, and reads right
// after a remount; fsck finds it clean.
func TestOpenDuringEvictedFold(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fs := newStackAt(t, dir, "zstd", Options{FastTails: true, FoldDelay: time.Hour})
	cs := int64(1) << fs.e.shift
	m := mounttest.Mount(t, fs)
	r := rand.New(rand.NewPCG(15, 16))
	want := text(r, int(16*cs))
	if err := os.WriteFile(m.Path("f"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	ws := map[int64][]byte{}
	for c := range int64(16) {
		w := bytes.ToUpper(text(r, 4096))
		ws[c*cs+cs/3] = w
		copy(want[c*cs+cs/3:], w)
	}
	writeAtClose(t, m.Path("f"), ws) // deltas on 16 chunks: a fold of 16 encodings
	waitReleased(t, fs)
	for i := range maxIdle {
		if err := os.WriteFile(m.Path(fmt.Sprintf("g%d", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	waitReleased(t, fs) // f is let go of: its fold runs
	w := bytes.Repeat([]byte("#"), 4096)
	writeAtClose(t, m.Path("f"), map[int64][]byte{5*cs + 100: w})
	copy(want[5*cs+100:], w)
	m.Unmount()
	layer.CloseStack(fs)
	fresh := newStackAt(t, dir, "zstd", Options{FoldDelay: -1})
	if b, err := layer.ReadFile(ctx, fresh, "f"); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("after a remount: %v, first difference %d", err, firstDiff(b, want))
	}
	if rep, err := fresh.Check(ctx, "f", CheckOnly); err != nil || !rep.OK() {
		t.Fatalf("fsck: %s, %v", rep.String(), err)
	}
}
