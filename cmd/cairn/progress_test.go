package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestProgressLines: not on a terminal, progress writes a plain line at
// most every tickLine (none for work shorter than that), with the counts,
// the bytes and the rate.
func TestProgressLines(t *testing.T) {
	var b bytes.Buffer
	p := newProgress(&b, "convert", "files", 10, 10<<20)
	if p.tty {
		t.Fatal("a buffer is no terminal")
	}
	p.update(1, 1<<20, "a")
	p.update(2, 2<<20, "b")
	if b.Len() != 0 {
		t.Fatalf("a line before %v: %q", tickLine, b.String())
	}
	// As if the work had run for tickLine.
	p.start = p.start.Add(-tickLine)
	p.last = p.last.Add(-tickLine)
	p.update(3, 5<<20, "dir/c")
	p.update(4, 6<<20, "d")
	// About 1 MiB/s (the clock ran on a little).
	if s := b.String(); !strings.HasPrefix(s, "cairn convert: 3/10 files, 5.0 MiB/10.0 MiB, 1") || !strings.HasSuffix(s, "iB/s: dir/c\n") || strings.Count(s, "\n") != 1 {
		t.Fatalf("got %q", s)
	}
	b.Reset()
	q := newProgress(&b, "fsck", "files", 100, 0)
	q.start = q.start.Add(-10 * time.Second)
	q.last = q.start
	q.update(50, 0, "x")
	if want := "cairn fsck: 50/100 files, 5/s: x\n"; b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
	q.clear() // nothing drawn: nothing to clear
	if b.String() != "cairn fsck: 50/100 files, 5/s: x\n" {
		t.Fatalf("clear wrote: %q", b.String())
	}
}
