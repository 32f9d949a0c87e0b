package local

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
)

// A directory of 10^5 entries (10^6 with CAIRN_LONG=1) streams with memory
// bounded by one batch: every name once, and the heap does not grow with
// the directory. Open streams hold no descriptor between batches.
func TestDirStreamLarge(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("reopening by handle needs CAP_DAC_READ_SEARCH; CI runs as root")
		}
		t.Skip("reopening by handle needs CAP_DAC_READ_SEARCH")
	}
	n := 100_000
	if os.Getenv("CAIRN_LONG") == "1" {
		n = 1_000_000
	}
	root := t.TempDir()
	for i := 0; i < n; i++ {
		fd, err := unix.Open(fmt.Sprintf("%s/entry-%07d", root, i), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
	}
	fs, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	ctx := context.Background()
	before := openFds(t)
	// Streams left open hold no descriptor.
	var open []layer.Dir
	for i := 0; i < 200; i++ {
		d, err := fs.OpenDir(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := d.Next(ctx, false); err != nil {
			t.Fatal(err)
		}
		open = append(open, d)
	}
	if held := openFds(t) - before; held > 1 {
		t.Errorf("200 open directory streams hold %d descriptors", held)
	}
	for _, d := range open {
		d.Close()
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	d, err := fs.OpenDir(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	seen := make([]bool, n)
	count := 0
	var peak uint64
	for {
		e, _, err := d.Next(ctx, true)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var i int
		if _, err := fmt.Sscanf(e.Name, "entry-%07d", &i); err != nil || seen[i] || e.Attr == nil {
			t.Fatalf("entry %q (attr %v): unexpected, or listed twice", e.Name, e.Attr != nil)
		}
		seen[i] = true
		count++
		if count%10000 == 0 {
			runtime.ReadMemStats(&m1)
			peak = max(peak, m1.HeapAlloc)
		}
	}
	if count != n {
		t.Fatalf("%d entries listed, want %d", count, n)
	}
	// The seen table is n bytes; the stream itself must stay near one
	// batch (32 KiB of names, their attributes): allow 8 MiB.
	if grow := int64(peak) - int64(m0.HeapAlloc); grow > 8<<20 {
		t.Errorf("the heap grew by %d bytes while listing %d entries", grow, n)
	}
	t.Logf("%d entries; heap %d -> peak %d bytes", n, m0.HeapAlloc, peak)
}
