package codec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// isCodecFile reports whether the lower file at p starts with the header
// magic.
func isCodecFile(t *testing.T, p string) bool {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return len(b) > 0 && !isPlainBytes(b[:min(len(b), plainProbe)])
}

func readBack(t *testing.T, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: read %d bytes, want %d (equal prefix: %v)", p, len(got), len(want), bytes.HasPrefix(want, got))
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Size() != int64(len(want)) {
		t.Fatalf("%s: stat: %v, size %d, want %d", p, err, fi.Size(), len(want))
	}
}

// TestPlainFiles: a codec layer over a directory of existing files serves
// them as they are (size and bytes), keeps an appended one plain, writes a
// rewritten (O_TRUNC, truncate to 0) or empty one in its format, and still
// refuses (EIO) a file of its own whose data is damaged.
func TestPlainFiles(t *testing.T) {
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, 2))
			lower := t.TempDir()
			files := map[string][]byte{
				"text":       text(r, 300<<10),
				"small":      []byte("hello"),
				"C":          []byte("Cx"), // starts like the magic, is not it
				"dir/binary": randBytes(r, 70<<10),
				"rewrite":    text(r, 10<<10),
				"trunc":      text(r, 10<<10),
				"held":       []byte("old content"),
			}
			os.Mkdir(filepath.Join(lower, "dir"), 0o755)
			for p, b := range files {
				if err := os.WriteFile(filepath.Join(lower, p), b, 0o640); err != nil {
					t.Fatal(err)
				}
			}
			os.WriteFile(filepath.Join(lower, "empty"), nil, 0o644)
			// A file of the engine's, then damaged in its first record's
			// payload (the magic numbers stay).
			{
				fs := newStackAt(t, lower, name, Options{})
				m := mounttest.Mount(t, fs)
				if err := os.WriteFile(filepath.Join(m.Dir, "enc"), text(r, 20<<10), 0o644); err != nil {
					t.Fatal(err)
				}
				m.Unmount()
				layer.CloseStack(fs)
				b, _ := os.ReadFile(filepath.Join(lower, "enc"))
				b[headerSize+recHdrSize+3] ^= 0x55
				os.WriteFile(filepath.Join(lower, "enc"), b, 0o644)
			}
			m := mounttest.Mount(t, newStackAt(t, lower, name, Options{}))
			at := func(p string) string { return filepath.Join(m.Dir, p) }
			for p, b := range files {
				readBack(t, at(p), b)
			}
			readBack(t, at("empty"), nil)
			if _, err := os.ReadFile(at("enc")); !errors.Is(err, syscall.EIO) {
				t.Fatalf("damaged file of the engine: %v, want EIO", err)
			}

			// Appended: stays plain, every byte there.
			f, err := os.OpenFile(at("text"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write([]byte("appended\n"))
			f.Close()
			want := append(files["text"], "appended\n"...)
			readBack(t, at("text"), want)
			if lb, _ := os.ReadFile(filepath.Join(lower, "text")); !bytes.Equal(lb, want) {
				t.Fatal("appended plain file: the lower file is not the plain bytes")
			}
			// Rewritten (O_TRUNC) and truncated to 0: the engine's now.
			if err := os.WriteFile(at("rewrite"), []byte("new bytes"), 0o644); err != nil {
				t.Fatal(err)
			}
			readBack(t, at("rewrite"), []byte("new bytes"))
			if !isCodecFile(t, filepath.Join(lower, "rewrite")) {
				t.Fatal("a rewritten plain file is not in the codec's format")
			}
			if err := os.Truncate(at("trunc"), 0); err != nil {
				t.Fatal(err)
			}
			f, _ = os.OpenFile(at("trunc"), os.O_WRONLY|os.O_APPEND, 0)
			f.Write([]byte("after truncation"))
			f.Close()
			readBack(t, at("trunc"), []byte("after truncation"))
			if !isCodecFile(t, filepath.Join(lower, "trunc")) {
				t.Fatal("a plain file truncated to 0 is not in the codec's format")
			}
			// Truncated to another size: stays plain.
			if err := os.Truncate(at("dir/binary"), 1000); err != nil {
				t.Fatal(err)
			}
			readBack(t, at("dir/binary"), files["dir/binary"][:1000])
			if isCodecFile(t, filepath.Join(lower, "dir/binary")) {
				t.Fatal("a plain file truncated to 1000 bytes changed format")
			}
			// An empty file is the engine's.
			os.WriteFile(at("empty"), []byte("now encoded"), 0o644)
			readBack(t, at("empty"), []byte("now encoded"))
			if !isCodecFile(t, filepath.Join(lower, "empty")) {
				t.Fatal("a written empty file is not in the codec's format")
			}
			// Rewritten while another descriptor has it open: stays plain,
			// so that the open one never sees encoded bytes.
			h, err := os.Open(at("held"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(at("held"), []byte("rewritten while open"), 0o644); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 100)
			n, _ := h.ReadAt(buf, 0)
			h.Close()
			if string(buf[:n]) != "rewritten while open" {
				t.Fatalf("the open descriptor reads %q", buf[:n])
			}
			if isCodecFile(t, filepath.Join(lower, "held")) {
				t.Fatal("a file rewritten while open changed format under the open descriptor")
			}
			readBack(t, at("held"), []byte("rewritten while open"))
			// The files of a conversion are hidden.
			os.WriteFile(filepath.Join(lower, ConvertPrefix+"x"), []byte("tmp"), 0o600)
			if _, err := os.Stat(at(ConvertPrefix + "x")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a conversion's file is visible: %v", err)
			}
			ents, _ := os.ReadDir(m.Dir)
			for _, e := range ents {
				if e.Name() == ConvertPrefix+"x" {
					t.Fatal("a conversion's file is listed")
				}
			}
		})
	}
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestPlainConcurrent: readers, rewriters and truncations of plain files at
// once never see bytes that were not a whole version of the file (encoded
// bytes served raw, or raw bytes written into an encoded file), and the
// last version written is what the file holds after.
func TestPlainConcurrent(t *testing.T) {
	lower := t.TempDir()
	version := func(f, v int) []byte {
		return bytes.Repeat([]byte(fmt.Sprintf("file %d version %d\n", f, v)), 2000+v*37)
	}
	const nfiles = 4
	for f := 0; f < nfiles; f++ {
		os.WriteFile(filepath.Join(lower, fmt.Sprint(f)), version(f, 0), 0o644)
	}
	fs := newStackAt(t, lower, "lz4", Options{})
	m := mounttest.Mount(t, fs)
	var wg sync.WaitGroup
	var last [nfiles]atomic.Int64
	stop := make(chan struct{})
	for f := 0; f < nfiles; f++ {
		p := filepath.Join(m.Dir, fmt.Sprint(f))
		// One writer per file: each version whole, through O_TRUNC.
		wg.Go(func() {
			for v := 1; v <= 30; v++ {
				if err := os.WriteFile(p, version(f, v), 0o644); err != nil {
					t.Errorf("write %s: %v", p, err)
					return
				}
				last[f].Store(int64(v))
			}
		})
		for range 2 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					b, err := os.ReadFile(p)
					if err != nil {
						t.Errorf("read %s: %v", p, err)
						return
					}
					// Through FUSE a reader racing a rewrite may see a
					// mix of versions, or zeros past a size it had cached
					// (as through a codec file from the start), but never
					// the format's bytes served raw.
					if bytes.Contains(b, slotMagic[:]) || bytes.Contains(b, recMagic[:]) {
						t.Errorf("read %s: encoded bytes served raw", p)
						return
					}
				}
			})
		}
	}
	go func() {
		for f := 0; f < nfiles; f++ {
			for last[f].Load() < 30 {
				time.Sleep(10 * time.Millisecond)
			}
		}
		close(stop)
	}()
	wg.Wait()
	for f := 0; f < nfiles; f++ {
		readBack(t, filepath.Join(m.Dir, fmt.Sprint(f)), version(f, 30))
	}
	// And no raw bytes were written into an encoded file.
	m.Unmount()
	for f := 0; f < nfiles; f++ {
		rep, err := fs.Check(context.Background(), fmt.Sprint(f), CheckOnly)
		if err != nil || !rep.OK() {
			t.Errorf("file %d after the run: %v, %s", f, err, rep.String())
		}
	}
}

// TestPlainModel runs random operations on files that start plain, through
// descriptors opened read-only, read-write and for appending, kept open
// across operations: writes in place, appends, reads, truncations to any
// size (to 0 the file becomes the layer's if no read-only descriptor has
// it open, and the read-write ones change over with it), checking every
// read against a model, then the lower with a fresh stack and fsck.
func TestPlainModel(t *testing.T) {
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			r := rand.New(rand.NewPCG(seed, 1))
			lower := t.TempDir()
			const nfiles = 3
			model := make([][]byte, nfiles)
			for i := range model {
				model[i] = randBytes(r, r.IntN(200<<10)+1)
				os.WriteFile(filepath.Join(lower, fmt.Sprint(i)), model[i], 0o644)
			}
			m := mounttest.Mount(t, newStackAt(t, lower, name, Options{ChunkSize: 16 << 10, FastTails: true}))
			type handle struct {
				f    *os.File
				mode int
			}
			open := make([][]handle, nfiles)
			defer func() {
				for _, hs := range open {
					for _, h := range hs {
						h.f.Close()
					}
				}
			}()
			for op := 0; op < 1500; op++ {
				i := r.IntN(nfiles)
				p := filepath.Join(m.Dir, fmt.Sprint(i))
				if len(open[i]) == 0 || r.IntN(8) == 0 {
					if len(open[i]) >= 2 {
						open[i][0].f.Close()
						open[i] = open[i][1:]
						continue
					}
					mode := []int{os.O_RDONLY, os.O_RDWR, os.O_RDWR | os.O_APPEND}[r.IntN(3)]
					f, err := os.OpenFile(p, mode, 0)
					if err != nil {
						t.Fatalf("op %d: open %d: %v", op, i, err)
					}
					open[i] = append(open[i], handle{f, mode})
					continue
				}
				h := open[i][r.IntN(len(open[i]))]
				switch k := r.IntN(10); {
				case k < 4 && h.mode != os.O_RDONLY:
					b := randBytes(r, r.IntN(20<<10)+1)
					off := int64(r.IntN(len(model[i]) + 4096))
					if h.mode&os.O_APPEND != 0 {
						if _, err := h.f.Write(b); err != nil {
							t.Fatalf("op %d: append %d: %v", op, i, err)
						}
						off = int64(len(model[i]))
					} else if _, err := h.f.WriteAt(b, off); err != nil {
						t.Fatalf("op %d: write %d: %v", op, i, err)
					}
					if end := off + int64(len(b)); end > int64(len(model[i])) {
						model[i] = append(model[i], make([]byte, end-int64(len(model[i])))...)
					}
					copy(model[i][off:], b)
				case k < 5 && h.mode != os.O_RDONLY:
					n := 0
					if r.IntN(2) == 0 {
						n = r.IntN(len(model[i]) + 8192)
					}
					if err := h.f.Truncate(int64(n)); err != nil {
						t.Fatalf("op %d: truncate %d to %d: %v", op, i, n, err)
					}
					if n <= len(model[i]) {
						model[i] = model[i][:n]
					} else {
						model[i] = append(model[i], make([]byte, n-len(model[i]))...)
					}
				default:
					got, err := os.ReadFile(p)
					if err != nil || !bytes.Equal(got, model[i]) {
						t.Fatalf("op %d: file %d: %v, %d bytes, want %d", op, i, err, len(got), len(model[i]))
					}
				}
			}
			for i := range open {
				for _, h := range open[i] {
					h.f.Close()
				}
				open[i] = nil
				readBack(t, filepath.Join(m.Dir, fmt.Sprint(i)), model[i])
			}
			m.Unmount()
			encodedFiles := 0
			for i := range model {
				if len(model[i]) > 0 && isCodecFile(t, filepath.Join(lower, fmt.Sprint(i))) {
					encodedFiles++
				}
			}
			t.Logf("%d of %d files in the format at the end", encodedFiles, nfiles)
			fresh := newStackAt(t, lower, name, Options{})
			for i := range model {
				got, err := layer.ReadFile(context.Background(), fresh, fmt.Sprint(i))
				if err != nil || !bytes.Equal(got, model[i]) {
					t.Fatalf("a fresh stack reads file %d differently (%v)", i, err)
				}
				if rep, err := fresh.Check(context.Background(), fmt.Sprint(i), CheckOnly); err != nil || !rep.OK() {
					t.Fatalf("fsck of file %d: %v %s", i, err, rep.String())
				}
			}
		})
	}
}
