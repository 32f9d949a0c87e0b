package readonly_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"

	"cairnfs.dev/cairn/docs/examples/readonly"
)

func TestInProcess(t *testing.T) {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fs, err := readonly.New(l, []string{"frozen/"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := fs.Mkdir(ctx, "frozen", 0o755); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("mkdir frozen: %v", err)
	}
	if err := layer.WriteFile(ctx, fs, "notes", []byte("hi"), 0o644); err != nil {
		t.Fatalf("writing outside the patterns: %v", err)
	}
}

func TestThroughMount(t *testing.T) {
	lower := t.TempDir()
	os.WriteFile(filepath.Join(lower, "f"), []byte("data"), 0o644)
	l, _ := local.New(lower)
	fs, _ := readonly.New(l, nil)
	m := mounttest.Mount(t, fs)
	if b, err := os.ReadFile(m.Path("f")); err != nil || string(b) != "data" {
		t.Fatalf("read: %q, %v", b, err)
	}
	for name, change := range map[string]func() error{
		"write":  func() error { return os.WriteFile(m.Path("f"), []byte("x"), 0o644) },
		"create": func() error { return os.WriteFile(m.Path("g"), []byte("x"), 0o644) },
		"remove": func() error { return os.Remove(m.Path("f")) },
		"chmod":  func() error { return os.Chmod(m.Path("f"), 0o600) },
		"rename": func() error { return os.Rename(m.Path("f"), m.Path("h")) },
	} {
		if err := change(); !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s: %v, want EROFS", name, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(lower, "f")); string(b) != "data" {
		t.Fatalf("the lower file changed: %q", b)
	}
	if ents, _ := os.ReadDir(lower); len(ents) != 1 {
		t.Fatalf("the lower directory changed: %v", ents)
	}
}

// TestTutorialShowsThisCode: every Go block of docs/write-a-layer.md marked
// as coming from this package is in it, verbatim.
func TestTutorialShowsThisCode(t *testing.T) {
	doc, err := os.ReadFile("../../write-a-layer.md")
	if err != nil {
		t.Fatal(err)
	}
	src := map[string][]byte{}
	for _, f := range []string{"readonly.go", "readonly_test.go"} {
		src[f], _ = os.ReadFile(f)
	}
	blocks := 0
	for _, part := range strings.Split(string(doc), "<!-- from ")[1:] {
		file, rest, _ := strings.Cut(part, " -->")
		_, code, ok := strings.Cut(rest, "```go\n")
		code, _, ok2 := strings.Cut(code, "```")
		if !ok || !ok2 || src[file] == nil {
			t.Fatalf("a block marked as from %q is not a go block of a file of this package", file)
		}
		if !bytes.Contains(src[file], []byte(code)) {
			t.Errorf("the tutorial's block from %s is not in it:\n%s", file, code)
		}
		blocks++
	}
	if blocks < 4 {
		t.Fatalf("only %d blocks checked", blocks)
	}
}
