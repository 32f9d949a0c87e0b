//go:build linux

package fusefs_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/acl"
	"cairnfs.dev/cairn/layers/chains"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/mux"
	"cairnfs.dev/cairn/layers/null"
	"cairnfs.dev/cairn/layers/snoop"
	"cairnfs.dev/cairn/pathmatch"

	"golang.org/x/sys/unix"
)

// These tests count the reads that reach the bottom of the stack (a
// counter under the layers; TestCapabilitiesPerFile counts on top), and add
// the cases of a mount-wide veto (NoPassthrough), of hooked layers that
// must see every read (snoop io, acl reload), and of one mount whose files
// differ (null over mux over a plain and a crypt branch).

// bottomStack builds a stack over the counter c (the bottom of the stack,
// over a local directory).
type bottomStack struct {
	name string
	// file is the path of the test file in the stack.
	file string
	// pass and keep: the file must be passed through (no read reaches the
	// bottom) or, if not, have its pages kept across opens (the second
	// open reads nothing).
	pass, keep bool
	noPass     bool // mount with Options.NoPassthrough
	new        func(t *testing.T, c func() layer.FS) layer.FS
}

func newCrypt(t *testing.T, l layer.FS) layer.FS {
	pass := []byte("caps test")
	if _, err := crypt.Init(context.Background(), l, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, pass); err != nil {
		t.Fatal(err)
	}
	fs, err := crypt.Unlock(context.Background(), l, pass, false, crypt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func newCodec(t *testing.T, l layer.FS, kind string) layer.FS {
	fs, err := codec.New(l, kind, codec.Options{Level: 1, ChunkSize: 64 << 10}) // several chunks: an idle file keeps one decoded
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

func newSnoop(t *testing.T, l layer.FS, io bool) layer.FS {
	fs, err := snoop.New(l, snoop.Options{Output: "file", Log: filepath.Join(t.TempDir(), "log"), IO: io})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

var bottomStacks = []bottomStack{
	{name: "null", file: "f", pass: true, new: func(t *testing.T, c func() layer.FS) layer.FS { return null.New(c()) }},
	{name: "null, no passthrough", file: "f", noPass: true, new: func(t *testing.T, c func() layer.FS) layer.FS { return null.New(c()) }},
	{name: "snoop", file: "f", pass: true, new: func(t *testing.T, c func() layer.FS) layer.FS { return newSnoop(t, c(), false) }},
	{name: "snoop io", file: "f", new: func(t *testing.T, c func() layer.FS) layer.FS { return newSnoop(t, c(), true) }},
	{name: "acl", file: "f", pass: true, new: func(t *testing.T, c func() layer.FS) layer.FS {
		return acl.New(c(), &acl.Rules{Default: true}, false, false)
	}},
	{name: "acl reload", file: "f", new: func(t *testing.T, c func() layer.FS) layer.FS {
		return acl.New(c(), &acl.Rules{Default: true}, true, false)
	}},
	{name: "crypt", file: "f", keep: true, new: func(t *testing.T, c func() layer.FS) layer.FS { return newCrypt(t, c()) }},
	{name: "crypt, no passthrough", file: "f", keep: true, noPass: true, new: func(t *testing.T, c func() layer.FS) layer.FS { return newCrypt(t, c()) }},
	{name: "zstd", file: "f", new: func(t *testing.T, c func() layer.FS) layer.FS { return newCodec(t, c(), "zstd") }},
	{name: "copy", file: "f", new: func(t *testing.T, c func() layer.FS) layer.FS { return newCodec(t, c(), "copy") }},
	{name: "snoop over crypt", file: "f", keep: true, new: func(t *testing.T, c func() layer.FS) layer.FS {
		return newSnoop(t, newCrypt(t, c()), false)
	}},
	{name: "acl over zstd", file: "f", new: func(t *testing.T, c func() layer.FS) layer.FS {
		return acl.New(newCodec(t, c(), "zstd"), &acl.Rules{Default: true}, false, false)
	}},
	{name: "chains, unguarded", file: "f", pass: true, new: func(t *testing.T, c func() layer.FS) layer.FS { return newChains(t, c()) }},
	{name: "chains over crypt, unguarded", file: "f", keep: true, new: func(t *testing.T, c func() layer.FS) layer.FS { return newChains(t, newCrypt(t, c())) }},
	{name: "null over mux, plain branch", file: "0/f", pass: true, new: nullOverMux},
	{name: "null over mux, crypt branch", file: "1/f", keep: true, new: nullOverMux},
}

// newChains is a chains layer whose rule gives every new file chain (none:
// no rule).
func newChains(t *testing.T, l layer.FS, chain ...string) layer.FS {
	var o chains.Options
	if chain != nil {
		all, err := pathmatch.NewSet([]string{"**"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		o.Rules = []chains.Rule{{Paths: all, Chain: chain}}
	}
	c, err := chains.New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// nullOverMux is null over mux over a plain branch "0" and a crypt branch
// "1": one mount, two kinds of file.
func nullOverMux(t *testing.T, c func() layer.FS) layer.FS {
	mx, err := mux.New([]layer.FS{null.New(c()), newCrypt(t, c())}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return null.New(mx)
}

// TestCapsThroughStacks: passthrough and keep-cache are on exactly when
// they are safe, for every layer and pairs of layers, counted by the reads
// that reach the bottom of the stack: a passed-through file reaches it
// never; a file that is not reaches it on its first open, and on a second
// open of the unchanged file only if its pages may not be kept.
func TestCapsThroughStacks(t *testing.T) {
	ctx := context.Background()
	// Random bytes, which zstd cannot shrink to a tail the codec keeps in
	// memory.
	data := make([]byte, 1<<20)
	rand.Read(data)
	for _, s := range bottomStacks {
		t.Run(s.name, func(t *testing.T) {
			var counters []*mounttest.IOCounter
			c := func() layer.FS {
				dir := t.TempDir()
				c := mounttest.CountIO(newLocal(t, dir))
				counters = append(counters, c)
				return c
			}
			top := s.new(t, c)
			t.Cleanup(func() { layer.CloseStack(top) })
			if err := layer.WriteFile(ctx, top, s.file, data, 0o644); err != nil {
				t.Fatal(err)
			}
			reads := func() (n int64) {
				for _, c := range counters {
					n += c.Reads.Load()
				}
				return n
			}
			m := mounttest.MountOpts(t, top, fusefs.Options{NoPassthrough: s.noPass})
			for i := 0; i < 2; i++ {
				before := reads()
				got, err := os.ReadFile(m.Path(s.file))
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("open %d: read %d bytes, %v", i+1, len(got), err)
				}
				n := reads() - before
				want := !s.pass && (i == 0 || !s.keep) // reads must reach the bottom
				if s.pass && s.noPass {
					want = true
				}
				if i == 1 && want && strings.Contains(s.name, "zstd") || i == 1 && s.name == "copy" {
					// A codec layer may still hold the file's decoded
					// chunks from the first open (its release comes after
					// close returns): the second open's reads reach the
					// layer (TestCapabilitiesPerFile counts them there),
					// not necessarily the bottom.
					continue
				}
				if want != (n > 0) {
					t.Errorf("open %d: %d reads reached the bottom of the stack (passthrough %v, keep-cache %v)", i+1, n, s.pass, s.keep)
				}
			}
		})
	}
}

// capsLowerFile is a bottom file that offers the caps it is given.
type capsLowerFile struct {
	layer.File
	caps layer.Caps
}

func (f capsLowerFile) Caps() layer.Caps { return f.caps }

// capsFS opens capsFiles.
type capsFS struct {
	layer.FS
	caps layer.Caps
}

func (c *capsFS) Open(ctx context.Context, p string, flags int) (layer.File, error) {
	f, err := c.FS.Open(ctx, p, flags)
	if err != nil {
		return nil, err
	}
	return capsLowerFile{f, c.caps}, nil
}

func (c *capsFS) Lowers() []layer.FS { return nil }

// TestWrappersForwardCaps: every File wrapper of the tree forwards the
// caps it does not change, whatever the lower offers, and the layers that
// change data never offer passthrough.
func TestWrappersForwardCaps(t *testing.T) {
	ctx := context.Background()
	all := layer.CapPassthrough | layer.CapKeepCache | layer.CapDirectIO
	wrappers := []struct {
		name string
		new  func(t *testing.T, l layer.FS) layer.FS
		// mask is what the wrapper takes away; add is what it offers
		// whatever the lower offers.
		mask, add layer.Caps
	}{
		{"base", func(t *testing.T, l layer.FS) layer.FS { return &layer.Base{Lower: l} }, 0, 0},
		{"null", func(t *testing.T, l layer.FS) layer.FS { return null.New(l) }, 0, 0},
		{"counter", func(t *testing.T, l layer.FS) layer.FS { return mounttest.CountIO(l) }, 0, 0},
		{"snoop", func(t *testing.T, l layer.FS) layer.FS { return newSnoop(t, l, false) }, 0, 0},
		{"snoop io", func(t *testing.T, l layer.FS) layer.FS { return newSnoop(t, l, true) }, layer.CapPassthrough, 0},
		{"acl", func(t *testing.T, l layer.FS) layer.FS { return acl.New(l, &acl.Rules{Default: true}, false, false) }, 0, 0},
		{"acl reload", func(t *testing.T, l layer.FS) layer.FS { return acl.New(l, &acl.Rules{Default: true}, true, false) }, layer.CapPassthrough, 0},
		{"mux", func(t *testing.T, l layer.FS) layer.FS {
			mx, err := mux.New([]layer.FS{l}, []string{"m"})
			if err != nil {
				t.Fatal(err)
			}
			return mx
		}, 0, 0},
		{"crypt", newCrypt, all, layer.CapKeepCache},
		{"zstd", func(t *testing.T, l layer.FS) layer.FS { return newCodec(t, l, "zstd") }, all, layer.CapKeepCache},
		{"chains, unguarded", func(t *testing.T, l layer.FS) layer.FS { return newChains(t, l) }, 0, 0},
		{"chains, guarded", func(t *testing.T, l layer.FS) layer.FS { return newChains(t, l, "copy", "zstd") }, all, layer.CapKeepCache},
	}
	for _, w := range wrappers {
		for _, lower := range []layer.Caps{0, layer.CapPassthrough, layer.CapKeepCache, layer.CapDirectIO, all} {
			l := &capsFS{localLower(t, t.TempDir()), lower}
			fs := w.new(t, l)
			p := "f"
			if w.name == "mux" {
				p = "m/f"
			}
			if err := layer.WriteFile(ctx, fs, p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := fs.Open(ctx, p, os.O_RDONLY)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := f.Caps(), lower&^w.mask|w.add; got != want {
				t.Errorf("%s over a file with caps %v: %v, want %v", w.name, lower, got, want)
			}
			f.Release(ctx)
			if w.name != "base" && w.name != "counter" {
				fs.Close()
			}
		}
	}
}

// TestFSCapsOf: Base forwards the lower's FS capabilities, a fan-out layer
// has the intersection of its lowers', and the frontend refuses what the
// stack cannot do with the errno a file system without it gives.
func TestFSCapsOf(t *testing.T) {
	dir := t.TempDir()
	l := localLower(t, dir)
	if got := layer.FSCapsOf(null.New(l)); got != layer.FSAll {
		t.Fatalf("null over local: %v", got)
	}
	lacks := &lacking{Base: layer.Base{Lower: localLower(t, t.TempDir())}}
	if got := layer.FSCapsOf(null.New(lacks)); got != layer.FSAll&^lackCaps {
		t.Fatalf("null over a layer without %v: %v", lackCaps, got)
	}
	mx, err := mux.New([]layer.FS{l, lacks}, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	if got := layer.FSCapsOf(mx); got != layer.FSAll&^lackCaps {
		t.Fatalf("mux: %v", got)
	}
	m := mounttest.Mount(t, null.New(mx))
	os.WriteFile(m.Path("a", "f"), []byte("x"), 0o644)
	if err := os.Link(m.Path("a", "f"), m.Path("a", "g")); !errors.Is(err, syscall.EPERM) {
		t.Errorf("link in a stack without hard links: %v, want EPERM", err)
	}
	if err := os.Symlink("f", m.Path("a", "s")); err != nil {
		t.Errorf("symlink: %v", err)
	}
	if err := unix.Setxattr(m.Path("a", "f"), "user.x", []byte("1"), 0); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Errorf("setxattr in a stack without xattrs: %v, want EOPNOTSUPP", err)
	}
}

const lackCaps = layer.FSHardLinks | layer.FSXattr

// lacking is a layer that cannot make hard links nor keep xattrs.
type lacking struct{ layer.Base }

func (l *lacking) FSCaps() layer.FSCaps { return layer.FSCapsOf(l.Lower) &^ lackCaps }
