package mounttest

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var build struct {
	once sync.Once
	bin  string
	err  error
	out  []byte
}

// Binary builds the cairn command once per test process and returns its
// path.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		dir, err := os.MkdirTemp("", "cairn-bin-")
		if err != nil {
			build.err = err
			return
		}
		build.bin = filepath.Join(dir, "cairn")
		// Background mounts without syslog log to a file per mountpoint;
		// the tests' mountpoints are temporary, so are their logs.
		if os.Getenv("CAIRN_LOG_DIR") == "" {
			os.Setenv("CAIRN_LOG_DIR", filepath.Join(dir, "log"))
		}
		cmd := exec.Command("go", "build", "-o", build.bin, "cairnfs.dev/cairn/cmd/cairn")
		build.out, build.err = cmd.CombinedOutput()
	})
	if build.err != nil {
		t.Fatalf("building cairn: %v\n%s", build.err, build.out)
	}
	return build.bin
}

// Process is a stack mounted by a `cairn mount -f` process: the way to test
// what needs the server in another process (mmap of files that are not
// passed through, which can deadlock a Go program that serves its own page
// faults; crashes with kill -9).
type Process struct {
	Dir  string // the mountpoint
	Cmd  *exec.Cmd
	Log  string // the daemon's standard error
	t    testing.TB
	done bool
	// Nofile, if set, is the daemon's limit of open descriptors (ulimit -n).
	nofile int
}

// MountSpec writes spec to a file and mounts it with `cairn mount -f` in a
// child process, returning once the mount is ready. Extra arguments go to
// cairn mount before the spec. The mount is removed when the test ends.
func MountSpec(t testing.TB, spec string, extra ...string) *Process {
	t.Helper()
	return MountSpecNofile(t, spec, 0, extra...)
}

// MountSpecNofile is MountSpec with the daemon's limit of open descriptors
// (soft and hard) set to nofile, if not 0.
func MountSpecNofile(t testing.TB, spec string, nofile int, extra ...string) *Process {
	t.Helper()
	Need(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	sp := filepath.Join(dir, "spec.toml")
	if err := os.WriteFile(sp, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &Process{Dir: mnt, Log: filepath.Join(dir, "cairn.log"), t: t, nofile: nofile}
	p.start(sp, extra)
	t.Cleanup(p.Unmount)
	return p
}

// Restart mounts the same spec again after a crash or an unmount.
func (p *Process) Restart() {
	p.t.Helper()
	p.done = false
	p.start(filepath.Join(filepath.Dir(p.Dir), "spec.toml"), nil)
}

func (p *Process) start(spec string, extra []string) {
	t := p.t
	t.Helper()
	logf, err := os.OpenFile(p.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"mount", "-f", "--allow-other"}, extra...)
	args = append(args, spec, p.Dir)
	cmd := exec.Command(Binary(t), args...)
	if p.nofile > 0 {
		cmd = exec.Command("sh", append([]string{"-c", `ulimit -n "$0" && exec "$@"`, strconv.Itoa(p.nofile), Binary(t)}, args...)...)
	}
	cmd.Env = append(os.Environ(), "CAIRN_DAEMON_READY_FD=3")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	r.Close()
	if strings.TrimSpace(line) != "ok" {
		cmd.Process.Kill()
		cmd.Wait()
		log, _ := os.ReadFile(p.Log)
		t.Fatalf("cairn mount failed: %s\n%s", strings.TrimSpace(line), log)
	}
	p.Cmd = cmd
}

// Kill kills the daemon with SIGKILL (a crash) and clears the dead mount.
func (p *Process) Kill() {
	p.Cmd.Process.Signal(syscall.SIGKILL)
	p.Cmd.Wait()
	syscall.Unmount(p.Dir, mntDetach)
	p.done = true
}

// Unmount unmounts and waits for the daemon to exit (idempotent).
func (p *Process) Unmount() {
	if p.done {
		return
	}
	p.done = true
	var err error
	for i := 0; i < 50; i++ {
		if err = syscall.Unmount(p.Dir, 0); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		p.t.Errorf("unmount %s: %v", p.Dir, err)
		syscall.Unmount(p.Dir, mntDetach)
	}
	ch := make(chan error, 1)
	go func() { ch <- p.Cmd.Wait() }()
	select {
	case err := <-ch:
		if err != nil {
			log, _ := os.ReadFile(p.Log)
			p.t.Errorf("cairn exited with %v after unmount\n%s", err, log)
		}
	case <-time.After(10 * time.Second):
		p.Cmd.Process.Kill()
		p.t.Errorf("cairn did not exit after unmount")
	}
}

// Path joins names under the mountpoint.
func (p *Process) Path(names ...string) string {
	return p.Dir + "/" + strings.Join(names, "/")
}

// Run runs the cairn command (see Binary) with args and returns its
// combined output and exit code; a command that cannot start fails t.
func Run(t testing.TB, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(Binary(t), args...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}
