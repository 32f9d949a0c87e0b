//go:build linux

package crypt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
)

// syncBuf is a log sink for the mount's error lines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTampering changes the lower directory in every way the threat model
// covers and checks that the application gets EIO (never data) and the
// operator a log line naming the file.
func TestTampering(t *testing.T) {
	lower, fs := stack(t)
	ctx := context.Background()
	data := func(seed byte) []byte {
		b := make([]byte, 3*4096+100)
		for i := range b {
			b[i] = seed + byte(i*7)
		}
		return b
	}
	lp := func(name string) string {
		p, err := fs.lowerPath(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return filepath.Join(lower, p)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(lp(name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	write := func(name string, b []byte) {
		if err := os.WriteFile(lp(name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const hs, cbs = int64(headerSize), int64(12 + 4096 + 16)
	files := []string{"blockflip", "tagflip", "nonceflip", "headerflip", "magicflip", "swap", "moved", "donor",
		"zeroed", "trunc-boundary", "trunc-mid", "trunc-header", "trunc-onlyheader", "appended", "replayed-last"}
	for i, n := range files {
		if err := layer.WriteFile(ctx, fs, n, data(byte(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flip := func(name string, off int64) {
		b := read(name)
		b[off] ^= 0x10
		write(name, b)
	}
	flip("blockflip", hs+cbs+12+100) // ciphertext of block 1
	flip("tagflip", hs+cbs-1)        // tag of block 0
	flip("nonceflip", hs+2*cbs+3)    // nonce of block 2
	flip("headerflip", 10)           // file ID
	flip("magicflip", 0)             // magic
	b := read("swap")                // swap blocks 0 and 1
	b0 := bytes.Clone(b[hs : hs+cbs])
	copy(b[hs:], b[hs+cbs:hs+2*cbs])
	copy(b[hs+cbs:], b0)
	write("swap", b)
	b, d := read("moved"), read("donor") // block 1 from another file
	copy(b[hs+cbs:hs+2*cbs], d[hs+cbs:hs+2*cbs])
	write("moved", b)
	b = read("zeroed") // an all-zero block (a hole to gocryptfs)
	clear(b[hs+cbs : hs+2*cbs])
	write("zeroed", b)
	os.Truncate(lp("trunc-boundary"), hs+2*cbs) // whole blocks dropped
	os.Truncate(lp("trunc-mid"), int64(len(read("trunc-mid")))-10)
	os.Truncate(lp("trunc-header"), 10)
	os.Truncate(lp("trunc-onlyheader"), hs)
	b = read("appended") // a copy of the last block appended
	write("appended", append(b, b[hs+3*cbs:]...))
	// The previous last block replayed after the file grew: write two
	// blocks, keep the last, add a third, put the old second one back.
	if err := layer.WriteFile(ctx, fs, "replayed-last", data(1)[:8192], 0o644); err != nil {
		t.Fatal(err)
	}
	old := read("replayed-last")
	f, err := fs.Open(ctx, "replayed-last", unix.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(ctx, make([]byte, 4096), 8192)
	f.Release(ctx)
	b = read("replayed-last")
	copy(b[hs+cbs:hs+2*cbs], old[hs+cbs:]) // block 1 as it was when it was last
	write("replayed-last", b)

	// Names, directories, links and attributes.
	layer.MkdirAll(ctx, fs, "dir1/sub", 0o755)
	layer.MkdirAll(ctx, fs, "dir2", 0o755)
	layer.MkdirAll(ctx, fs, "dir3", 0o755)
	layer.MkdirAll(ctx, fs, "dir4", 0o755)
	layer.MkdirAll(ctx, fs, "dir5", 0o755)
	layer.WriteFile(ctx, fs, "dir5/dup", []byte("d"), 0o644)
	layer.WriteFile(ctx, fs, "dir1/a", []byte("a"), 0o644)
	layer.WriteFile(ctx, fs, "dir2/b", []byte("b"), 0o644)
	layer.WriteFile(ctx, fs, "dir3/"+strings.Repeat("L", 200), []byte("long"), 0o644)
	layer.WriteFile(ctx, fs, "dir4/moved-here", []byte("x"), 0o644)
	fs.Symlink(ctx, "somewhere", "link")
	layer.WriteFile(ctx, fs, "xattrs", []byte("x"), 0o644)
	if err := fs.Setxattr(ctx, "xattrs", "user.k", []byte("value"), 0); err != nil {
		t.Fatal(err)
	}
	// a name with a bit changed
	a := lp("dir1/a")
	bad := []byte(filepath.Base(a))
	bad[5] ^= 1
	if bad[5] == '/' || bad[5] == '.' {
		bad[5] ^= 3
	}
	os.Rename(a, filepath.Join(filepath.Dir(a), string(bad)))
	// a second lower name that decodes to the same bytes (the base64
	// decoder skips CR)
	dup := lp("dir5/dup")
	os.Link(dup, filepath.Join(filepath.Dir(dup), filepath.Base(dup)[:5]+"\r"+filepath.Base(dup)[5:]))
	// a directory's IV changed
	iv := filepath.Join(lp("dir2"), dirIVName)
	os.Chmod(iv, 0o644)
	ivb, _ := os.ReadFile(iv)
	ivb[0] ^= 1
	os.WriteFile(iv, ivb, 0o444)
	// a long name's side file changed
	side := lp("dir3/"+strings.Repeat("L", 200)) + longSuffix
	os.Chmod(side, 0o644)
	sb, _ := os.ReadFile(side)
	sb[3] ^= 1
	os.WriteFile(side, sb, 0o444)
	// an entry moved from dir4 into dir1/sub (bound to dir4's IV)
	os.Rename(lp("dir4/moved-here"), filepath.Join(lp("dir1/sub"), filepath.Base(lp("dir4/moved-here"))))
	// a symlink target and an xattr value changed
	tl := lp("link")
	tgt, _ := os.Readlink(tl)
	os.Remove(tl)
	os.Symlink(tgt[:10]+string(tgt[10]^1)+tgt[11:], tl)
	xn, _ := fs.xattrName("user.k")
	v := make([]byte, 100)
	n, _ := unix.Lgetxattr(lp("xattrs"), xn, v)
	v[n-1] ^= 1
	unix.Lsetxattr(lp("xattrs"), xn, v[:n], 0)

	// Now through the kernel, which has cached nothing of these, and a
	// fresh layer (whose name cache holds nothing either).
	logs := &syncBuf{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	l, err := openLocal(t, lower)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := Unlock(ctx, l, testPass, false, Options{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fresh) })
	m := mounttest.MountOpts(t, fresh, fusefs.Options{AllowOther: true, Logger: logger})
	wantEIO := func(what, logName string, err error) {
		t.Helper()
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s: got %v, want EIO", what, err)
			return
		}
		if !strings.Contains(logs.String(), logName) {
			t.Errorf("%s: no log line names %s:\n%s", what, logName, logs.String())
		}
	}
	for _, n := range files {
		if n == "donor" {
			continue
		}
		got, err := os.ReadFile(m.Path(n))
		wantEIO(n, "/"+n, err)
		if err == nil {
			t.Errorf("%s: read %d bytes of tampered data", n, len(got))
		}
	}
	if got, err := os.ReadFile(m.Path("donor")); err != nil || !bytes.Equal(got, data(byte(7))) {
		t.Errorf("donor: %v", err)
	}
	// A bad name is left out of its directory's listing, and logged
	// once with its lower path; the rest of the directory lists.
	leftOut := func(what, dir, lowerName string, want ...string) {
		t.Helper()
		for i := 0; i < 2; i++ {
			ents, err := os.ReadDir(m.Path(dir))
			var got []string
			for _, e := range ents {
				got = append(got, e.Name())
			}
			if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%s: %s lists %q, %v; want %q", what, dir, got, err, want)
			}
		}
		c := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "left out") && strings.Contains(line, lowerName) {
				c++
			}
		}
		if c != 1 {
			t.Errorf("%s: %d log lines name %s, want 1:\n%s", what, c, lowerName, logs.String())
		}
	}
	leftOut("flipped name", "dir1", filepath.Base(filepath.Dir(a))+"/"+string(bad), "sub")
	_, err = os.ReadDir(m.Path("dir2"))
	wantEIO("changed directory IV (readdir)", "/dir2", err)
	_, err = os.Stat(m.Path("dir2", "b"))
	wantEIO("changed directory IV (lookup)", "/dir2", err)
	crName := strconv.Quote(filepath.Base(dup)[:5] + "\r" + filepath.Base(dup)[5:])
	leftOut("non-canonical name", "dir5", crName[1:len(crName)-1], "dup")
	leftOut("changed long-name side file", "dir3", filepath.Base(side[:len(side)-len(longSuffix)]))
	leftOut("entry moved between directories", "dir1/sub", filepath.Base(lp("dir4/moved-here")))
	_, err = os.Readlink(m.Path("link"))
	wantEIO("symlink target", "/link", err)
	_, err = unix.Getxattr(m.Path("xattrs"), "user.k", make([]byte, 64))
	wantEIO("xattr value", "/xattrs", err)
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}
