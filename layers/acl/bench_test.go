package acl_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
	"cairnfs.dev/cairn/layers/snoop"
	"cairnfs.dev/cairn/pathmatch"
)

// BenchmarkLayers is the in-process cost of one operation through null,
// snoop (logging to a file) and acl with 20 rules that do not apply, without
// FUSE: what each layer adds to a request that costs tens of microseconds
// through the kernel.
func BenchmarkLayers(b *testing.B) {
	dir := b.TempDir()
	l, err := local.New(dir)
	if err != nil {
		b.Fatal(err)
	}
	layer.WriteFile(context.Background(), l, "f", []byte("x"), 0o644)
	var rules acl.Rules
	rules.Default = true
	for i := 0; i < 20; i++ {
		s, _ := pathmatch.NewSet([]string{fmt.Sprintf("secret-%d/", i), "*.key"}, nil)
		r := acl.Rule{Paths: s, Ops: acl.Read | acl.Write}
		if i%2 == 0 {
			r.Uids = []uint32{uint32(5000 + i)}
		}
		rules.List = append(rules.List, r)
	}
	sn, err := snoop.New(l, snoop.Options{Log: filepath.Join(b.TempDir(), "log"), Queue: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	defer sn.Close()
	for _, c := range []struct {
		name string
		fs   layer.FS
	}{{"null", null.New(l)}, {"snoop", sn}, {"acl20", acl.New(l, &rules, false, false)}} {
		ctx := layer.WithCaller(context.Background(), &layer.Caller{Uid: 1000, Gid: 1000, Pid: uint32(unix.Getpid())})
		b.Run(c.name+"/getattr", func(b *testing.B) {
			for b.Loop() {
				c.fs.Getattr(ctx, "f")
			}
		})
		b.Run(c.name+"/open+release", func(b *testing.B) {
			for b.Loop() {
				f, err := c.fs.Open(ctx, "f", unix.O_RDONLY)
				if err != nil {
					b.Fatal(err)
				}
				f.Release(ctx)
			}
		})
	}
}
