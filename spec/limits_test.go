package spec_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/spec"
)

// chain is an inline spec of n null layers over /tmp (n+1 layers deep).
func chain(n int) string { return strings.Repeat("null,", n-1) + "null:/tmp" }

// chainTOML is the same stack as a file: l0 over l1 ... over a local layer.
func chainTOML(n int) string {
	var b strings.Builder
	b.WriteString("mount = \"l0\"\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[layer.l%d]\ntype = \"null\"\nover = \"l%d\"\n", i, i+1)
	}
	fmt.Fprintf(&b, "[layer.l%d]\ntype = \"local\"\npath = \"/tmp\"\n", n)
	return b.String()
}

// TestParseLinear parses stacks of n and 4n layers and compares the work
// done, counted as allocations (a measure that does not depend on the
// machine's speed): linear parsing does about 4 times as much for 4 times
// the layers; the old naming of inline layers ("null-2", "null-3"...,
// trying every number from 2 for each layer) did about 16 times as much.
func TestParseLinear(t *testing.T) {
	for _, form := range []struct {
		name  string
		parse func(n int) func()
	}{
		{"inline", func(n int) func() {
			text := chain(n)
			return func() { spec.ParseInline(text) }
		}},
		{"toml", func(n int) func() {
			data := []byte(chainTOML(n))
			return func() { spec.Parse("x.toml", data) }
		}},
	} {
		const n = 1500
		small := testing.AllocsPerRun(1, form.parse(n))
		big := testing.AllocsPerRun(1, form.parse(4*n))
		ratio := big / small
		t.Logf("%s: %d layers: %.0f allocations, %d layers: %.0f (ratio %.2f)", form.name, n, small, 4*n, big, ratio)
		if ratio > 5 {
			t.Errorf("%s: 4 times the layers cost %.1f times the work: parsing is not linear", form.name, ratio)
		}
	}
}

// TestMaxDepth: a stack of MaxDepth layers is good; one deeper is refused at
// the first layer too deep, with its position, in both forms.
func TestMaxDepth(t *testing.T) {
	if _, err := spec.ParseInline(chain(spec.MaxDepth - 1)); err != nil {
		t.Fatalf("%d layers: %v", spec.MaxDepth, err)
	}
	_, err := spec.ParseInline(chain(spec.MaxDepth))
	// The 65th layer is the directory's, after 64 "null," or "null:".
	want := fmt.Sprintf("inline:1:%d: the stack is too deep: layer \"local\" is layer %d down", 5*spec.MaxDepth+1, spec.MaxDepth+1)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("%d layers: got %v, want %s...", spec.MaxDepth+1, err, want)
	}

	if _, err := spec.Parse("x.toml", []byte(chainTOML(spec.MaxDepth-1))); err != nil {
		t.Fatalf("%d layers: %v", spec.MaxDepth, err)
	}
	_, err = spec.Parse("x.toml", []byte(chainTOML(spec.MaxDepth)))
	// [layer.l64] is on line 2 + 3*64.
	want = fmt.Sprintf("x.toml:%d:8: the stack is too deep: layer \"l%d\" is layer %d down", 2+3*spec.MaxDepth, spec.MaxDepth, spec.MaxDepth+1)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("%d layers: got %v, want %s...", spec.MaxDepth+1, err, want)
	}
	// The line shown under the error is cut to its neighbourhood.
	_, err = spec.ParseInline(chain(10000))
	if d := spec.Detail(err); len(d) > 500 || !strings.Contains(d, "...null,null") {
		t.Fatalf("the detail of an error in a long line is %d bytes:\n%.1000s", len(d), d)
	}
}

// TestLoadRefuses: a FIFO is refused at once (not waited on) and so is a
// file over MaxFileSize.
func TestLoadRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "stack.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := spec.Load(fifo)
	if err == nil || !strings.Contains(err.Error(), "is a FIFO (named pipe), not a regular file") {
		t.Fatalf("Load(FIFO) = %v", err)
	}
	big := filepath.Join(dir, "big.toml")
	data := []byte(chainTOML(10))
	data = append(data, strings.Repeat("# padding\n", spec.MaxFileSize/10)...)
	if err := os.WriteFile(big, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = spec.Load(big)
	if err == nil || !strings.Contains(err.Error(), "a spec file may hold at most 1048576 bytes") {
		t.Fatalf("Load(%d bytes) = %v", len(data), err)
	}
	// Just under the limit is read.
	if err := os.WriteFile(big, data[:spec.MaxFileSize], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := spec.Load(big); err != nil {
		t.Fatalf("Load(%d bytes) = %v", spec.MaxFileSize, err)
	}
}
