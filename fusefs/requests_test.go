package fusefs_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

// delta returns the requests of each kind that fn made on m's server.
func delta(m *mounttest.Mounted, fn func()) map[string]uint64 {
	before := m.Server.RequestCounts()
	fn()
	after := m.Server.RequestCounts()
	d := map[string]uint64{}
	for k, n := range after {
		if n > before[k] {
			d[k] = n - before[k]
		}
	}
	return d
}

// TestNoFlushReadOnly: the close of a file opened read-only sends no
// FLUSH (FOPEN_NOFLUSH: its Flush does nothing, layer.CapNoFlush); the
// close of a file opened for writing still does (it may report a delayed
// write's error).
func TestNoFlushReadOnly(t *testing.T) {
	lower := t.TempDir()
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, null.New(l))
	os.WriteFile(m.Path("f"), []byte("data"), 0o644)
	d := delta(m, func() {
		for range 20 {
			if b, err := os.ReadFile(m.Path("f")); err != nil || string(b) != "data" {
				t.Fatalf("read %q, %v", b, err)
			}
		}
	})
	if d["FLUSH"] != 0 || d["OPEN"] != 20 {
		t.Errorf("20 read-only opens and closes: %v (want 20 OPEN, no FLUSH)", d)
	}
	d = delta(m, func() {
		for range 5 {
			f, err := os.OpenFile(m.Path("f"), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteString("more")
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
	if d["FLUSH"] != 5 {
		t.Errorf("5 opens for writing: %v (want 5 FLUSH)", d)
	}
}

// TestExclusiveLocal: a stack over a local directory is the only writer
// of it (layer.Exclusive): the kernel keeps names and attributes past the
// 1 s of a shared lower, so a stat after 1.5 s costs no request; with the
// local layer's shared option, it costs a LOOKUP or GETATTR again.
func TestExclusiveLocal(t *testing.T) {
	for _, shared := range []bool{false, true} {
		lower := t.TempDir()
		os.MkdirAll(filepath.Join(lower, "d"), 0o755)
		os.WriteFile(filepath.Join(lower, "d", "f"), []byte("x"), 0o644)
		l, err := local.New(lower)
		if err != nil {
			t.Fatal(err)
		}
		if shared {
			l.SetShared()
		}
		m := mounttest.Mount(t, null.New(l))
		if _, err := os.Stat(m.Path("d", "f")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		d := delta(m, func() {
			if _, err := os.Stat(m.Path("d", "f")); err != nil {
				t.Fatal(err)
			}
		})
		asked := d["LOOKUP"] + d["GETATTR"] + d["STATX"]
		if !shared && asked != 0 {
			t.Errorf("exclusive: a stat 1.5 s after the last made %v", d)
		}
		if shared && asked == 0 {
			t.Errorf("shared: a stat 1.5 s after the last made no request (%v): the kernel kept it past the 1 s timeout", d)
		}
	}
}
