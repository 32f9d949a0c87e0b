package codec

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// writeSample writes a file of several chunks with some history (a write in
// the middle, appends) and returns its content.
func writeSample(t *testing.T, fs *FS, name string, seed uint64) []byte {
	t.Helper()
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 7))
	want := text(r, 40000)
	if err := layer.WriteFile(ctx, fs, name, want, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := fs.Open(ctx, name, unix.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	p := text(r, 3000)
	f.WriteAt(ctx, p, 9000)
	copy(want[9000:], p)
	for i := 0; i < 5; i++ {
		q := text(r, 20)
		f.WriteAt(ctx, q, int64(len(want)))
		want = append(want, q...)
		f.Flush(ctx)
	}
	f.Release(ctx)
	return want
}

// liveOps loads a file's index.
func liveOps(t *testing.T, fs *FS, name string) map[int64][]op {
	t.Helper()
	ctx := context.Background()
	st, err := fs.e.openState(ctx, name, unix.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.e.put(ctx, st)
	st.mu.Lock()
	defer st.mu.Unlock()
	out := map[int64][]op{}
	for c, ops := range st.chunks {
		out[c] = append([]op(nil), ops...)
	}
	return out
}

func TestRecoverLostIndex(t *testing.T) {
	ctx := context.Background()
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			for _, damage := range []string{"header", "checkpoint", "both", "torn-tail"} {
				lower, fs := newStack(t, name, Options{ChunkSize: 4096, FastTails: true})
				want := writeSample(t, fs, "f", 1)
				path := filepath.Join(lower, "f")
				raw, _ := os.ReadFile(path)
				var sl slot
				if s, ok := bestSlot(raw); ok {
					sl = s
				}
				switch damage {
				case "header":
					clear(raw[:headerSize])
				case "checkpoint":
					if sl.ckptOff == 0 {
						t.Fatal("no checkpoint written")
					}
					raw[sl.ckptOff+recHdrSize+3] ^= 0x10
				case "both":
					clear(raw[:headerSize])
					raw[sl.ckptOff+recHdrSize+3] ^= 0x10
				case "torn-tail":
					// Half a record at the end, as a crash in a write leaves.
					rec := appendRecord(nil, rec{typ: recDelta, shift: sl.shift, salt: sl.salt, gen: sl.gen + 1, arg: 0, decLen: 100}, make([]byte, 100))
					raw = append(raw, rec[:70]...)
				}
				os.WriteFile(path, raw, 0o644)
				fresh := newStackAt(t, lower, name, Options{})
				rep, err := fresh.Check(ctx, "f", CheckOnly)
				if err != nil {
					t.Fatal(err)
				}
				if damage != "torn-tail" && len(rep.Problems) == 0 {
					t.Fatalf("%s: damage not reported: %s", damage, rep.String())
				}
				if len(rep.Damaged) > 0 {
					t.Fatalf("%s: chunks reported damaged: %s", damage, rep.String())
				}
				got, err := layer.ReadFile(ctx, fresh, "f")
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("%s: rebuilt file differs (%v), first diff %d", damage, err, firstDiff(got, want))
				}
				rep, err = fresh.Check(ctx, "f", Repair)
				if err != nil {
					t.Fatal(err)
				}
				rep, err = fresh.Check(ctx, "f", CheckOnly)
				if err != nil || !rep.OK() || rep.Replayed != 0 {
					t.Fatalf("%s: after repair: %s, %v", damage, rep.String(), err)
				}
				if a, _ := fresh.Getattr(ctx, "f"); a.Size != uint64(len(want)) {
					t.Fatalf("%s: size after repair %d", damage, a.Size)
				}
			}
		})
	}
}

// TestBitFlips flips one bit in each live record in turn: reading the
// chunk must fail with EIO and the others must read right.
func TestBitFlips(t *testing.T) {
	ctx := context.Background()
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			lower, fs := newStack(t, name, Options{ChunkSize: 4096, FastTails: true})
			want := writeSample(t, fs, "f", 2)
			ops := liveOps(t, fs, "f")
			path := filepath.Join(lower, "f")
			orig, _ := os.ReadFile(path)
			r := rand.New(rand.NewPCG(9, 9))
			for c, cops := range ops {
				for _, o := range cops {
					if o.kind == opClip {
						continue
					}
					raw := bytes.Clone(orig)
					at := o.off + r.Int64N(int64(o.rlen))
					raw[at] ^= 1 << r.IntN(8)
					os.WriteFile(path, raw, 0o644)
					fresh := newStackAt(t, lower, name, Options{})
					f, err := fresh.Open(ctx, "f", unix.O_RDONLY)
					if err != nil {
						t.Fatal(err)
					}
					for cc := int64(0); cc*4096 < int64(len(want)); cc++ {
						buf := make([]byte, 4096)
						n, err := f.ReadAt(ctx, buf, cc*4096)
						end := min(int64(len(want)), (cc+1)*4096)
						if cc == c {
							var ce *CorruptError
							if !errors.As(err, &ce) || layer.Errno(err) != unix.EIO {
								t.Fatalf("chunk %d, bit flipped at %d: read gave %d bytes, %v; want EIO", c, at, n, err)
							}
							continue
						}
						if !bytes.Equal(buf[:n], want[cc*4096:end]) {
							t.Fatalf("chunk %d reads wrong after a flip in chunk %d", cc, c)
						}
					}
					f.Release(ctx)
					rep, err := fresh.Check(ctx, "f", CheckOnly)
					if err != nil || len(rep.Damaged) != 1 || rep.Damaged[0] != c {
						t.Fatalf("fsck after a flip in chunk %d: %s, %v", c, rep.String(), err)
					}
				}
			}
			os.WriteFile(path, orig, 0o644)
		})
	}
}

// TestKnownAnswer pins the on-disk format: a change that alters these bytes
// is a format change (bump the version, keep reading version 1).
func TestKnownAnswer(t *testing.T) {
	ctx := context.Background()
	lower, fs := newStack(t, "copy", Options{ChunkSize: 4096, FastTails: true, salt: 0x01020304})
	f, _, err := fs.Create(ctx, "f", unix.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(ctx, []byte("hello, "), 0)
	f.Flush(ctx) // a fast tail: a delta record
	f.WriteAt(ctx, []byte("world\n"), 7)
	f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 12})
	f.Release(ctx)
	raw, _ := os.ReadFile(filepath.Join(lower, "f"))
	got := hex.EncodeToString(raw)
	want := knownAnswer
	if got != want {
		t.Fatalf("the on-disk bytes changed:\n got %s\nwant %s", got, want)
	}
	for _, known := range []string{knownAnswer, knownAnswerNoFlag} {
		raw, _ := hex.DecodeString(known)
		os.WriteFile(filepath.Join(lower, "f"), raw, 0o644)
		b, err := layer.ReadFile(ctx, newStackAt(t, lower, "gzip", Options{Level: 6}), "f")
		if err != nil || string(b) != "hello, world" {
			t.Fatalf("known file reads %q, %v", b, err)
		}
	}
}

// The file TestKnownAnswer writes: header slot 0 (seq 2: size 12, log end
// 284, flag slotWhole), slot 1 (seq 1, from creation: the empty log), a
// delta record "hello, " (gen 1), a size record 12 (gen 2: the
// truncation), a delta record "world" at 7 (gen 3), no checkpoint (too few
// records).
const knownAnswer = "435a46010100010c040302010100000002000000000000000c000000000000001c0100000000000000000000000000000300000000000000000000006c02094f" +
	"435a46010100010c04030201010000000100000000000000000000000000000080000000000000000000000000000000000000000000000000000000e1506e1d" +
	"435a52010200000c0403020107000000010000000000000000000000000000000700000000000000899fdc7a0ab20b59" + "68656c6c6f2c20" +
	"435a52010300000c040302010000000002000000000000000c00000000000000000000000000000000000000a904b01f" +
	"435a52010200000c04030201050000000300000000000000000000000000000005000000070000004e81aa3119761b8c" + "776f726c64"

// knownAnswerNoFlag is the same file as written before the header had flags
// (slotWhole): it must read the same.
var knownAnswerNoFlag = "435a46010100010c040302010000000002000000000000000c000000000000001c010000000000000000000000000000030000000000000000000000681f2053" +
	"435a46010100010c04030201000000000100000000000000000000000000000080000000000000000000000000000000000000000000000000000000e54d4701" +
	knownAnswer[256:]

// lastRecord returns the offset of the last record of a file's log.
func lastRecord(t *testing.T, raw []byte) int64 {
	t.Helper()
	sl, ok := bestSlot(raw)
	if !ok {
		t.Fatal("no header")
	}
	last := int64(-1)
	for p := int64(headerSize); p+recHdrSize <= int64(len(raw)); {
		r, err := parseRec(raw[p:], sl.salt, sl.shift)
		if err != nil {
			t.Fatalf("record at %d: %v", p, err)
		}
		last = p
		p += recHdrSize + int64(r.encLen)
	}
	return last
}

// TestLostNewestRecord: a record after the checkpoint whose header is
// destroyed cannot be placed; the file is refused (EIO) rather than served
// as it was before that record, fsck reports it, --repair refuses to drop
// anything and changes nothing, and --repair --force keeps a copy in
// lost+found, drops what the lost record may have changed (never serving
// older bytes) and says how many bytes.
func TestLostNewestRecord(t *testing.T) {
	ctx := context.Background()
	lower, fs := newStack(t, "gzip", Options{ChunkSize: 4096, FastTails: true})
	want := writeSample(t, fs, "f", 4)
	fs.Close()
	path := filepath.Join(lower, "f")
	raw, _ := os.ReadFile(path)
	at := lastRecord(t, raw)
	for i := at; i < at+recHdrSize; i += 8 {
		raw[i] ^= 0xff // several bits: beyond repair
	}
	os.WriteFile(path, raw, 0o644)
	fresh := newStackAt(t, lower, "gzip", Options{})
	if _, err := fresh.Open(ctx, "f", unix.O_RDONLY); err == nil || layer.Errno(err) != unix.EIO {
		t.Fatalf("open of a file with a lost record: %v, want EIO", err)
	}
	rep, err := fresh.Check(ctx, "f", CheckOnly)
	if err != nil || rep.OK() || !strings.Contains(rep.String(), "missing") {
		t.Fatalf("fsck: %s, %v", rep.String(), err)
	}
	rep, err = fresh.Check(ctx, "f", Repair)
	if err != nil || rep.OK() || rep.Refused == "" || rep.Repaired || rep.Dropped != 0 {
		t.Fatalf("fsck --repair of a file with a lost record: %s, %v; want refused", rep.String(), err)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, raw) {
		t.Fatal("fsck --repair changed a file it refused to repair")
	}
	rep, err = fresh.Check(ctx, "f", RepairForce)
	if err != nil || !rep.Repaired || rep.Dropped == 0 || !strings.Contains(rep.String(), LostFound) {
		t.Fatalf("fsck --repair --force: %s, %v", rep.String(), err)
	}
	t.Logf("forced repair:\n%s", rep.String())
	kept, err := filepath.Glob(filepath.Join(lower, LostFound, "f.*"))
	if err != nil || len(kept) != 1 {
		t.Fatalf("lost+found holds %v (%v), want one copy of f", kept, err)
	}
	if b, _ := os.ReadFile(kept[0]); !bytes.Equal(b, raw) {
		t.Fatal("the copy in lost+found is not the file as it was")
	}
	again := newStackAt(t, lower, "gzip", Options{})
	got, err := layer.ReadFile(ctx, again, "f")
	if err != nil {
		t.Fatalf("after the forced repair: %v", err)
	}
	var zeros int64
	for i := range got {
		switch {
		case got[i] == 0:
			zeros++
		case i >= len(want) || got[i] != want[i]:
			t.Fatalf("after the forced repair byte %d is %q, want %q or zero", i, got[i], want[i])
		}
	}
	if zeros < rep.Dropped-4096 {
		t.Fatalf("%d bytes read as zeros, %d reported dropped", zeros, rep.Dropped)
	}
	if rep, err := again.Check(ctx, "f", CheckOnly); err != nil || !rep.OK() {
		t.Fatalf("fsck after repair: %s, %v", rep.String(), err)
	}
}

// TestRepairNeverResurrects: a truncation whose size record is destroyed
// (with the checkpoint after it, or with that checkpoint destroyed too):
// the file reads right or gives EIO, and no repair brings back the bytes
// the truncation removed.
func TestRepairNeverResurrects(t *testing.T) {
	ctx := context.Background()
	for _, name := range codecNames {
		for _, damage := range []string{"size", "size+checkpoint"} {
			t.Run(name+"/"+damage, func(t *testing.T) {
				lower, fs := newStack(t, name, Options{ChunkSize: 4096, FastTails: true})
				r := rand.New(rand.NewPCG(21, 22))
				old := bytes.ToUpper(text(r, 20000)) // removed later: upper case
				f, _, err := fs.Create(ctx, "f", unix.O_RDWR, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				f.WriteAt(ctx, old, 0)
				if err := f.Fsync(ctx, false); err != nil {
					t.Fatal(err)
				}
				if _, err := f.Setattr(ctx, &layer.SetAttr{Valid: layer.SetSize, Size: 100}); err != nil {
					t.Fatal(err)
				}
				want := append(bytes.Clone(old[:100]), text(r, 300)...)
				f.WriteAt(ctx, want[100:], 100)
				if err := f.Release(ctx); err != nil {
					t.Fatal(err)
				}
				fs.Close()
				path := filepath.Join(lower, "f")
				raw, _ := os.ReadFile(path)
				sl, _ := bestSlot(raw)
				// Destroy the size record's header, and the checkpoints after it.
				sized := false
				for p := int64(headerSize); p+recHdrSize <= int64(len(raw)); {
					rc, err := parseRec(raw[p:], sl.salt, sl.shift)
					if err != nil {
						t.Fatalf("record at %d: %v", p, err)
					}
					if rc.typ == recSize || (sized && rc.typ == recIndex && damage == "size+checkpoint") {
						sized = true
						for i := p; i < p+recHdrSize; i += 6 {
							raw[i] ^= 0xff
						}
					}
					p += recHdrSize + int64(rc.encLen)
				}
				if !sized {
					t.Fatal("no size record")
				}
				os.WriteFile(path, raw, 0o644)
				fresh := newStackAt(t, lower, name, Options{})
				got, err := layer.ReadFile(ctx, fresh, "f")
				if err != nil && layer.Errno(err) != unix.EIO || err == nil && !bytes.Equal(got, want) {
					t.Fatalf("read of a file whose truncation is lost: %d bytes, %v; want its bytes or EIO", len(got), err)
				}
				served := err == nil
				for _, mode := range []Mode{Repair, RepairForce} {
					rep, err := fresh.Check(ctx, "f", mode)
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("mode %d: %s", mode, rep.String())
					got, err := layer.ReadFile(ctx, newStackAt(t, lower, name, Options{}), "f")
					if mode == Repair && !served {
						if err == nil || rep.Refused == "" {
							t.Fatalf("--repair served the file (%v) or did not say it refused: %s", err, rep.String())
						}
						continue
					}
					if err != nil {
						t.Fatalf("after --repair: %v", err)
					}
					if len(got) > 100 && bytes.ContainsAny(got[100:], "ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
						t.Fatalf("after a repair, bytes removed by the truncation are back")
					}
					for i := range got {
						if got[i] != 0 && (i >= len(want) || got[i] != want[i]) {
							t.Fatalf("after a repair byte %d is %q, want %q or zero", i, got[i], want[i])
						}
					}
				}
			})
		}
	}
}

// TestTornTailThenAppend: after a crash left half a record at the end,
// the next writer cuts it before appending, so that a scan of the whole
// log (fsck, or a lost header) still finds every record.
func TestTornTailThenAppend(t *testing.T) {
	ctx := context.Background()
	lower, fs := newStack(t, "zstd", Options{ChunkSize: 4096, FastTails: true})
	want := writeSample(t, fs, "f", 5)
	fs.Close()
	path := filepath.Join(lower, "f")
	raw, _ := os.ReadFile(path)
	sl, _ := bestSlot(raw)
	torn := appendRecord(nil, rec{typ: recDelta, shift: sl.shift, salt: sl.salt, gen: sl.gen + 1, arg: 0, decLen: 100}, make([]byte, 100))
	os.WriteFile(path, append(raw, torn[:70]...), 0o644)
	w := newStackAt(t, lower, "zstd", Options{FastTails: true})
	f, err := w.Open(ctx, "f", unix.O_WRONLY|unix.O_APPEND)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		f.WriteAt(ctx, []byte("appended"), 0)
		f.Flush(ctx)
		want = append(want, "appended"...)
	}
	f.Release(ctx)
	w.Close()
	for _, lose := range []bool{false, true} {
		if lose {
			raw, _ := os.ReadFile(path)
			clear(raw[:headerSize])
			os.WriteFile(path, raw, 0o644)
		}
		fresh := newStackAt(t, lower, "zstd", Options{})
		got, err := layer.ReadFile(ctx, fresh, "f")
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("header lost %v: read %d bytes (%v), want %d", lose, len(got), err, len(want))
		}
		rep, err := fresh.Check(ctx, "f", CheckOnly)
		if err != nil || len(rep.Damaged) > 0 || (!lose && !rep.OK()) {
			t.Fatalf("header lost %v: fsck: %s, %v", lose, rep.String(), err)
		}
		fresh.Close()
	}
}

// TestHugeGeneration: a file whose records carry a huge generation (damage
// that checks, or a crafted file) is refused at once, not after counting
// every generation below it.
func TestHugeGeneration(t *testing.T) {
	ctx := context.Background()
	raw, _ := hex.DecodeString(knownAnswer)
	const huge = 1 << 60
	binary.LittleEndian.PutUint64(raw[48:], huge) // slot 0 (the newest): its generation
	binary.LittleEndian.PutUint32(raw[60:], crc(raw[:60]))
	last := int64(headerSize + 2*recHdrSize + 7) // the delta record "world"
	r, err := parseRec(raw[last:], 0, 0)
	if err != nil || r.gen != 3 {
		t.Fatalf("known answer: record at %d: %+v %v", last, r, err)
	}
	r.gen = huge
	r.marshal(raw[last:])
	lower, _ := newStack(t, "copy", Options{})
	os.WriteFile(filepath.Join(lower, "f"), raw, 0o644)
	done := make(chan error, 1)
	go func() {
		_, err := layer.ReadFile(ctx, newStackAt(t, lower, "copy", Options{Logger: quiet}), "f")
		done <- err
	}()
	select {
	case err := <-done:
		if layer.Errno(err) != unix.EIO || !strings.Contains(err.Error(), "missing") {
			t.Fatalf("read of a file with generations 1, 2 and 2^60: %v, want EIO (missing records)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("opening a file with a huge generation hangs")
	}
	rep, err := newStackAt(t, lower, "copy", Options{Logger: quiet}).Check(ctx, "f", CheckOnly)
	if err != nil || rep.OK() {
		t.Fatalf("fsck: %s, %v", rep.String(), err)
	}
}
