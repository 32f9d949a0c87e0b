//go:build linux

package conformance_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/conformance"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layer/fanout"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/chains"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/mux"
	"cairnfs.dev/cairn/layers/null"
	"cairnfs.dev/cairn/layers/pack"
	"cairnfs.dev/cairn/layers/replica"
	"cairnfs.dev/cairn/layers/shard"
	"cairnfs.dev/cairn/layers/snoop"
	"cairnfs.dev/cairn/layers/union"
	"cairnfs.dev/cairn/pathmatch"
)

// stacks is the table: every layer type, and the pairs that matter. A new
// layer adds one line.
var stacks = []conformance.Stack{
	{Name: "null", Build: func(t testing.TB, d string) layer.FS { return null.New(lower(t, d)) }, Plain: true},
	{Name: "snoop", Build: func(t testing.TB, d string) layer.FS { return snoopOver(t, lower(t, d)) }, Plain: true},
	{Name: "acl", Build: func(t testing.TB, d string) layer.FS { return aclOver(lower(t, d)) }, Plain: true},
	{Name: "crypt", Build: func(t testing.TB, d string) layer.FS { return cryptOver(t, lower(t, d)) }, Limits: cryptLimits},
	{Name: "zstd", Build: codecOver("zstd"), Limits: holes("codec")},
	{Name: "gzip", Build: codecOver("gzip"), Limits: holes("codec")},
	{Name: "lz4", Build: codecOver("lz4"), Limits: holes("codec")},
	{Name: "copy", Build: codecOver("copy"), Limits: holes("codec")},
	{Name: "uuencode", Build: codecOver("uuencode"), Limits: holes("codec")},
	{Name: "mux", Build: muxTmpfsDisk, Dirs: []string{"tmp", "disk"}, Limits: onTmpfs},
	{Name: "null-tmpfs-inside", Setup: tmpfsInside, Build: func(t testing.TB, d string) layer.FS { return null.New(lower(t, d)) }, Dirs: []string{"", "sub"}, Limits: onTmpfs},
	{Name: "snoop-crypt", Build: func(t testing.TB, d string) layer.FS { return snoopOver(t, cryptOver(t, lower(t, d))) }, Limits: cryptLimits},
	{Name: "acl-zstd", Build: func(t testing.TB, d string) layer.FS { return aclOver(codecOver("zstd")(t, d)) }, Limits: holes("codec")},
	{Name: "chain-zstd-crypt", Build: chainOver, Limits: holes("codec and crypt")},
	{Name: "chains", Build: chainsOver(""), Plain: true},
	{Name: "chains-zstd-crypt", Build: chainsOver("zstd,crypt"), Limits: chainsLimits},
	{Name: "replica", Build: replicaOf},
	{Name: "union", Build: unionOver, Limits: map[conformance.Limit]string{conformance.NoWhiteout: "a whiteout is the union's own (overlayfs refuses it too)"}},
	{Name: "shard", Build: shardOver},
	{Name: "shard-growing", Build: shardGrowing},
	{Name: "pack", Build: packOver(nil)},
	{Name: "zstd-pack", Build: packOver(func(l layer.FS) layer.FS {
		c, err := codec.New(l, "zstd", codec.Options{Level: 1, FastTails: true})
		if err != nil {
			panic(err)
		}
		return c
	}), Limits: holes("codec")},
	{Name: "null-mux", Build: func(t testing.TB, d string) layer.FS { return null.New(muxTmpfsDisk(t, d)) }, Dirs: []string{"tmp", "disk"}, Limits: onTmpfs},
}

func TestConformance(t *testing.T) {
	for _, s := range stacks {
		t.Run(s.Name, func(t *testing.T) { conformance.Run(t, s) })
	}
}

func holes(why string) map[conformance.Limit]string {
	return map[conformance.Limit]string{conformance.Holes: why + " stores whole chunks: SEEK_DATA/SEEK_HOLE and st_blocks show no holes"}
}

// onTmpfs: a stack with a tmpfs for (part of) its lower shows what tmpfs
// cannot do.
var onTmpfs = map[conformance.Limit]string{conformance.LowerTmpfs: "tmpfs has no FALLOC_FL_ZERO_RANGE, and a larger largest file than ext4"}

// cryptLimits: crypt's chunks hide holes, and an xattr value is stored
// encrypted under an encrypted name, with a nonce and a tag: about 100 bytes
// more of the lower's one block for a file's xattrs.
var cryptLimits = map[conformance.Limit]string{
	conformance.Holes:         "crypt stores whole chunks: SEEK_DATA/SEEK_HOLE and st_blocks show no holes",
	conformance.XattrOverhead: "crypt stores a value with a 24-byte nonce and a 16-byte tag under a longer, encrypted name",
}

// shardOver shards every directory with 4 buckets, so that names share
// buckets and a rename between directories is one between buckets.
func shardOver(t testing.TB, d string) layer.FS {
	s, err := shard.New(lower(t, d), shard.Config{Default: shard.Layout{Scheme: shard.Hash, Buckets: 4, Prefix: shard.DefaultPrefix}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// shardGrowing shards every directory with the growing layout at 2
// entries a bucket: directories split in the background as the tests
// fill them.
func shardGrowing(t testing.TB, d string) layer.FS {
	s, err := shard.New(lower(t, d), shard.Config{Default: shard.Layout{Scheme: shard.Hash, Buckets: 1, Prefix: shard.DefaultPrefix}, MaxBucket: 2})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func lower(t testing.TB, d string) layer.FS {
	l, err := local.New(d)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func snoopOver(t testing.TB, l layer.FS) layer.FS {
	s, err := snoop.New(l, snoop.Options{Output: "file", Log: filepath.Join(t.TempDir(), "log")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func aclOver(l layer.FS) layer.FS { return acl.New(l, &acl.Rules{Default: true}, false, false) }

func cryptOver(t testing.TB, l layer.FS) layer.FS {
	pass := []byte("conformance")
	ctx := context.Background()
	if _, err := crypt.Init(ctx, l, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
		t.Fatal(err)
	}
	c, err := crypt.Unlock(ctx, l, pass, false, crypt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// replicaOf is a replica set of d and another directory of the same file
// system, claimed as cairn mount claims it.
func replicaOf(t testing.TB, d string) layer.FS {
	r, err := replica.New([]layer.FS{lower(t, d), lower(t, t.TempDir())}, replica.Options{Policy: replica.RoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Claim(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// unionOver is a union of d (read-write) over a read-only branch with a
// few files of its own, outside the directories the cases use.
func unionOver(t testing.TB, d string) layer.FS {
	lo := t.TempDir()
	u, err := union.New([]fanout.Branch{{FS: lower(t, d), Mode: fanout.RW}, {FS: lower(t, lo), Mode: fanout.RO}}, union.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// cryptContent is crypt's content encryption of a new volume (its
// configuration kept outside d), storing files in d's lower.
func cryptContent(t testing.TB, l layer.FS) *crypt.Content {
	ctx := context.Background()
	cl := lower(t, t.TempDir())
	pass := []byte("conformance")
	if _, err := crypt.Init(ctx, cl, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
		t.Fatal(err)
	}
	cfg, err := crypt.ReadConfig(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	master, err := cfg.Unwrap(pass)
	if err != nil {
		t.Fatal(err)
	}
	c, err := crypt.NewContent(l, cfg, master, crypt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// chainOver stores every file zstd-encoded, then encrypted, under its own
// name: two transforms chained over one lower (layer.Transform), as a
// chain of the chains layer stores a file.
func chainOver(t testing.TB, d string) layer.FS {
	l := lower(t, d)
	mid := layer.NewTransformed(l, cryptContent(t, l))
	z, err := codec.NewEngine(mid, "zstd", codec.Options{Level: 1})
	if err != nil {
		t.Fatal(err)
	}
	return layer.NewTransformed(mid, z)
}

// chainsOver is a chains layer whose rule gives every new file the chain
// (none if empty), with crypt links keyed.
func chainsOver(chain string) func(t testing.TB, d string) layer.FS {
	return func(t testing.TB, d string) layer.FS {
		l := lower(t, d)
		o := chains.Options{Crypt: cryptContent(t, l)}
		if chain != "" {
			all, err := pathmatch.NewSet([]string{"**"}, nil)
			if err != nil {
				t.Fatal(err)
			}
			o.Rules = []chains.Rule{{Paths: all, Chain: strings.Split(chain, ",")}}
		}
		c, err := chains.New(l, o)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// chainsLimits: a guarded file's chunks hide holes, and its chain record
// is an xattr of the lower file.
var chainsLimits = map[conformance.Limit]string{
	conformance.Holes:         "codec and crypt store whole chunks: SEEK_DATA/SEEK_HOLE and st_blocks show no holes",
	conformance.XattrOverhead: "a guarded file's chain record is an xattr of its lower file (about 40 bytes of its one block)",
}

// packOver is pack over the lower directory, packing 1 ms after a file is
// left alone (in the middle of the cases), with top over it if not nil.
func packOver(top func(layer.FS) layer.FS) func(t testing.TB, d string) layer.FS {
	return func(t testing.TB, d string) layer.FS {
		p, err := pack.New(lower(t, d), pack.Options{Delay: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if top != nil {
			return top(p)
		}
		return p
	}
}

func codecOver(kind string) func(t testing.TB, d string) layer.FS {
	return func(t testing.TB, d string) layer.FS {
		c, err := codec.New(lower(t, d), kind, codec.Options{Level: 1})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

// muxTmpfsDisk is mux over two file systems: a new tmpfs ("tmp") and the
// lower directory on the root file system ("disk").
func muxTmpfsDisk(t testing.TB, d string) layer.FS {
	tmp := mounttest.Tmpfs(t, "")
	m, err := mux.New([]layer.FS{lower(t, tmp), lower(t, d)}, []string{"tmp", "disk"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// tmpfsInside makes the lower a tmpfs with another tmpfs at sub: both count
// inode numbers from the start, so files of the two share numbers.
func tmpfsInside(t testing.TB, d string) {
	mounttest.Tmpfs(t, d)
	mounttest.Tmpfs(t, filepath.Join(d, "sub"))
}
