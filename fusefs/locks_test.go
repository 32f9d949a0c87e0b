//go:build linux

package fusefs_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"cairnfs.dev/cairn/internal/mounttest"
	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/layers/codec"
	"cairnfs.dev/cairn/layers/local"
	"cairnfs.dev/cairn/layers/null"
)

// The lock tests run testdata/lockhelper.c as separate processes: the same
// script of lock calls on a plain directory of the root file system (ext4,
// the oracle) and through a mount of each stack, and the two transcripts
// must be equal.

var lockHelper struct {
	once sync.Once
	bin  string
	err  error
}

// helperBinary compiles testdata/lockhelper.c once per test process.
func helperBinary(t *testing.T) string {
	t.Helper()
	lockHelper.once.Do(func() {
		cc, err := exec.LookPath("cc")
		if err != nil {
			lockHelper.err = fmt.Errorf("no C compiler (setup.sh installs gcc): %v", err)
			return
		}
		dir, err := os.MkdirTemp("", "cairn-lockhelper-")
		if err != nil {
			lockHelper.err = err
			return
		}
		os.Chmod(dir, 0o755) // the helper runs as another user too
		lockHelper.bin = filepath.Join(dir, "lockhelper")
		out, err := exec.Command(cc, "-O", "-Wall", "-o", lockHelper.bin, "testdata/lockhelper.c").CombinedOutput()
		if err != nil {
			lockHelper.err = fmt.Errorf("compiling lockhelper: %v\n%s", err, out)
		}
	})
	if lockHelper.err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(lockHelper.err)
		}
		t.Skip(lockHelper.err)
	}
	return lockHelper.bin
}

// lockProc is one running helper process.
type lockProc struct {
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  chan string
	pid  string
}

// lockRun drives the helpers of one scenario on one directory and records
// what they answer, with the directory and the pids replaced by names.
type lockRun struct {
	t     *testing.T
	dir   string
	procs map[string]*lockProc
	log   []string
}

// waitReply is how long a command may take; blocked is how long a blocking
// command must stay blocked to count as waiting.
const (
	waitReply = 10 * time.Second
	blocked   = 300 * time.Millisecond
)

func (r *lockRun) proc(name string) *lockProc {
	if p := r.procs[name]; p != nil {
		return p
	}
	t := r.t
	var cmd *exec.Cmd
	if name == "N" { // a process of another user
		cmd = mounttest.User{Uid: 65534, Gid: 65534}.Command(helperBinary(t))
	} else {
		cmd = exec.Command(helperBinary(t))
	}
	cmd.Dir = "/"
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &lockProc{name: name, cmd: cmd, in: in, out: make(chan string, 16)}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			p.out <- s.Text()
		}
		close(p.out)
	}()
	t.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	r.procs[name] = p
	p.pid = strings.TrimPrefix(r.send(p, "pid"), "pid ")
	return p
}

func (r *lockRun) send(p *lockProc, cmd string) string {
	r.t.Helper()
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		r.t.Fatalf("%s: %v", p.name, err)
	}
	return r.reply(p, cmd, waitReply)
}

func (r *lockRun) reply(p *lockProc, cmd string, d time.Duration) string {
	r.t.Helper()
	select {
	case s, ok := <-p.out:
		if !ok {
			r.t.Fatalf("%s: helper died during %q", p.name, cmd)
		}
		return s
	case <-time.After(d):
		return ""
	}
}

// name replaces the directory and the helpers' pids in a command or answer.
func (r *lockRun) name(s string) string {
	s = strings.ReplaceAll(s, r.dir, "$D")
	f := strings.Fields(s)
	for i := 1; i < len(f); i++ {
		if f[i-1] == "pid" {
			for n, p := range r.procs {
				if f[i] == p.pid {
					f[i] = n
				}
			}
		}
	}
	return strings.Join(f, " ")
}

// do runs cmd in process name and records the answer.
func (r *lockRun) do(name, cmd string) {
	r.t.Helper()
	p := r.proc(name)
	cmd = strings.ReplaceAll(cmd, "$D", r.dir)
	got := r.send(p, cmd)
	if got == "" {
		got = "(no answer: hung)"
	}
	r.log = append(r.log, name+": "+r.name(cmd)+" -> "+r.name(got))
}

// start sends a command that is expected to block and records whether it
// did (no answer within blocked) or what it answered at once.
func (r *lockRun) start(name, cmd string) {
	r.t.Helper()
	p := r.proc(name)
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		r.t.Fatal(err)
	}
	got := r.reply(p, cmd, blocked)
	if got == "" {
		got = "(waiting)"
	}
	r.log = append(r.log, name+": "+cmd+" -> "+r.name(got))
}

// finish records the answer of the command that start left waiting.
func (r *lockRun) finish(name string) {
	r.t.Helper()
	got := r.reply(r.proc(name), "finish", waitReply)
	if got == "" {
		got = "(still waiting)"
	}
	r.log = append(r.log, name+": ... -> "+r.name(got))
}

// A lock scenario: the file $D/f exists (mode 0666, 16 bytes) and every
// process opens it itself.
type lockScenario struct {
	name string
	run  func(r *lockRun)
	want []string // lines the ext4 transcript must contain (the test's own check of the oracle)
}

var lockScenarios = []lockScenario{
	{"posix_whole_file", func(r *lockRun) {
		r.do("A", "open a $D/f")
		r.do("N", "open n $D/f")
		r.do("A", "setlk a w 0 0") // l_len = 0: to the end of the file
		r.do("N", "setlk n r 100 1")
		r.do("N", "getlk n r 1000000 0")
		r.do("N", "lockf n tlock 0")
		r.do("A", "lockf a ulock 0")
		r.do("N", "lockf n tlock 0")
		r.do("A", "getlk a w 0 1")
		r.do("A", "setlk a r 0 0")
	}, []string{"A: setlk a w 0 0 -> ok", "N: setlk n r 100 1 -> err EAGAIN", "N: getlk n r 1000000 0 -> w 0 0 pid A", "N: lockf n tlock 0 -> ok"}},

	{"posix_two_descriptors", func(r *lockRun) {
		r.do("A", "open a $D/f")
		r.do("A", "open b $D/f")
		r.do("A", "setlk a w 0 10")
		r.do("A", "setlk b w 5 10") // the same process: granted, and merged
		r.do("A", "getlk b w 0 20")
		r.do("B", "open c $D/f")
		r.do("B", "getlk c r 0 100")
		r.do("B", "setlk c r 14 1")
		r.do("A", "close b") // any close of the file releases the process's locks
		r.do("B", "getlk c w 0 0")
		r.do("B", "setlk c w 0 0")
		r.do("A", "getlk a r 3 1")
	}, []string{"A: setlk b w 5 10 -> ok", "A: getlk b w 0 20 -> unlck", "B: getlk c r 0 100 -> w 0 15 pid A", "B: getlk c w 0 0 -> unlck", "A: getlk a r 3 1 -> w 0 0 pid B"}},

	{"posix_ranges", func(r *lockRun) {
		r.do("A", "open a $D/f")
		r.do("B", "open b $D/f")
		r.do("A", "setlk a w 0 100")
		r.do("A", "setlk a u 40 20") // split
		r.do("B", "getlk b w 0 0")
		r.do("B", "getlk b w 40 20")
		r.do("B", "getlk b w 50 0")
		r.do("A", "setlk a r 40 20")
		r.do("B", "getlk b w 40 5")
		r.do("B", "setlk b r 40 5")
		r.do("A", "setlk a w 40 20") // upgrade refused: B reads 40-44
		r.do("B", "setlk b u 0 0")
		r.do("A", "setlk a w 40 20") // merged into 0-99 again
		r.do("B", "getlk b r 0 0")
		r.do("B", "getlk b r 99 1")
		r.do("A", "setlk a r 200 0")
		r.do("B", "getlk b r 300 10")
		r.do("B", "getlk b w 300 10")
		r.do("B", "setlk b r 1000 10")
	}, []string{"B: getlk b w 40 20 -> unlck", "B: getlk b w 50 0 -> w 60 40 pid A", "A: setlk a w 40 20 -> err EAGAIN", "B: getlk b r 0 0 -> w 0 100 pid A", "B: getlk b w 300 10 -> r 200 0 pid A"}},

	{"ofd", func(r *lockRun) {
		r.do("A", "open a $D/f")
		r.do("A", "open b $D/f")
		r.do("A", "ofdsetlk a w 0 10")
		r.do("A", "ofdsetlk b w 0 10") // another description of the same process: refused
		r.do("A", "ofdgetlk b r 0 0")
		r.do("A", "setlk b r 5 1") // POSIX and OFD locks conflict
		r.do("A", "getlk b r 5 1")
		r.do("A", "dup a c")
		r.do("A", "close c") // the description stays open: the lock stays
		r.do("A", "ofdsetlk b w 0 10")
		r.do("N", "open n $D/f")
		r.do("N", "ofdgetlk n w 0 0")
		r.do("A", "close a") // its last descriptor: released
		r.do("A", "ofdsetlk b w 0 10")
		r.do("N", "setlk n r 0 1")
		r.do("A", "ofdsetlk b u 0 0")
		r.do("N", "setlk n r 0 1")
	}, []string{"A: ofdsetlk b w 0 10 -> err EAGAIN", "A: ofdgetlk b r 0 0 -> w 0 10 pid -1", "A: setlk b r 5 1 -> err EAGAIN", "A: ofdsetlk b w 0 10 -> ok", "N: setlk n r 0 1 -> ok"}},

	{"flock", func(r *lockRun) {
		r.do("A", "open a $D/f")
		r.do("A", "open b $D/f")
		r.do("A", "flock a exnb")
		r.do("A", "flock b shnb") // another description: conflicts
		r.do("N", "open n $D/f")
		r.do("N", "flock n shnb")
		r.do("A", "setlk b w 0 0") // flock and POSIX locks are independent
		r.do("A", "flock a sh")    // downgrade
		r.do("N", "flock n shnb")
		r.do("A", "flock b exnb")
		r.do("A", "dup a c")
		r.do("A", "close a")
		r.do("N", "flock n un")
		r.do("A", "flock b exnb") // c still holds the shared lock
		r.do("A", "close c")
		r.do("A", "flock b exnb")
	}, []string{"A: flock b shnb -> err EAGAIN", "N: flock n shnb -> ok", "A: setlk b w 0 0 -> ok", "A: flock b exnb -> ok"}},

	{"blocking", func(r *lockRun) {
		r.do("A", "open a $D/f")
		r.do("B", "open b $D/f")
		r.do("A", "setlk a w 0 10")
		r.start("B", "setlkw b w 5 1")
		r.do("A", "setlk a u 0 10")
		r.finish("B")
		// A deadlock: A holds 0-9 and waits for 20-29, which B holds.
		r.do("B", "setlk b u 0 0")
		r.do("A", "setlk a w 0 10")
		r.do("B", "setlk b w 20 10")
		r.start("A", "setlkw a w 20 10")
		r.do("B", "setlkw b w 0 10")
		r.do("B", "close b")
		r.finish("A")
		// OFD and flock waits.
		r.do("B", "open b $D/f")
		r.start("B", "ofdsetlkw b r 0 1")
		r.do("A", "close a")
		r.finish("B")
		r.do("A", "open a $D/f")
		r.do("A", "flock a ex")
		r.start("B", "flock b sh")
		r.do("A", "flock a un")
		r.finish("B")
	}, []string{"B: setlkw b w 5 1 -> (waiting)", "B: setlkw b w 0 10 -> err EDEADLK", "B: ofdsetlkw b r 0 1 -> (waiting)", "B: flock b sh -> (waiting)", "B: ... -> ok"}},

	{"eintr", func(r *lockRun) {
		r.do("A", "open a $D/f")
		r.do("B", "open b $D/f")
		r.do("A", "setlk a w 0 0")
		r.do("A", "ofdsetlk a w 0 0")
		r.do("A", "flock a ex")
		r.do("B", "alarm 2000") // well past the 300 ms a wait is watched, even on a loaded machine
		r.start("B", "setlkw b r 0 1")
		r.finish("B")
		r.do("B", "alarm 2000") // well past the 300 ms a wait is watched, even on a loaded machine
		r.start("B", "ofdsetlkw b r 0 1")
		r.finish("B")
		r.do("B", "alarm 2000") // well past the 300 ms a wait is watched, even on a loaded machine
		r.start("B", "flock b sh")
		r.finish("B")
		r.do("B", "alarm 2000") // well past the 300 ms a wait is watched, even on a loaded machine
		r.start("B", "lockf b lock 0")
		r.finish("B")
		r.do("B", "getlk b w 0 0") // the interrupted waits left nothing behind
		r.do("A", "close a")
		r.do("B", "setlk b w 0 0")
		r.do("B", "flock b exnb")
	}, []string{"B: setlkw b r 0 1 -> (waiting)", "B: ... -> err EINTR", "B: setlk b w 0 0 -> ok", "B: flock b exnb -> ok"}},
}

// runLocks runs a scenario on dir and returns its transcript.
func runLocks(t *testing.T, dir string, s lockScenario) []string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("0123456789abcdef"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "f"), 0o666); err != nil {
		t.Fatal(err)
	}
	r := &lockRun{t: t, dir: dir, procs: map[string]*lockProc{}}
	s.run(r)
	for _, p := range r.procs {
		p.in.Close()
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("helper %s: %v", p.name, err)
		}
	}
	return r.log
}

// lockStacks are the stacks the lock scenarios run through: passthrough
// (null) and two that change data (crypt, zstd).
var lockStacks = []struct {
	name string
	new  func(t *testing.T, lower string) layer.FS
}{
	{"null", func(t *testing.T, lower string) layer.FS {
		return null.New(newLocal(t, lower))
	}},
	{"crypt", func(t *testing.T, lower string) layer.FS { return newCrypt(t, newLocal(t, lower)) }},
	{"zstd", func(t *testing.T, lower string) layer.FS {
		fs, err := codec.New(newLocal(t, lower), "zstd", codec.Options{Level: 1})
		if err != nil {
			t.Fatal(err)
		}
		return fs
	}},
}

func newLocal(t *testing.T, dir string) *local.FS {
	t.Helper()
	l, err := local.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestLocksLikeExt4 runs every lock scenario on ext4 and through the null,
// crypt and zstd stacks, with processes of root and of another user.
func TestLocksLikeExt4(t *testing.T) {
	mounttest.NeedRoot(t)
	helperBinary(t)
	plain := t.TempDir()
	os.Chmod(plain, 0o777)
	os.Chmod(filepath.Dir(plain), 0o755)
	oracle := map[string][]string{}
	for _, s := range lockScenarios {
		got := runLocks(t, plain, s)
		text := strings.Join(got, "\n")
		for _, w := range s.want {
			if !strings.Contains(text, w) {
				t.Fatalf("%s on ext4: transcript lacks %q:\n%s", s.name, w, text)
			}
		}
		oracle[s.name] = got
	}
	for _, st := range lockStacks {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			lower := t.TempDir()
			os.Chmod(lower, 0o777)
			top := st.new(t, lower)
			t.Cleanup(func() { layer.CloseStack(top) })
			m := mounttest.Mount(t, top)
			os.Chmod(m.Dir, 0o777)
			for _, s := range lockScenarios {
				t.Run(s.name, func(t *testing.T) {
					got := runLocks(t, m.Dir, s)
					if diff := transcriptDiff(oracle[s.name], got); diff != "" {
						t.Errorf("locks differ from ext4 (- ext4, + %s):\n%s", st.name, diff)
					}
				})
			}
		})
	}
}

// transcriptDiff shows two transcripts line by line where they differ.
func transcriptDiff(want, got []string) string {
	var b strings.Builder
	differ := false
	for i := 0; i < len(want) || i < len(got); i++ {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w == g {
			b.WriteString("  " + w + "\n")
			continue
		}
		differ = true
		b.WriteString("- " + w + "\n+ " + g + "\n")
	}
	if !differ {
		return ""
	}
	return b.String()
}
