package fault_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/fault"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/pathmatch"
	"cairnfs.dev/cairn/spec"
)

func set(t *testing.T, pats ...string) *pathmatch.Set {
	s, err := pathmatch.NewSet(pats, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mount(t *testing.T, rules fault.Rules, reload bool) (*fault.FS, *mounttest.Mounted, string) {
	lower := t.TempDir()
	for _, d := range []string{"bad", "ok"} {
		os.Mkdir(filepath.Join(lower, d), 0o755)
	}
	for _, f := range []string{"bad/f", "ok/f", "ok/short", "ok/after", "ok/hang", "ok/slow"} {
		os.WriteFile(filepath.Join(lower, f), []byte("0123456789"), 0o644)
	}
	l, err := local.New(lower)
	if err != nil {
		t.Fatal(err)
	}
	fs := fault.New(l, rules, reload, true)
	return fs, mounttest.Mount(t, fs), lower
}

// TestFaultRules: each kind of fault, through a mount, on the paths and
// operations its rule names and nowhere else.
func TestFaultRules(t *testing.T) {
	fs, m, lower := mount(t, fault.Rules{
		{Paths: set(t, "bad/**"), Ops: layer.ClassRead, Errno: syscall.EIO},
		{Paths: set(t, "ok/short"), Names: []string{"write", "read"}, Short: 3},
		{Paths: set(t, "ok/after"), Names: []string{"open"}, After: 2, Errno: syscall.EROFS},
		{Paths: set(t, "ok/hang"), Names: []string{"open"}, Hang: 100 * time.Millisecond, Errno: syscall.ETIMEDOUT},
		{Paths: set(t, "ok/slow"), Names: []string{"open"}, Delay: 10 * time.Millisecond},
		{Paths: set(t, "gone"), Ops: layer.ClassCreate, Errno: syscall.ENOSPC},
	}, false)
	if _, err := os.ReadFile(m.Path("bad/f")); !errors.Is(err, syscall.EIO) {
		t.Errorf("reading bad/f: %v, want EIO", err)
	}
	if _, err := os.Stat(m.Path("bad/f")); err != nil {
		t.Errorf("stat of bad/f (no read): %v", err)
	}
	if b, err := os.ReadFile(m.Path("ok/f")); err != nil || string(b) != "0123456789" {
		t.Errorf("reading ok/f: %q %v", b, err)
	}
	fd, err := unix.Open(m.Path("ok/short"), unix.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Pwrite(fd, []byte("abcdefgh"), 0); n != 3 || err != nil {
		t.Errorf("write of 8 bytes to ok/short: %d %v, want a short write of 3", n, err)
	}
	unix.Close(fd)
	if b, _ := os.ReadFile(filepath.Join(lower, "ok/short")); string(b) != "abc3456789" {
		t.Errorf("ok/short below: %q", b)
	}
	for i := 0; i < 3; i++ {
		f, err := os.Open(m.Path("ok/after"))
		if i < 2 && err != nil || i == 2 && !errors.Is(err, syscall.EROFS) {
			t.Errorf("open %d of ok/after: %v (the rule fires after 2)", i+1, err)
		}
		if f != nil {
			f.Close()
		}
	}
	if _, err := os.Open(m.Path("ok/hang")); !errors.Is(err, syscall.ETIMEDOUT) {
		t.Errorf("open of ok/hang: %v, want ETIMEDOUT after the hang", err)
	}
	if b, err := os.ReadFile(m.Path("ok/slow")); err != nil || string(b) != "0123456789" {
		t.Errorf("reading ok/slow (delayed): %q %v", b, err)
	}
	if err := os.WriteFile(m.Path("gone"), nil, 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("creating gone: %v, want ENOSPC", err)
	}
	if fs.Fired() == 0 {
		t.Error("no fault counted")
	}
}

// TestFaultPassthrough: a layer whose rules never touch reads and writes
// keeps its files passed through; one whose rules do, or whose rules may
// change, does not.
func TestFaultPassthrough(t *testing.T) {
	l, err := local.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := layer.WriteFile(t.Context(), l, "f", []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rules  fault.Rules
		reload bool
		pass   bool
	}{
		{fault.Rules{{Names: []string{"open"}, Errno: syscall.EIO}}, false, true},
		{fault.Rules{{Ops: layer.ClassCreate | layer.ClassDelete}}, false, true},
		{fault.Rules{{Ops: layer.ClassRead}}, false, false},
		{fault.Rules{{Names: []string{"write"}, Short: 1}}, false, false},
		{fault.Rules{{}}, false, false},
		{nil, true, false},
	} {
		f, err := fault.New(l, c.rules, c.reload, false).Open(t.Context(), "f", os.O_RDONLY)
		if err == nil {
			if got := f.Caps()&layer.CapPassthrough != 0; got != c.pass {
				t.Errorf("rules %+v reload %v: passthrough %v, want %v", c.rules[0], c.reload, got, c.pass)
			}
			f.Release(t.Context())
		}
	}
}

// TestFaultReload: a mounted fault layer with reload = true takes new rules
// on SIGHUP; one without keeps its own.
func TestFaultReload(t *testing.T) {
	mounttest.NeedRoot(t)
	lower := t.TempDir()
	os.WriteFile(filepath.Join(lower, "f"), []byte("data"), 0o644)
	specOf := func(errno string) string {
		return `mount = "f"
[layer.f]
type = "fault"
over = "base"
reload = true
[[rule]]
layer = "f"
match = "f"
ops = ["read"]
errno = "` + errno + `"
[layer.base]
type = "local"
path = "` + lower + `"
`
	}
	p := mounttest.MountSpec(t, specOf("EIO"))
	if _, err := os.ReadFile(p.Path("f")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read before the reload: %v, want EIO", err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(p.Dir), "spec.toml"), []byte(specOf("EACCES")), 0o644); err != nil {
		t.Fatal(err)
	}
	p.Cmd.Process.Signal(syscall.SIGHUP)
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := os.ReadFile(p.Path("f"))
		if errors.Is(err, syscall.EACCES) {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(p.Log)
			t.Fatalf("read after the reload: %v, want EACCES\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFaultCheck: what the layer would refuse, cairn check refuses at the
// value.
func TestFaultCheck(t *testing.T) {
	dir := t.TempDir()
	text := `mount = "f"
[layer.b]
type = "local"
path = "` + dir + `"
[layer.f]
type = "fault"
over = "b"
[[rule]]
layer = "f"
match = "**"
ops = ["reed"]
errno = "EFOO"
probability = "1.5"
after = -1
hang = "soon"
delay = "-1s"
`
	_, err := spec.Parse("fault.toml", []byte(text))
	if err == nil {
		t.Fatal("the check accepted bad rules")
	}
	got := spec.Detail(err)
	for _, want := range []string{
		`fault.toml:11:7: rule for layer "f": option "ops": unknown operation or class "reed"`,
		`fault.toml:12:9: rule for layer "f": option "errno": unknown errno "EFOO"`,
		`fault.toml:13:15: rule for layer "f": option "probability": a probability is a number above 0`,
		`fault.toml:14:9: rule for layer "f": option "after": after must be 0 or more`,
		`fault.toml:15:8: rule for layer "f": option "hang" must be a duration`,
		`fault.toml:16:9: rule for layer "f": option "delay": a duration of 0 or more, found -1s`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	good := strings.NewReplacer("reed", "read", "EFOO", "ENOSPC", "1.5", "50%", "-1", "3", "soon", "1s", "-1s", "1ms").Replace(text)
	if _, err := spec.Parse("fault.toml", []byte(good)); err != nil {
		t.Errorf("good spec: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"EIO", "5", "0.5", "5%", "read", "getattr", "", "1e400", "NaN%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := fault.ParseProbability(s); err == nil && (p <= 0 || p > 1) {
			t.Errorf("probability %q read as %v", s, p)
		}
		if e, err := fault.ParseErrno(s); err == nil && (e <= 0 || e >= 4096) {
			t.Errorf("errno %q read as %d", s, e)
		}
		if k, n, err := fault.ParseOp(s); err == nil && (k == 0) == (n == "") {
			t.Errorf("op %q read as class %v, name %q", s, k, n)
		}
	})
}

// TestExplainSaysWhatTheMountDoes: what cairn explain says of kernel
// passthrough for a fault layer is what its mount does: a rule that can
// fire on reads and writes (no ops: every operation), or reload = true,
// keeps every file of the layer from the kernel, whatever path the rule
// matches; a rule for other operations keeps passthrough. Counted under
// the layer, through a mount.
func TestExplainSaysWhatTheMountDoes(t *testing.T) {
	for _, c := range []struct {
		name, opts, rule, want string
		through                bool // reads reach the layer
	}{
		{"no ops", "", "match = \"other/**\"\n", "kernel passthrough: no: layer \"f\" (fault) keeps its files from the kernel: rule 1 at fault.toml:10:3 can fire on reads and writes", true},
		{"read class", "", "match = \"other/**\"\nops = [\"read\"]\nerrno = \"EIO\"\n", "kernel passthrough: no:", true},
		{"write op", "", "match = \"**\"\nops = [\"write\"]\nprobability = \"1%\"\n", "kernel passthrough: no:", true},
		{"create only", "", "match = \"**\"\nops = [\"create\"]\nerrno = \"ENOSPC\"\n", "kernel passthrough: yes", false},
		{"reload", "reload = true\n", "match = \"**\"\nops = [\"create\"]\n", "kernel passthrough: no: layer \"f\" (fault) keeps its files from the kernel: reload = true", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			lower := t.TempDir()
			data := []byte(strings.Repeat("cairn ", 10000))
			if err := os.WriteFile(filepath.Join(lower, "f"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			text := fmt.Sprintf("mount = \"f\"\n\n[layer.f]\ntype = \"fault\"\nover = [\"l\"]\n%s\n[layer.l]\ntype = \"local\"\npath = %q\n\n", c.opts, lower)
			if c.opts == "" {
				text = strings.Replace(text, "over = [\"l\"]\n\n", "over = [\"l\"]\n", 1)
			}
			text += "[[rule]]\nlayer = \"f\"\n" + c.rule
			s, err := spec.Parse("fault.toml", []byte(text))
			if err != nil {
				t.Fatalf("%v\n%s", spec.Detail(err), text)
			}
			var b strings.Builder
			s.Explain(&b)
			if !strings.Contains(b.String(), c.want) {
				t.Errorf("explain does not say %q:\n%s", c.want, b.String())
			}
			st, err := s.Build()
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			fs := st.Top.(*fault.FS)
			counter := mounttest.CountIO(fs.Lower)
			fs.Lower = counter
			m := mounttest.Mount(t, fs)
			if got, err := os.ReadFile(m.Path("f")); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read: %d bytes, %v", len(got), err)
			}
			if n := counter.Reads.Load(); (n > 0) != c.through {
				t.Errorf("%d reads reached the layer; explain says %q", n, c.want)
			}
		})
	}
}
