package layer_test

import (
	"context"
	"fmt"
	"os"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

// A stack used in-process, with no FUSE mount: a null layer over a
// directory.
func Example() {
	dir, _ := os.MkdirTemp("", "cairn-example-")
	defer os.RemoveAll(dir)
	base, err := local.New(dir)
	if err != nil {
		panic(err)
	}
	fs := null.New(base)
	defer layer.CloseStack(fs)

	ctx := context.Background()
	layer.MkdirAll(ctx, fs, "docs", 0o755)
	layer.WriteFile(ctx, fs, "docs/hello.txt", []byte("hello, cairn\n"), 0o644)

	data, _ := layer.ReadFile(ctx, fs, "docs/hello.txt")
	fmt.Print(string(data))
	a, _ := fs.Getattr(ctx, "docs/hello.txt")
	fmt.Println(a.Size, "bytes")
	ents, _ := fs.ReadDir(ctx, "docs", false)
	for _, e := range ents {
		fmt.Println(e.Name)
	}
	// Output:
	// hello, cairn
	// 13 bytes
	// hello.txt
}
