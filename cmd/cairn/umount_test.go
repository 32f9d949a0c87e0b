package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
)

// TestUmountWaitsForTheDaemon: 'cairn umount' returns only once the
// background process has written out its data and exited, so that
// 'cairn fsck' run right after it finds the stack free and clean (it exited
// 5, "in use", when umount returned as soon as the kernel let go).
func TestUmountWaitsForTheDaemon(t *testing.T) {
	mounttest.Need(t)
	lower, mnt := t.TempDir(), t.TempDir()
	sp := filepath.Join(t.TempDir(), "zstd.toml")
	os.WriteFile(sp, []byte(fmt.Sprintf("mount = \"z\"\n[layer.base]\ntype = \"local\"\npath = %q\n[layer.z]\ntype = \"zstd\"\nover = \"base\"\n", lower)), 0o644)
	data := bytes.Repeat([]byte("cairn umount waits for the daemon\n"), 50000)
	for i := 0; i < 3; i++ {
		if out, code := cairn(t, "mount", sp, mnt); code != 0 {
			t.Fatalf("mount: exit %d: %s", code, out)
		}
		for j := 0; j < 4; j++ {
			name := filepath.Join(mnt, fmt.Sprintf("f%d-%d", i, j))
			if err := os.WriteFile(name, data[:len(data)-j*1000-i], 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if out, code := cairn(t, "umount", mnt); code != 0 {
			t.Fatalf("umount: exit %d: %s", code, out)
		}
		if out, code := cairn(t, "fsck", "-q", sp); code != 0 {
			t.Fatalf("round %d: fsck right after umount: exit %d: %s", i, code, out)
		}
	}
	// Everything written is there, through a new mount.
	if out, code := cairn(t, "mount", sp, mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	for i := 0; i < 3; i++ {
		for j := 0; j < 4; j++ {
			b, err := os.ReadFile(filepath.Join(mnt, fmt.Sprintf("f%d-%d", i, j)))
			if err != nil || !bytes.Equal(b, data[:len(data)-j*1000-i]) {
				t.Fatalf("f%d-%d: %d bytes, %v", i, j, len(b), err)
			}
		}
	}
	if out, code := cairn(t, "umount", mnt); code != 0 {
		t.Fatalf("umount: exit %d: %s", code, out)
	}
}

// TestUmountTimeout: a daemon that does not finish within the timeout (here
// it is stopped with SIGSTOP) makes umount say so, with its pid, and exit 1;
// the mount itself is gone. Once the daemon goes on, it exits.
func TestUmountTimeout(t *testing.T) {
	mounttest.Need(t)
	lower, mnt := t.TempDir(), t.TempDir()
	logf := filepath.Join(t.TempDir(), "log.json")
	if out, code := cairn(t, "mount", "--log-file", logf, writeSpec(t, lower), mnt); code != 0 {
		t.Fatalf("mount: exit %d: %s", code, out)
	}
	pid := daemonPid(t, logf)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	waitStopped(t, pid)
	start := time.Now()
	out, code := cairn(t, "umount", "-timeout", "500ms", mnt)
	want := fmt.Sprintf("unmounted, but the process that served it (pid %d) is still writing out its data after 500ms", pid)
	if code != exitFailed || !strings.Contains(out, want) {
		log, _ := os.ReadFile(logf)
		t.Fatalf("umount of a stopped daemon: exit %d after %v: %s\ndaemon log:\n%s", code, time.Since(start), out, log)
	}
	if isMounted(mnt) {
		t.Fatal("still mounted")
	}
	syscall.Kill(pid, syscall.SIGCONT)
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the daemon did not exit once continued")
		}
	}
}

// waitStopped waits until every thread of pid is stopped: kill(2) only
// sends the signal.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(tasks) > 0
		for _, task := range tasks {
			b, _ := os.ReadFile(task)
			// pid (comm) STATE ...: the state follows the last ")".
			if i := bytes.LastIndexByte(b, ')'); i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				stopped = false
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not stop", pid)
		}
	}
}

// daemonPid reads the pid of a background cairn mount from its JSON log.
func daemonPid(t *testing.T, logf string) int {
	t.Helper()
	b, _ := os.ReadFile(logf)
	for _, l := range strings.Split(string(b), "\n") {
		var rec struct {
			Msg string
			Pid int
		}
		if json.Unmarshal([]byte(l), &rec) == nil && rec.Msg == "mounted" && rec.Pid > 0 {
			return rec.Pid
		}
	}
	t.Fatalf("no pid in the log: %s", b)
	return 0
}

// TestAwaitReadyLongReport: a background process that fails with a report
// longer than a pipe holds (64 KiB), over several lines, is read to the end
// while it is waited for: the mount command prints the whole message and
// returns instead of waiting forever on a child blocked in write.
func TestAwaitReadyLongReport(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	// 200 KiB of lines on descriptor 3, then exit 1, as a daemon whose
	// layer failed with a long message does.
	cmd := exec.Command("sh", "-c", `{ printf 'mount: the layer failed:\n'; i=0; while [ $i -lt 4000 ]; do printf 'line %05d of the long message, padded to fifty bytes\n' $i; i=$((i+1)); done; printf 'the end\n'; } >&3; exit 1`)
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan int)
	stderr := captureStderr(t, func() { done <- awaitReady(cmd, r) })
	select {
	case code := <-done:
		out := stderr()
		if code != exitMount {
			t.Fatalf("exit %d, want %d", code, exitMount)
		}
		if !strings.HasPrefix(out, "cairn: the layer failed:\nline 00000") || !strings.Contains(out, "line 03999") || !strings.HasSuffix(out, "the end\n") || len(out) < 200000 {
			t.Fatalf("the message is not whole (%d bytes): %.200s ... %s", len(out), out, out[max(0, len(out)-200):])
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("awaitReady did not return: the pipe deadlocks")
	}
}

// captureStderr runs f in the background with os.Stderr sent to a pipe and
// returns a function that waits for f's output.
func captureStderr(t *testing.T, f func()) func() string {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	out := make(chan string)
	go func() {
		var b bytes.Buffer
		b.ReadFrom(r)
		out <- b.String()
	}()
	go func() {
		f()
		os.Stderr = old
		w.Close()
	}()
	return func() string { return <-out }
}
