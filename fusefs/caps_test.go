//go:build linux

package fusefs_test

import (
	"os"
	"testing"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/mux"
	"cairnfs.dev/cairn/layers/null"
)

// capStack builds a stack over a local directory and says what its files
// must allow.
type capStack struct {
	name              string
	build             func(t *testing.T, bottom layer.FS) layer.FS
	passthrough, keep bool
	sub               string // where the files are under the mount ("" or mux's branch)
}

func capStacks() []capStack {
	aclOver := func(l layer.FS) layer.FS { return acl.New(l, &acl.Rules{Default: true}, false, false) }
	snoopOver := func(t *testing.T, l layer.FS) layer.FS { return newSnoop(t, l, false) }
	cryptOver, codecOver := newCrypt, newCodec
	chainsOver := newChains
	return []capStack{
		{name: "chains, unguarded", build: func(t *testing.T, l layer.FS) layer.FS { return chainsOver(t, l) }, passthrough: true},
		{name: "chains, guarded by copy", build: func(t *testing.T, l layer.FS) layer.FS { return chainsOver(t, l, "copy") }, keep: true},
		{name: "chains, guarded by zstd and copy", build: func(t *testing.T, l layer.FS) layer.FS { return chainsOver(t, l, "zstd", "copy") }, keep: true},
		{name: "snoop over chains, unguarded", build: func(t *testing.T, l layer.FS) layer.FS { return snoopOver(t, chainsOver(t, l)) }, passthrough: true},
		{name: "null over chains, guarded", build: func(t *testing.T, l layer.FS) layer.FS { return null.New(chainsOver(t, l, "copy")) }, keep: true},
		{name: "chains over crypt, unguarded", build: func(t *testing.T, l layer.FS) layer.FS { return chainsOver(t, cryptOver(t, l)) }, keep: true},
		{name: "chains over zstd, unguarded", build: func(t *testing.T, l layer.FS) layer.FS { return chainsOver(t, codecOver(t, l, "zstd")) }, keep: true},
		{name: "null", build: func(t *testing.T, l layer.FS) layer.FS { return null.New(l) }, passthrough: true},
		{name: "snoop", build: snoopOver, passthrough: true},
		{name: "acl", build: func(t *testing.T, l layer.FS) layer.FS { return aclOver(l) }, passthrough: true},
		{name: "crypt", build: cryptOver, keep: true},
		{name: "zstd", build: func(t *testing.T, l layer.FS) layer.FS { return codecOver(t, l, "zstd") }, keep: true},
		{name: "copy", build: func(t *testing.T, l layer.FS) layer.FS { return codecOver(t, l, "copy") }, keep: true},
		{name: "snoop over crypt", build: func(t *testing.T, l layer.FS) layer.FS { return snoopOver(t, cryptOver(t, l)) }, keep: true},
		{name: "acl over zstd", build: func(t *testing.T, l layer.FS) layer.FS { return aclOver(codecOver(t, l, "zstd")) }, keep: true},
		{name: "null over mux", sub: "m", passthrough: true, build: func(t *testing.T, l layer.FS) layer.FS {
			mx, err := mux.New([]layer.FS{l}, []string{"m"})
			if err != nil {
				t.Fatal(err)
			}
			return null.New(mx)
		}},
		{name: "null over crypt over mux", sub: "m", keep: true, build: func(t *testing.T, l layer.FS) layer.FS {
			mx, err := mux.New([]layer.FS{cryptOver(t, l)}, []string{"m"})
			if err != nil {
				t.Fatal(err)
			}
			return null.New(mx)
		}},
	}
}

// TestCapabilitiesPerFile: passthrough and keep-cache are on exactly when
// they are safe, for each layer type and for pairs, counted by the reads
// that reach the stack (a counter on top): a passed-through file's reads reach
// none; a file whose bytes a layer changes is read through the stack; a
// second open of an unchanged crypt or codec file is served from the
// kernel's cache (keep-cache), even under snoop and null, which once lost
// it, and through chains.
func TestCapabilitiesPerFile(t *testing.T) {
	mounttest.Need(t)
	data := make([]byte, 256<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, s := range capStacks() {
		t.Run(s.name, func(t *testing.T) {
			l, err := local.New(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			// The counter on top sees every read that reaches the stack
			// (it forwards its files' capabilities, as every wrapper must).
			c := mounttest.CountIO(s.build(t, l))
			top := layer.FS(c)
			t.Cleanup(func() { layer.CloseStack(top) })
			m := mounttest.Mount(t, top)
			p := m.Path(s.sub, "f")
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			// Drop the pages written: the first read must go down (or
			// pass through).
			m.Unmount()
			m = mounttest.Mount(t, top)
			p = m.Path(s.sub, "f")
			c.Reads.Store(0)
			read := func() {
				b, err := os.ReadFile(p)
				if err != nil || len(b) != len(data) {
					t.Fatalf("read: %d bytes, %v", len(b), err)
				}
			}
			read()
			first := c.Reads.Load()
			read()
			second := c.Reads.Load() - first
			switch {
			case s.passthrough && first+second != 0:
				t.Errorf("passed through: %d and %d reads reached the stack", first, second)
			case !s.passthrough && first == 0:
				t.Errorf("the bytes are changed below, yet no read reached the stack (passed through?)")
			case !s.passthrough && s.keep && second != 0:
				t.Errorf("keep-cache: a second open read %d times through the stack", second)
			case !s.passthrough && !s.keep && second == 0:
				t.Errorf("no keep-cache: a second open was served from the kernel's cache")
			}
		})
	}
}
