package fusefs_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"cairn/internal/mounttest"
	"cairn/layer"
	"cairn/layers/acl"
	"cairn/layers/codec"
	"cairn/layers/crypt"
	"cairn/layers/local"
	"cairn/layers/mux"
	"cairn/layers/null"
	"cairn/layers/snoop"
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
	snoopOver := func(t *testing.T, l layer.FS) layer.FS {
		s, err := snoop.New(l, snoop.Options{Log: filepath.Join(t.TempDir(), "log.jsonl")})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	aclOver := func(l layer.FS) layer.FS { return acl.New(l, &acl.Rules{Default: true}, false, false) }
	cryptOver := func(t *testing.T, l layer.FS) layer.FS {
		pass := []byte("capabilities")
		if _, err := crypt.Init(context.Background(), l, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
			t.Fatal(err)
		}
		fs, err := crypt.Unlock(context.Background(), l, pass, false, crypt.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}
	codecOver := func(t *testing.T, l layer.FS, name string) layer.FS {
		fs, err := codec.New(l, name, codec.Options{Level: 1})
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}
	return []capStack{
		{name: "null", build: func(t *testing.T, l layer.FS) layer.FS { return null.New(l) }, passthrough: true},
		{name: "snoop", build: snoopOver, passthrough: true},
		{name: "acl", build: func(t *testing.T, l layer.FS) layer.FS { return aclOver(l) }, passthrough: true},
		{name: "crypt", build: cryptOver, keep: true},
		{name: "zstd", build: func(t *testing.T, l layer.FS) layer.FS { return codecOver(t, l, "zstd") }},
		{name: "copy", build: func(t *testing.T, l layer.FS) layer.FS { return codecOver(t, l, "copy") }},
		{name: "snoop over crypt", build: func(t *testing.T, l layer.FS) layer.FS { return snoopOver(t, cryptOver(t, l)) }, keep: true},
		{name: "acl over zstd", build: func(t *testing.T, l layer.FS) layer.FS { return aclOver(codecOver(t, l, "zstd")) }},
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
// second open of an unchanged crypt file is served from the kernel's cache
// (keep-cache), even under snoop and null, which once lost it.
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

// Every File wrapper forwards the capabilities it does not change.
func TestFileWrappersForwardCaps(t *testing.T) {
	for _, c := range []layer.Caps{0, layer.CapPassthrough, layer.CapKeepCache, layer.CapKeepCache | layer.CapDirectIO} {
		f := &layer.BaseFile{Lower: capsFile{c: c}}
		if got := f.Caps(); got != c {
			t.Errorf("BaseFile: %v, want %v", got, c)
		}
	}
}

type capsFile struct {
	layer.File
	c layer.Caps
}

func (f capsFile) Caps() layer.Caps { return f.c }
