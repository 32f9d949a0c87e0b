package chains_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/fusefs"
	"cairnfs.dev/cairn/internal/fsx"
	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/chains"
	"cairnfs.dev/cairn/layers/crypt"
	"cairnfs.dev/cairn/layers/fault"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/pathmatch"
)

const pass = "chains test"

// cryptDir makes a crypt volume configuration in a new directory.
func cryptDir(t testing.TB) string {
	d := t.TempDir()
	l, err := local.New(d)
	if err != nil {
		t.Fatal(err)
	}
	defer layer.CloseStack(l)
	if _, err := crypt.Init(context.Background(), l, crypt.InitParams{KDF: crypt.KDF{Name: crypt.Scrypt, N: crypt.ScryptMinN, R: 8, P: 1}}, []byte(pass)); err != nil {
		t.Fatal(err)
	}
	return d
}

// rules parses "pattern=link,link;pattern=link".
func rules(t testing.TB, s string) []chains.Rule {
	var out []chains.Rule
	for _, r := range strings.Split(s, ";") {
		if r == "" {
			continue
		}
		pat, ch, _ := strings.Cut(r, "=")
		set, err := pathmatch.NewSet([]string{pat}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, chains.Rule{Paths: set, Chain: strings.Split(ch, ",")})
	}
	return out
}

// logBuf is a logger whose lines a test reads.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.b.Write(p) }
func (l *logBuf) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// stack is a chains layer over the directory d; cdir, if not "", gives
// crypt links their key.
func stack(t testing.TB, d, cdir, rs string, log *logBuf) *chains.FS {
	l, err := local.New(d)
	if err != nil {
		t.Fatal(err)
	}
	o := chains.Options{Rules: rules(t, rs)}
	if log != nil {
		o.Logger = slog.New(slog.NewTextHandler(log, nil))
	}
	if cdir != "" {
		if o.Crypt, err = chains.OpenCrypt(l, cdir, []byte(pass), false); err != nil {
			t.Fatal(err)
		}
	}
	fs, err := chains.New(l, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { layer.CloseStack(fs) })
	return fs
}

const specRules = "**/*.log=zstd;secret/**=zstd,crypt"

func getChain(t testing.TB, p string) string {
	t.Helper()
	buf := make([]byte, 256)
	n, err := unix.Getxattr(p, chains.XattrName, buf)
	if err == layer.ENOATTR {
		return ""
	}
	if err != nil {
		t.Fatalf("getxattr %s: %v", p, err)
	}
	return string(buf[:n])
}

func setChain(p, v string) error { return unix.Setxattr(p, chains.XattrName, []byte(v), 0) }

func mustRead(t testing.TB, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s: read %d bytes (%v), want %d bytes", p, len(got), err, len(want))
	}
	if st, err := os.Stat(p); err != nil || st.Size() != int64(len(want)) {
		t.Fatalf("%s: stat %v %v, want size %d", p, st, err, len(want))
	}
}

func data(n int) []byte {
	return []byte(strings.Repeat("per-file chains of transformations. ", n/36+1)[:n])
}

// TestRulesBindChains: rules give new files their chains; the lower holds
// each in its link's format, under its own name; the chain stays with the
// file when it is renamed into another rule's path, and when the lower is
// copied with cp -a and mounted with no rules at all.
func TestRulesBindChains(t *testing.T) {
	d, cdir := t.TempDir(), cryptDir(t)
	fs := stack(t, d, cdir, specRules, nil)
	m := mounttest.Mount(t, fs)
	os.Mkdir(m.Path("secret"), 0o755)
	os.Mkdir(m.Path("logs"), 0o755)
	files := map[string][]byte{"logs/a.log": data(200000), "secret/s.txt": data(70000), "plain.txt": data(5000), "logs/empty.log": nil}
	for n, b := range files {
		if err := os.WriteFile(m.Path(n), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	for n, want := range map[string]string{"logs/a.log": "zstd", "secret/s.txt": "zstd,crypt", "plain.txt": "", "logs/empty.log": "zstd"} {
		if got := getChain(t, m.Path(n)); got != want {
			t.Errorf("%s: chain %q, want %q", n, got, want)
		}
		mustRead(t, m.Path(n), files[n])
	}
	stored := func(n string) []byte { b, _ := os.ReadFile(filepath.Join(d, n)); return b }
	if b := stored("logs/a.log"); !bytes.HasPrefix(b, []byte("CZF")) || len(b) > 20000 {
		t.Errorf("a.log is not stored zstd-encoded: % x (%d bytes)", b[:min(8, len(b))], len(b))
	}
	if b := stored("secret/s.txt"); !bytes.HasPrefix(b, []byte("cairnc")) || bytes.Contains(b, []byte("chains")) {
		t.Errorf("s.txt is not stored encrypted")
	}
	if !bytes.Equal(stored("plain.txt"), files["plain.txt"]) {
		t.Errorf("plain.txt is not stored as it is")
	}
	// The record is the layer's own: not listed, not readable by its name.
	list := make([]byte, 1024)
	n, _ := unix.Listxattr(m.Path("logs/a.log"), list)
	if strings.Contains(string(list[:n]), "cairn") {
		t.Errorf("listxattr shows %q", list[:n])
	}
	// Renamed into another rule's path, a file keeps its chain.
	if err := os.Rename(m.Path("logs/a.log"), m.Path("secret/a.log")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.Path("plain.txt"), m.Path("secret/plain.log")); err != nil {
		t.Fatal(err)
	}
	if c := getChain(t, m.Path("secret/a.log")); c != "zstd" {
		t.Errorf("renamed a.log: chain %q", c)
	}
	if c := getChain(t, m.Path("secret/plain.log")); c != "" {
		t.Errorf("renamed plain.txt: chain %q", c)
	}
	mustRead(t, m.Path("secret/a.log"), files["logs/a.log"])
	mustRead(t, m.Path("secret/plain.log"), files["plain.txt"])
	m.Unmount()

	// cp -a of the lower, mounted with no rules.
	d2 := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", d, d2).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v %s", err, out)
	}
	m2 := mounttest.Mount(t, stack(t, d2, cdir, "", nil))
	for n, want := range map[string]string{"secret/a.log": "zstd", "secret/s.txt": "zstd,crypt", "secret/plain.log": ""} {
		if got := getChain(t, m2.Path(n)); got != want {
			t.Errorf("copy: %s: chain %q, want %q", n, got, want)
		}
	}
	mustRead(t, m2.Path("secret/a.log"), files["logs/a.log"])
	mustRead(t, m2.Path("secret/s.txt"), files["secret/s.txt"])
	mustRead(t, m2.Path("secret/plain.log"), files["plain.txt"])
	if rs, err := exec.LookPath("rsync"); err == nil {
		d3 := filepath.Join(t.TempDir(), "rsync")
		if out, err := exec.Command(rs, "-aX", d+"/", d3+"/").CombinedOutput(); err != nil {
			t.Fatalf("rsync -aX: %v %s", err, out)
		}
		m3 := mounttest.Mount(t, stack(t, d3, cdir, "", nil))
		mustRead(t, m3.Path("secret/s.txt"), files["secret/s.txt"])
		if got := getChain(t, m3.Path("secret/s.txt")); got != "zstd,crypt" {
			t.Errorf("rsync -X copy: chain %q", got)
		}
	}
}

// TestPushPop converts live files through user.cairn.chain: each
// conversion rewrites the file (a new inode in the lower, renamed over the
// old), keeps its bytes, owner, mode, times and other xattrs, and an empty
// value or removexattr makes it unguarded again. A process holding the file
// open for reading keeps reading the bytes it had; one holding it open for
// writing makes the conversion wait, and fail with EBUSY if it does not
// close it.
func TestPushPop(t *testing.T) {
	d, cdir := t.TempDir(), cryptDir(t)
	log := &logBuf{}
	m := mounttest.Mount(t, stack(t, d, cdir, "", log))
	f := m.Path("f")
	want := data(300000)
	if err := os.WriteFile(f, want, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(f, "user.note", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(1000000000, 0)
	if err := os.Chtimes(f, mt, mt); err != nil {
		t.Fatal(err)
	}
	reader, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	for _, c := range []string{"zstd,crypt", "gzip", "copy,lz4,uuencode", "crypt", " zstd , crypt ", ""} {
		if err := setChain(f, c); err != nil {
			t.Fatalf("setfattr %q: %v", c, err)
		}
		wantC := strings.ReplaceAll(c, " ", "")
		if got := getChain(t, f); got != wantC {
			t.Errorf("after %q: chain %q", c, got)
		}
		mustRead(t, f, want)
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o640 || !st.ModTime().Equal(mt) {
			t.Errorf("after %q: mode %v mtime %v", c, st.Mode(), st.ModTime())
		}
		buf := make([]byte, 16)
		if n, err := unix.Getxattr(f, "user.note", buf); err != nil || string(buf[:n]) != "kept" {
			t.Errorf("after %q: user.note %q %v", c, buf[:n], err)
		}
		// The kernel sees the new inode at once (the frontend dropped
		// its entry for the name).
		if lst, err := os.Stat(filepath.Join(d, "f")); err != nil || st.Sys().(*syscall.Stat_t).Ino != lst.Sys().(*syscall.Stat_t).Ino {
			t.Errorf("after %q: st_ino %d, the lower's %v (%v)", c, st.Sys().(*syscall.Stat_t).Ino, lst, err)
		}
		stored, _ := os.ReadFile(filepath.Join(d, "f"))
		if (wantC == "") != bytes.Equal(stored, want) {
			t.Errorf("after %q: the lower holds %d bytes, plain: %v", c, len(stored), bytes.Equal(stored, want))
		}
		// The reader opened before still reads the bytes it had.
		got := make([]byte, 100)
		if _, err := reader.ReadAt(got, 1000); err != nil || !bytes.Equal(got, want[1000:1100]) {
			t.Errorf("after %q: the open reader reads %q, %v", c, got, err)
		}
	}
	if err := setChain(f, "zstd"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Removexattr(f, chains.XattrName); err != nil {
		t.Fatal(err)
	}
	if got := getChain(t, f); got != "" {
		t.Errorf("after removexattr: chain %q", got)
	}
	if err := unix.Removexattr(f, chains.XattrName); err != layer.ENOATTR {
		t.Errorf("removexattr of no chain: %v, want ENODATA", err)
	}
	mustRead(t, f, want)
	if ents, _ := os.ReadDir(m.Dir); len(ents) != 1 {
		t.Errorf("the mount lists %v", ents)
	}
	// A writer keeps the file from being converted.
	w, err := os.OpenFile(f, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := setChain(f, "zstd"); err != unix.EBUSY {
		t.Errorf("conversion of a file open for writing: %v, want EBUSY", err)
	}
	w.Close()
	if err := setChain(f, "zstd"); err != nil {
		t.Errorf("conversion once the writer closed: %v", err)
	}
	// Hard links: the conversion would split them.
	if err := os.Link(f, m.Path("g")); err != nil {
		t.Fatal(err)
	}
	if err := setChain(f, "gzip"); err != unix.EMLINK {
		t.Errorf("conversion of a file with two links: %v, want EMLINK", err)
	}
	mustRead(t, m.Path("g"), want)
}

// TestBadInput: an unknown or disallowed link name in the xattr is EINVAL
// and a log line; a recorded chain this build cannot follow is EIO with a
// message naming the link; a crypt link without a key is EACCES.
func TestBadInput(t *testing.T) {
	d := t.TempDir()
	log := &logBuf{}
	fs := stack(t, d, "", "", log)
	lines := &logBuf{}
	m := mounttest.MountOpts(t, fs, fusefs.Options{Logger: slog.New(slog.NewTextHandler(lines, nil))})
	f := m.Path("f")
	want := data(1000)
	if err := os.WriteFile(f, want, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"nosuchcodec", "crypt,zstd", "zstd,,gzip", "ZSTD", "zstd;gzip", "uuencode,zstd,uuencode"} {
		if err := setChain(f, v); err != unix.EINVAL {
			t.Errorf("setfattr %q: %v, want EINVAL", v, err)
		}
		if !strings.Contains(log.String(), "refused chain") {
			t.Errorf("setfattr %q: no log line", v)
		}
	}
	// uuencode once is a chain like any other.
	if err := setChain(f, "uuencode,zstd"); err != nil {
		t.Errorf("setfattr uuencode,zstd: %v", err)
	}
	if err := setChain(f, "zstd,crypt"); err != unix.EACCES {
		t.Errorf("crypt link without a key: %v, want EACCES", err)
	}
	mustRead(t, f, want)
	// Records written behind the layer's back.
	name := fs.Meta.Prefix() + "chain"
	for rec, wantErr := range map[string]error{"1:zstd,bogus": unix.EIO, "7:zstd": unix.EIO, "garbage": unix.EIO, "1:crypt": unix.EACCES} {
		g := filepath.Join(d, "g")
		os.WriteFile(g, want, 0o644)
		if err := unix.Setxattr(g, name, []byte(rec), 0); err != nil {
			t.Fatal(err)
		}
		_, err := os.ReadFile(m.Path("g"))
		if !errors.Is(err, wantErr) {
			t.Errorf("record %q: open gives %v, want %v", rec, err, wantErr)
		}
	}
	if !strings.Contains(log.String()+lines.String(), `bogus`) {
		t.Errorf("no message names the missing link:\n%s\n%s", log.String(), lines.String())
	}
}

// TestPassthroughPerFile: in one directory, reads of an unguarded file
// never reach the stack (FUSE passthrough, as under null), while those of
// guarded files do; pushing a chain on the unguarded file takes it off
// passthrough, and popping it puts it back.
func TestPassthroughPerFile(t *testing.T) {
	d := t.TempDir()
	c := mounttest.CountIO(stack(t, d, "", "**/*.log=copy", nil))
	m := mounttest.Mount(t, c)
	want := data(256 << 10)
	for _, n := range []string{"u.txt", "g.log"} {
		if err := os.WriteFile(m.Path(n), want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reads := func(n string) int64 {
		m.Unmount() // drop the pages
		m = mounttest.Mount(t, c)
		c.Reads.Store(0)
		mustRead(t, m.Path(n), want)
		return c.Reads.Load()
	}
	if r := reads("u.txt"); r != 0 {
		t.Errorf("unguarded: %d reads reached the stack", r)
	}
	if r := reads("g.log"); r == 0 {
		t.Errorf("guarded: no read reached the stack")
	}
	if err := setChain(m.Path("u.txt"), "copy"); err != nil {
		t.Fatal(err)
	}
	if r := reads("u.txt"); r == 0 {
		t.Errorf("after a push: no read reached the stack")
	}
	if err := setChain(m.Path("u.txt"), ""); err != nil {
		t.Fatal(err)
	}
	if r := reads("u.txt"); r != 0 {
		t.Errorf("after the pop: %d reads reached the stack", r)
	}
}

// TestModel: the fsx model over a chains mount whose files get chains of
// none, one and several links from the rules (and keep them through the
// model's renames), and random pushes and pops between their opens.
func TestModel(t *testing.T) {
	d, cdir := t.TempDir(), cryptDir(t)
	fs := stack(t, d, cdir, "fsx-1=zstd;fsx-2=lz4,crypt;fsx-3=copy,uuencode,gzip", nil)
	m := mounttest.Mount(t, fs)
	choices := []string{"", "zstd", "crypt", "gzip,crypt", "copy,zstd,lz4", "uuencode"}
	pushes := 0
	ops := 4000
	if os.Getenv("CAIRN_LONG") == "1" {
		ops = 40000
	}
	fsx.Run(t, fsx.Config{Dir: m.Dir, Files: 4, Ops: ops, MaxSize: 512 << 10, MaxLen: 32 << 10,
		Between: func(p string, r *rand.Rand) (string, error) {
			c := choices[r.IntN(len(choices))]
			pushes++
			if c == "" && r.IntN(2) == 0 {
				err := unix.Removexattr(p, chains.XattrName)
				if err == layer.ENOATTR {
					err = nil
				}
				return "removexattr", err
			}
			if err := setChain(p, c); err != nil {
				return "setfattr " + c, err
			}
			if got := getChain(t, p); got != c {
				return "setfattr " + c, fmt.Errorf("the chain is %q", got)
			}
			return "setfattr " + c, nil
		}})
	if pushes == 0 {
		t.Errorf("no push or pop was made")
	}
	t.Logf("%d pushes and pops", pushes)
}

// TestLinks: a transformation link is an empty file that presents a
// target's bytes through views: report.txt.gz reads as the gzip encoding
// of report.txt (and follows it when it changes), v.raw as the stored
// (encrypted) bytes of a guarded file. Links are read-only; bad links are
// refused.
func TestLinks(t *testing.T) {
	d, cdir := t.TempDir(), cryptDir(t)
	m := mounttest.Mount(t, stack(t, d, cdir, "secret/**=zstd,crypt", nil))
	os.Mkdir(m.Path("secret"), 0o755)
	report := data(100000)
	os.WriteFile(m.Path("report.txt"), report, 0o644)
	os.WriteFile(m.Path("secret", "v.txt"), report[:5000], 0o644)
	mk := func(p, v string) error {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
		return unix.Setxattr(p, chains.LinkXattr, []byte(v), 0)
	}
	gunzip := func(b []byte) []byte {
		t.Helper()
		z, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		out, err := io.ReadAll(z)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if err := mk(m.Path("report.txt.gz"), "report.txt:gzip"); err != nil {
		t.Fatal(err)
	}
	gz, err := os.ReadFile(m.Path("report.txt.gz"))
	if err != nil || !bytes.Equal(gunzip(gz), report) {
		t.Fatalf("report.txt.gz: %d bytes, %v", len(gz), err)
	}
	if st, _ := os.Stat(m.Path("report.txt.gz")); st.Size() != int64(len(gz)) {
		t.Errorf("stat of the link: %d, read %d", st.Size(), len(gz))
	}
	buf := make([]byte, 64)
	if n, err := unix.Getxattr(m.Path("report.txt.gz"), chains.LinkXattr, buf); err != nil || string(buf[:n]) != "report.txt:gzip" {
		t.Errorf("getfattr user.cairn.link: %q %v", buf[:n], err)
	}
	// The target changes: a new open shows the new view.
	report = append(report, "more"...)
	os.WriteFile(m.Path("report.txt"), report, 0o644)
	if gz, err := os.ReadFile(m.Path("report.txt.gz")); err != nil || !bytes.Equal(gunzip(gz), report) {
		t.Errorf("after the target changed: %v", err)
	}
	if err := os.WriteFile(m.Path("report.txt.gz"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("writing a link: %v, want EROFS", err)
	}
	// The stored bytes of an encrypted file, and their gzip.
	if err := mk(m.Path("v.raw"), "secret/v.txt:stored"); err != nil {
		t.Fatal(err)
	}
	stored, _ := os.ReadFile(filepath.Join(d, "secret", "v.txt"))
	if got, err := os.ReadFile(m.Path("v.raw")); err != nil || !bytes.Equal(got, stored) || !bytes.HasPrefix(got, []byte("cairnc")) {
		t.Errorf("v.raw: %d bytes, %v; want the %d stored bytes", len(got), err, len(stored))
	}
	if err := mk(m.Path("secret", "v.raw.gz"), "v.txt:stored,gzip"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(m.Path("secret", "v.raw.gz")); err != nil || !bytes.Equal(gunzip(got), stored) {
		t.Errorf("v.raw.gz: %v", err)
	}
	// Bad links.
	for v, want := range map[string]error{"report.txt:nope": unix.EINVAL, "report.txt:gzip,stored": unix.EINVAL, "../../etc/passwd:gzip": unix.EINVAL, "nocolon": unix.EINVAL} {
		if err := mk(m.Path("bad"), v); !errors.Is(err, want) {
			t.Errorf("link %q: %v, want %v", v, err, want)
		}
	}
	if err := unix.Setxattr(m.Path("report.txt"), chains.LinkXattr, []byte("x:gzip"), 0); err != unix.ENOTEMPTY {
		t.Errorf("a link on a file with data: %v, want ENOTEMPTY", err)
	}
	if err := mk(m.Path("loop.gz"), "report.txt.gz:gzip"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(m.Path("loop.gz")); !errors.Is(err, unix.ELOOP) {
		t.Errorf("a link to a link: %v, want ELOOP", err)
	}
	if err := setChain(m.Path("report.txt.gz"), "zstd"); err != unix.EPERM {
		t.Errorf("a chain on a link: %v, want EPERM", err)
	}
	// Removing the link leaves the empty file.
	if err := unix.Removexattr(m.Path("report.txt.gz"), chains.LinkXattr); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(m.Path("report.txt.gz")); err != nil || len(b) != 0 {
		t.Errorf("after removing the link: %d bytes, %v", len(b), err)
	}
}

// TestFsck: fsck reads every guarded file through its chain: a damaged
// one (a flipped byte of a crypt file) is reported, sound ones are not; an
// unfinished conversion is reported, and removed by a repair.
func TestFsck(t *testing.T) {
	ctx := context.Background()
	d, cdir := t.TempDir(), cryptDir(t)
	fs := stack(t, d, cdir, "*.log=zstd;*.sec=crypt", nil)
	for _, n := range []string{"a.log", "b.sec", "c.sec", "plain"} {
		if err := layer.WriteFile(ctx, fs, n, data(20000), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs.Close() // the transforms write out what they hold; the cleanup closes the rest
	b, _ := os.ReadFile(filepath.Join(d, "c.sec"))
	b[len(b)/2] ^= 1
	os.WriteFile(filepath.Join(d, "c.sec"), b, 0o644)
	// A stack cleans leftovers when it starts: this one is made first.
	fs = stack(t, d, cdir, "", nil)
	os.MkdirAll(filepath.Join(d, chains.TmpDir), 0o700)
	os.WriteFile(filepath.Join(d, chains.TmpDir, "12.0"), []byte("half"), 0o600)
	var bad []string
	sum, err := fs.Fsck(ctx, layer.CheckOnly, func(int, int, string) {}, func(r layer.FileReport) {
		if !r.OK {
			bad = append(bad, r.Path)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 2 || bad[0] != "c.sec" || bad[1] != chains.TmpDir+"/12.0" || sum.Bad != 2 {
		t.Fatalf("fsck: bad %q, summary %+v", bad, sum)
	}
	bad = nil
	if _, err := fs.Fsck(ctx, layer.Repair, func(int, int, string) {}, func(r layer.FileReport) {
		if !r.OK {
			bad = append(bad, r.Path)
		}
	}); err != nil || len(bad) != 1 {
		t.Fatalf("fsck --repair: bad %q, %v", bad, err)
	}
	if _, err := os.Stat(filepath.Join(d, chains.TmpDir, "12.0")); !os.IsNotExist(err) {
		t.Errorf("the leftover conversion is still there: %v", err)
	}
}

// TestCreateExisting: a create without O_EXCL that finds a file (a
// negative dentry the kernel kept, another process's create) opens the
// file with its own chain, whatever the rules would give a new one.
func TestCreateExisting(t *testing.T) {
	ctx := context.Background()
	fs := stack(t, t.TempDir(), "", "*.log=zstd", nil)
	if err := layer.WriteFile(ctx, fs, "a.log", data(5000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(ctx, "a.log", "a.txt", 0); err != nil {
		t.Fatal(err)
	}
	// mknod(2) of a regular file gets the rule's chain too.
	if _, err := fs.Mknod(ctx, "m.log", unix.S_IFREG|0o644, 0); err != nil {
		t.Fatal(err)
	}
	if f, err := fs.Open(ctx, "m.log", unix.O_WRONLY); err != nil {
		t.Fatal(err)
	} else {
		f.WriteAt(ctx, []byte("new bytes"), 0)
		f.Release(ctx)
	}
	for _, p := range []string{"a.txt", "m.log"} {
		f, _, err := fs.Create(ctx, p, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(ctx, []byte("new bytes"), 0); err != nil {
			t.Fatal(err)
		}
		f.Release(ctx)
		if got, err := layer.ReadFile(ctx, fs, p); err != nil || string(got) != "new bytes" {
			t.Fatalf("%s: %q, %v", p, got, err)
		}
		buf := make([]byte, 32)
		if n, err := fs.Getxattr(ctx, p, chains.XattrName, buf); err != nil || string(buf[:n]) != "zstd" {
			t.Fatalf("%s: chain %q, %v", p, buf[:n], err)
		}
	}
}

// TestCloseWritesEveryLink: what a file of a chain of several links holds
// is in its lower file once close(2) has returned, so that a daemon killed
// then (kill -9) loses nothing: a fresh stack over the same lower reads it.
// (The top link's flush used to write only into the link below, which kept
// it in memory for as long as the file stayed in the top link's cache.)
func TestCloseWritesEveryLink(t *testing.T) {
	d := t.TempDir()
	cdir := cryptDir(t)
	m := mounttest.Mount(t, stack(t, d, cdir, "*.zg=zstd,gzip;*.zc=zstd,crypt;*.zzz=zstd,zstd,zstd", nil))
	want := data(3000)
	for _, p := range []string{"a.zg", "a.zc", "a.zzz"} {
		if err := os.WriteFile(filepath.Join(m.Dir, p), want, 0o644); err != nil {
			t.Fatal(err)
		}
		fresh := stack(t, d, cdir, "", nil)
		if got, err := layer.ReadFile(context.Background(), fresh, p); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s (chain %s) after close, read by a fresh stack: %d bytes (%v), want %d", p, getChain(t, filepath.Join(m.Dir, p)), len(got), err, len(want))
		}
	}
}

// TestSecondStackLeavesConversion: a second stack over the lower of a
// mounted one (cairn fsck builds one, then finds the lower claimed and
// stops) leaves the mounted daemon's conversion under way alone: the
// temporary file is removed only by a stack that has claimed the lower.
// (New used to remove it, and the application's setfattr failed with
// ENOENT.) A leftover that Claim removes is reported by fsck.
func TestSecondStackLeavesConversion(t *testing.T) {
	ctx := context.Background()
	d := t.TempDir()
	slow, err := pathmatch.NewSet([]string{chains.TmpDir + "/**"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := local.New(d)
	if err != nil {
		t.Fatal(err)
	}
	fl := fault.New(l, fault.Rules{{Paths: slow, Names: []string{"fsync"}, Delay: time.Second}}, false, false)
	fs, err := chains.New(fl, chains.Options{})
	if err != nil {
		t.Fatal(err)
	}
	closeFS := sync.OnceFunc(func() { layer.CloseStack(fs) })
	t.Cleanup(closeFS)
	if err := fs.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	m := mounttest.Mount(t, fs)
	p := filepath.Join(m.Dir, "f")
	// Large enough that the conversion lasts (the fault layer does not
	// delay the stack's own fsync: layer.AsSelf): a 1 MiB file was
	// converted between two looks for its new file, now and then.
	want := data(32 << 20)
	if err := os.WriteFile(p, want, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- setChain(p, "zstd") }()
	// The conversion's new file is there (and being made durable).
	for i := 0; ; i++ {
		if ents, _ := os.ReadDir(filepath.Join(d, chains.TmpDir)); len(ents) > 0 {
			break
		}
		if i == 1000 {
			t.Fatal("no conversion under way")
		}
		time.Sleep(time.Millisecond)
	}
	second := stack(t, d, "", "", nil)
	if err := second.Claim(ctx); !errors.Is(err, layer.ErrInUse) {
		t.Fatalf("claim of a claimed lower: %v, want in use", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("conversion beside a second stack: %v", err)
	}
	if got := getChain(t, p); got != "zstd" {
		t.Errorf("chain %q after the conversion", got)
	}
	mustRead(t, p, want)

	// A leftover is removed by the stack that claims the lower, and fsck
	// says so.
	os.WriteFile(filepath.Join(d, chains.TmpDir, "12.0"), []byte("half"), 0o600)
	m.Unmount()
	closeFS()
	third := stack(t, d, "", "", nil)
	if err := third.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	var reports []string
	sum, err := third.Fsck(ctx, layer.CheckOnly, func(int, int, string) {}, func(r layer.FileReport) { reports = append(reports, r.Text) })
	if err != nil || !strings.Contains(sum.Line, "1 unfinished conversions") {
		t.Errorf("fsck after a claim that removed a leftover: %q, %v (%q)", sum.Line, err, reports)
	}
	if _, err := os.Stat(filepath.Join(d, chains.TmpDir, "12.0")); !os.IsNotExist(err) {
		t.Errorf("the leftover conversion is still there: %v", err)
	}
}

// TestLinkPermissions: a link shows its target only to a user who may read
// the target by its own path (search on its directories, read on it): the
// daemon reads the target, and the kernel checks only the link's own
// permissions, so a link used to show any user any file of the mount.
func TestLinkPermissions(t *testing.T) {
	m := mounttest.Mount(t, stack(t, t.TempDir(), "", "", nil))
	os.Chmod(m.Dir, 0o777)
	os.WriteFile(m.Path("secret"), []byte("TOP SECRET"), 0o600)
	os.Mkdir(m.Path("priv"), 0o700)
	os.WriteFile(m.Path("priv", "p"), []byte("PRIVATE"), 0o644)
	os.WriteFile(m.Path("open"), []byte("OPEN"), 0o644)
	u := mounttest.User{Uid: 65534, Gid: 65534}
	for _, tc := range []struct{ target, want string }{
		{"secret:stored", "Permission denied"},
		{"secret:gzip", "Permission denied"},
		{"priv/p:stored", "Permission denied"},
		{"open:stored", "OPEN"},
	} {
		out, _ := u.Sh(t, m.Dir, fmt.Sprintf(": > l && setfattr -n %s -v %s l && cat l 2>&1 | tr -d '\\0'; stat -c %%s l; rm -f l", chains.LinkXattr, tc.target))
		if !strings.Contains(out, tc.want) || strings.Contains(out, "SECRET") || strings.Contains(out, "PRIVATE") {
			t.Errorf("user 65534 reading a link to %s: %q, want %q", tc.target, out, tc.want)
		}
	}
	// Root reads every target.
	os.WriteFile(m.Path("l"), nil, 0o644)
	if err := setLinkX(m.Path("l"), "secret:stored"); err != nil {
		t.Fatal(err)
	}
	mustRead(t, m.Path("l"), []byte("TOP SECRET"))
}

func setLinkX(p, v string) error { return unix.Setxattr(p, chains.LinkXattr, []byte(v), 0) }

// TestDeepChains: a file converted between chains of 64 links (zstd and
// uuencode, then gzip) reads back the same. (A flush of the lower at each
// link's last release made such a conversion run for more than ten minutes
// at 100% CPU for a 100-byte file.)
func TestDeepChains(t *testing.T) {
	m := mounttest.Mount(t, stack(t, t.TempDir(), "", "", nil))
	p := m.Path("f")
	want := data(100)
	os.WriteFile(p, want, 0o644)
	for _, c := range []string{strings.Repeat("zstd,", 63) + "uuencode", strings.Repeat("gzip,", 63) + "gzip", ""} {
		if err := setChain(p, c); err != nil {
			t.Fatalf("setfattr %.20s...: %v", c, err)
		}
		mustRead(t, p, want)
	}
}
