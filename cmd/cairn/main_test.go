package main

import (
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

func isMounted(dir string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	return strings.Contains(string(b), " "+dir+" ")
}

func writeSpec(t *testing.T, lower string) string {
	p := filepath.Join(t.TempDir(), "s.toml")
	os.WriteFile(p, []byte("mount = \"top\"\n[layer.base]\ntype = \"local\"\npath = \""+lower+"\"\n[layer.top]\ntype = \"null\"\nover = \"base\"\n"), 0o644)
	return p
}

func cairn(t *testing.T, args ...string) (string, int) {
	t.Helper()
	return mounttest.Run(t, args...)
}

func TestMountDaemonAndUmount(t *testing.T) {
	mounttest.Need(t)
	lower, mnt := t.TempDir(), t.TempDir()
	logf := filepath.Join(t.TempDir(), "log.json")
	if out, code := cairn(t, "mount", "--log-file", logf, writeSpec(t, lower), mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	// It returned: the mount must be ready now.
	if !isMounted(mnt) {
		t.Fatal("cairn mount returned before the mount was ready")
	}
	os.WriteFile(filepath.Join(mnt, "x"), []byte("through"), 0o644)
	if b, _ := os.ReadFile(filepath.Join(lower, "x")); string(b) != "through" {
		t.Fatal("file not in the lower directory")
	}
	// The daemon logs in JSON to the file, with its pid.
	b, _ := os.ReadFile(logf)
	var rec struct {
		Msg         string
		Pid         int
		Passthrough bool
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		json.Unmarshal([]byte(l), &rec)
		if rec.Msg == "mounted" {
			break
		}
	}
	if rec.Msg != "mounted" || rec.Pid == 0 || !rec.Passthrough {
		t.Fatalf("log: %s", b)
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
	if isMounted(mnt) {
		t.Fatal("still mounted")
	}
	deadline := time.Now().Add(20 * time.Second)
	for syscall.Kill(rec.Pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the daemon did not exit after umount")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out, code := cairn(t, "umount", mnt); code != 1 || !strings.Contains(out, "nothing is mounted") {
		t.Fatalf("second umount: exit %d: %s", code, out)
	}
}

func TestSignalUnmounts(t *testing.T) {
	mounttest.Need(t)
	lower, mnt := t.TempDir(), t.TempDir()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(mounttest.Binary(t), "mount", "-f", writeSpec(t, lower), mnt)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); !isMounted(mnt); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatal("not mounted")
			}
		}
		cmd.Process.Signal(sig)
		done := make(chan error)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%v: exit %v", sig, err)
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v did not unmount", sig)
		}
		if isMounted(mnt) {
			t.Fatalf("still mounted after %v", sig)
		}
	}
}

func TestMountErrors(t *testing.T) {
	lower := t.TempDir()
	inside := filepath.Join(lower, "mnt")
	os.Mkdir(inside, 0o755)
	out, code := cairn(t, "mount", writeSpec(t, lower), inside)
	// Caught before anything is mounted, as a spec error with its position.
	if (code != exitSpec && code != exitMount) || !strings.Contains(out, "is inside the") {
		t.Fatalf("mountpoint inside the lower: exit %d: %s", code, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	os.WriteFile(bad, []byte("mount = \"top\"\n[layer.top]\ntype = \"nul\"\n"), 0o644)
	if out, code := cairn(t, "mount", bad, t.TempDir()); code != exitSpec || !strings.Contains(out, "nul") {
		t.Fatalf("bad spec: exit %d: %s", code, out)
	}
	if out, code := cairn(t, "mount", "/nonexistent.toml", t.TempDir()); code != exitSpec || !strings.Contains(out, "does not exist") {
		t.Fatalf("missing spec: exit %d: %s", code, out)
	}
	if _, code := cairn(t, "mount", "only-one-arg"); code != exitUsage {
		t.Fatalf("usage: exit %d", code)
	}
	if out, code := cairn(t, "--help"); code != 0 || !strings.Contains(out, "umount") || !strings.Contains(out, "Exit codes") {
		t.Fatalf("help: %d %s", code, out)
	}
}

func TestFlagsAnywhere(t *testing.T) {
	fl := flag.NewFlagSet("x", flag.ContinueOnError)
	a := fl.Bool("a", false, "")
	s := fl.String("s", "", "")
	if err := parseFlags(fl, []string{"one", "-a", "two", "-s", "v", "--", "-three"}); err != nil {
		t.Fatal(err)
	}
	if !*a || *s != "v" || strings.Join(fl.Args(), " ") != "one two -three" {
		t.Fatalf("a=%v s=%q args=%q", *a, *s, fl.Args())
	}
}
