//go:build linux

package crypt

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// The cairn command: init, mount (in the foreground and as a daemon, which
// gets the passphrase over a pipe), a wrong passphrase, a passphrase change,
// mounting by the master key, a missing configuration.

type cmdEnv struct {
	t     *testing.T
	bin   string
	dir   string // scratch
	lower string
}

func newCmdEnv(t *testing.T) *cmdEnv {
	mounttest.Need(t)
	e := &cmdEnv{t: t, bin: mounttest.Binary(t), dir: t.TempDir()}
	e.lower = filepath.Join(e.dir, "lower")
	os.Mkdir(e.lower, 0o755)
	return e
}

// spec writes a spec whose crypt layer reads its secret from a file holding
// secret, and returns its path.
func (e *cmdEnv) spec(name, secret, extra string) string {
	pf := filepath.Join(e.dir, name+".secret")
	if err := os.WriteFile(pf, []byte(secret+"\n"), 0o600); err != nil {
		e.t.Fatal(err)
	}
	sp := filepath.Join(e.dir, name+".toml")
	s := "mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = " + strconv.Quote(e.lower) +
		"\n[layer.top]\ntype = \"crypt\"\nover = \"base\"\npassfile = " + strconv.Quote(pf) + "\n" + extra
	if err := os.WriteFile(sp, []byte(s), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return sp
}

func (e *cmdEnv) run(args ...string) (string, int) {
	e.t.Helper()
	return mounttest.Run(e.t, args...)
}

func (e *cmdEnv) mountpoint() string {
	mp, err := os.MkdirTemp(e.dir, "mnt")
	if err != nil {
		e.t.Fatal(err)
	}
	return mp
}

func TestCommands(t *testing.T) {
	e := newCmdEnv(t)
	good := e.spec("good", "first passphrase", "")
	fast := []string{"--kdf", "scrypt", "--scrypt-n", "32768"}

	// A missing configuration says where it was expected.
	mp := e.mountpoint()
	out, code := e.run("mount", good, mp)
	if code == 0 || !strings.Contains(out, filepath.Join(e.lower, ConfigName)) || strings.Count(strings.TrimSpace(out), "\n") > 0 {
		t.Fatalf("mount without init: exit %d, %q", code, out)
	}

	out, code = e.run(append(append([]string{"init"}, fast...), "--print-master-key", good)...)
	if code != 0 {
		t.Fatalf("init: %d %s", code, out)
	}
	key := regexp.MustCompile(`[0-9a-f]{8}(-[0-9a-f]{8}){7}`).FindString(out)
	if key == "" {
		t.Fatalf("init printed no master key: %s", out)
	}
	if out, code := e.run(append(append([]string{"init"}, fast...), good)...); code == 0 || !strings.Contains(out, "holds a volume already") {
		t.Fatalf("second init: %d %s", code, out)
	}

	// As a daemon: the foreground process reads the passphrase and hands
	// it over.
	if out, code := e.run("mount", good, mp); code != 0 {
		t.Fatalf("mount: %d %s", code, out)
	}
	if err := os.WriteFile(filepath.Join(mp, "note"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := e.run("umount", mp); code != 0 {
		t.Fatalf("umount: %d %s", code, out)
	}
	waitUnmounted(t, mp)

	// A wrong passphrase: one line that says so, and nothing mounted.
	wrong := e.spec("wrong", "not the passphrase", "")
	out, code = e.run("mount", wrong, mp)
	if code == 0 || !strings.Contains(out, "wrong passphrase") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
		t.Fatalf("wrong passphrase: exit %d, %q", code, out)
	}
	if strings.Contains(out, "first passphrase") || strings.Contains(out, "not the passphrase") {
		t.Fatalf("a passphrase in a message: %q", out)
	}
	if isMounted(mp) {
		t.Fatal("mounted with a wrong passphrase")
	}
	// Exit 7 for a wrong passphrase, whichever command meets it.
	if code != 7 {
		t.Errorf("mount with a wrong passphrase: exit %d, want 7", code)
	}
	if out, code := e.run("mount", "-f", wrong, mp); code != 7 {
		t.Errorf("mount -f with a wrong passphrase: exit %d, want 7 (%s)", code, out)
	}
	if out, code := e.run("fsck", wrong); code != 7 {
		t.Errorf("fsck with a wrong passphrase: exit %d, want 7 (%s)", code, out)
	}
	if out, code := e.run("passwd", "--new-passfile", filepath.Join(e.dir, "good.secret"), wrong); code != 7 {
		t.Errorf("passwd with a wrong passphrase: exit %d, want 7 (%s)", code, out)
	}

	// A passphrase change: the old one stops working, the new one opens
	// the same data.
	newp := filepath.Join(e.dir, "new.secret")
	os.WriteFile(newp, []byte("second passphrase\n"), 0o600)
	if out, code := e.run(append(append([]string{"passwd"}, fast...), "--new-passfile", newp, good)...); code != 0 {
		t.Fatalf("passwd: %d %s", code, out)
	}
	if out, code := e.run("mount", good, mp); code == 0 || !strings.Contains(out, "wrong passphrase") {
		t.Fatalf("old passphrase after passwd: %d %s", code, out)
	}
	second := e.spec("second", "second passphrase", "")
	p := mounttest.MountSpec(t, mustRead(t, second))
	if b, err := os.ReadFile(p.Path("note")); err != nil || string(b) != "kept" {
		t.Fatalf("after passwd: %q %v", b, err)
	}
	p.Unmount()

	// The master key opens it too (and a wrong one does not).
	bykey := e.spec("bykey", key, "unlock = \"masterkey\"\n")
	p = mounttest.MountSpec(t, mustRead(t, bykey))
	if b, err := os.ReadFile(p.Path("note")); err != nil || string(b) != "kept" {
		t.Fatalf("by master key: %q %v", b, err)
	}
	p.Unmount()
	badkey := e.spec("badkey", strings.Replace(key, key[:1], string("0123456789abcdef"[(strings.IndexByte("0123456789abcdef", key[0])+1)%16]), 1), "unlock = \"masterkey\"\n")
	if out, code := e.run("mount", badkey, mp); code == 0 || !strings.Contains(out, "wrong master key") || strings.Contains(out, key[9:17]) {
		t.Fatalf("wrong master key: %d %q", code, out)
	}
	// passwd by the master key (recovery of a lost passphrase).
	third := filepath.Join(e.dir, "third.secret")
	os.WriteFile(third, []byte("third passphrase\n"), 0o600)
	if out, code := e.run(append(append([]string{"passwd"}, fast...), "--masterkey", "--new-passfile", third, bykey)...); code != 0 {
		t.Fatalf("passwd by master key: %d %s", code, out)
	}
	p = mounttest.MountSpec(t, mustRead(t, e.spec("third", "third passphrase", "")))
	if b, err := os.ReadFile(p.Path("note")); err != nil || string(b) != "kept" {
		t.Fatalf("after recovery: %q %v", b, err)
	}
	// The configuration is not visible through the mount.
	if ents, _ := os.ReadDir(p.Dir); len(ents) != 1 {
		t.Fatalf("the mount shows %v", ents)
	}
	p.Unmount()
}

func mustRead(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func isMounted(mp string) bool {
	b, _ := os.ReadFile("/proc/self/mounts")
	return strings.Contains(string(b), " "+mp+" ")
}

func waitUnmounted(t *testing.T, mp string) {
	for i := 0; i < 100 && isMounted(mp); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if isMounted(mp) {
		syscall.Unmount(mp, syscall.MNT_DETACH)
		t.Fatalf("%s still mounted", mp)
	}
}

// TestPasswdKeepsKDF: cairn passwd keeps the stored key-derivation settings
// unless a flag changes them, says so when a change makes them cheaper to
// attack, and init and passwd refuse out-of-range flags with the range.
func TestPasswdKeepsKDF(t *testing.T) {
	e := newCmdEnv(t)
	sp := e.spec("s", "first passphrase", "")
	cfgPath := filepath.Join(e.lower, ConfigName)
	kdf := func() KDF {
		var c Config
		if err := json.Unmarshal([]byte(mustRead(t, cfgPath)), &c); err != nil {
			t.Fatal(err)
		}
		return c.KDF
	}
	if out, code := e.run("init", "--argon2-threads", "260", sp); code != 2 || !strings.Contains(out, "--argon2-threads = 260 is out of range (allowed 1..64)") {
		t.Fatalf("init --argon2-threads 260: %d %s", code, out)
	}
	if out, code := e.run("init", "--kdf", "scrypt", "--scrypt-n", "1024", sp); code != 2 || !strings.Contains(out, "--scrypt-n = 1024 is out of range (allowed 32768..4194304)") {
		t.Fatalf("init --scrypt-n 1024: %d %s", code, out)
	}
	if out, code := e.run("init", "--argon2-time", "4", "--argon2-memory", "20MiB", "--argon2-threads", "2", sp); code != 0 {
		t.Fatalf("init: %d %s", code, out)
	}
	want := kdf()
	if want.Time != 4 || want.MemoryKiB != 20<<10 || want.Threads != 2 {
		t.Fatalf("init stored %+v", want)
	}
	second := filepath.Join(e.dir, "second")
	os.WriteFile(second, []byte("second passphrase\n"), 0o600)
	if out, code := e.run("passwd", "--new-passfile", second, sp); code != 0 || strings.Contains(out, "note") {
		t.Fatalf("passwd: %d %s", code, out)
	}
	if got := kdf(); got.Name != want.Name || got.Time != want.Time || got.MemoryKiB != want.MemoryKiB || got.Threads != want.Threads {
		t.Fatalf("passwd without KDF flags changed the settings: %+v -> %+v", want, got)
	}
	before := mustRead(t, cfgPath)
	if out, code := e.run("passwd", "--passfile", second, "--new-passfile", second, "--argon2-threads", "260", sp); code != 2 || !strings.Contains(out, "(allowed 1..64)") {
		t.Fatalf("passwd --argon2-threads 260: %d %s", code, out)
	}
	if mustRead(t, cfgPath) != before {
		t.Fatal("a refused passwd changed the configuration")
	}
	out, code := e.run("passwd", "--passfile", second, "--new-passfile", second, "--argon2-time", "2", sp)
	if code != 0 || !strings.Contains(out, "cheaper to attack") || !strings.Contains(out, "passes 4 -> 2") {
		t.Fatalf("passwd --argon2-time 2: %d %s", code, out)
	}
	if got := kdf(); got.Time != 2 || got.MemoryKiB != 20<<10 || got.Threads != 2 {
		t.Fatalf("passwd --argon2-time 2 stored %+v", got)
	}
}

// TestMountPassphraseFlags: cairn mount takes the passphrase from
// -passfile or -extpass (in place of the spec's), or from standard input
// when it is a pipe, as gocryptfs does; a wrong one is refused.
func TestMountPassphraseFlags(t *testing.T) {
	e := newCmdEnv(t)
	sp := e.spec("vol", "the passphrase", "")
	if out, code := e.run("init", "--kdf", "scrypt", "--scrypt-n", "32768", sp); code != 0 {
		t.Fatalf("init: %d %s", code, out)
	}
	// A spec that names no way to get the passphrase.
	bare := filepath.Join(e.dir, "bare.toml")
	os.WriteFile(bare, []byte("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = "+strconv.Quote(e.lower)+
		"\n[layer.top]\ntype = \"crypt\"\nover = \"base\"\n"), 0o644)
	pf := filepath.Join(e.dir, "other.secret")
	os.WriteFile(pf, []byte("the passphrase\n"), 0o600)
	mount := func(stdin string, args ...string) (string, int) {
		cmd := exec.Command(e.bin, append([]string{"mount"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	for _, c := range []struct {
		name  string
		stdin string
		args  []string
	}{
		{"passfile", "", []string{"-passfile", pf}},
		{"extpass", "", []string{"-extpass", "echo 'the passphrase'"}},
		{"stdin", "the passphrase\n", nil},
	} {
		mp := e.mountpoint()
		if out, code := mount(c.stdin, append(c.args, bare, mp)...); code != 0 {
			t.Fatalf("%s: mount: exit %d: %s", c.name, code, out)
		}
		os.WriteFile(filepath.Join(mp, c.name), []byte(c.name), 0o644)
		if b, err := os.ReadFile(filepath.Join(mp, c.name)); err != nil || string(b) != c.name {
			t.Errorf("%s: read back %q %v", c.name, b, err)
		}
		if out, code := e.run("umount", mp); code != 0 {
			t.Fatalf("umount: %d %s", code, out)
		}
	}
	mp := e.mountpoint()
	if out, code := mount("wrong\n", bare, mp); code == 0 || !strings.Contains(out, "passphrase") {
		t.Errorf("a wrong passphrase on standard input: exit %d, %q", code, out)
	}
	if out, code := mount("", "-passfile", pf, "-extpass", "true", bare, mp); code != 2 {
		t.Errorf("-passfile with -extpass: exit %d, %q, want 2", code, out)
	}
}
