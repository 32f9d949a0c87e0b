// Package dfstest holds the suites that run cairn stacks over a distributed
// file system's mounts, whatever the file system: internal/glustertest runs
// them over GlusterFS and internal/cephtest over CephFS (docs/distributed.md).
// The callers give the directories: a new one on the file system per stack,
// or two client mounts of one file system, as two machines would have.
package dfstest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
	"cairnfs.dev/cairn/layers/shard"
	"cairnfs.dev/cairn/layers/union"
)

func localFS(t testing.TB, d string) layer.FS {
	t.Helper()
	l, err := local.New(d)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The model runs are short (every operation is several network round trips
// of the file system's client, and the layers' own suites run the long ones
// on ext4): what they look for is a lower that answers otherwise than ext4
// does, not rare interleavings.
const (
	dataOps = 1500
	treeOps = 400
)

// Model runs the data model (fsx) and the namespace model (fsx tree,
// against an ext4 oracle) on null, crypt, zstd, union and shard stacks
// mounted in-process, each over a new directory that dir gives (on the
// distributed file system). tree holds the namespace model's settings that
// the file system needs (NoRenameFlags: a FUSE client without renameat2's
// flags); Dir and Ops are set here, and union's own on top.
func Model(t *testing.T, dir func(t *testing.T) string, tree fsx.TreeConfig) {
	stacks := []struct {
		name string
		make func(t *testing.T, dir string) layer.FS
		tree bool // run the namespace model too
	}{
		{"null", func(t *testing.T, dir string) layer.FS { return null.New(localFS(t, dir)) }, true},
		{"crypt", func(t *testing.T, dir string) layer.FS {
			ctx, pass := context.Background(), []byte("distributed")
			lo := localFS(t, dir)
			if _, err := crypt.Init(ctx, lo, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
				t.Fatal(err)
			}
			c, err := crypt.Unlock(ctx, lo, pass, false, crypt.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, true},
		{"zstd", func(t *testing.T, dir string) layer.FS {
			z, err := codec.New(localFS(t, dir), "zstd", codec.Options{ChunkSize: 4 << 10, FastTails: true, Level: 1})
			if err != nil {
				t.Fatal(err)
			}
			return z
		}, false},
		{"union", func(t *testing.T, dir string) layer.FS {
			up, lo := filepath.Join(dir, "upper"), filepath.Join(dir, "lower")
			for _, d := range []string{up, lo} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			u, err := union.New([]fanout.Branch{{FS: localFS(t, up), Mode: fanout.RW}, {FS: localFS(t, lo), Mode: fanout.RO}}, union.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return u
		}, true},
		{"shard", func(t *testing.T, dir string) layer.FS {
			s, err := shard.New(localFS(t, dir), shard.Config{Default: shard.Layout{Scheme: shard.Hash, Buckets: 4, Prefix: shard.DefaultPrefix}})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, true},
	}
	for _, s := range stacks {
		t.Run(s.name, func(t *testing.T) {
			fs := s.make(t, dir(t))
			t.Cleanup(func() { layer.CloseStack(fs) })
			m := mounttest.Mount(t, fs)
			if err := os.Mkdir(m.Path("data"), 0o755); err != nil {
				t.Fatal(err)
			}
			fsx.Run(t, fsx.Config{Dir: m.Path("data"), Ops: dataOps, Punch: true, MaxSize: 256 << 10, MaxLen: 32 << 10})
			if s.tree {
				c := tree
				c.Dir, c.Ops = m.Dir, treeOps
				if s.name == "union" {
					c.NoDirNlink, c.RenameEXDEV = true, true
				}
				fsx.RunTree(t, c)
			}
		})
	}
}
