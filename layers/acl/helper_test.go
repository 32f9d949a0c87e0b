//go:build linux

package acl_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"cairnfs.dev/cairn/internal/mounttest"
)

// The test binary doubles as a helper process that runs as another user and
// keeps a descriptor (and a mapping) open across steps of a test: it reads
// commands on stdin and answers each with one line, "ok [DATA]" or
// "err ERRNO".
const helperEnv = "CAIRN_ACL_HELPER"

// init locks the helper's main goroutine to the main thread (LockOSThread in
// an init function does that; in TestMain it locks whichever thread the
// goroutine is on by then), so that the thread "comm" renames is the one
// /proc/PID/task/PID shows, and the one every request comes from.
func init() {
	if os.Getenv(helperEnv) != "" {
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		helper()
		return
	}
	code := m.Run()
	if helperBin.path != "" {
		os.RemoveAll(filepath.Dir(helperBin.path))
	}
	os.Exit(code)
}

func helper() {
	// The helper changes into its directory itself, after exec: see
	// startHelper.
	if err := os.Chdir(os.Getenv(helperEnv)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// One thread: "comm" renames the thread (prctl), and the requests
	// that follow must come from it.
	runtime.LockOSThread()
	var f *os.File
	var mem []byte
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		w := strings.Fields(in.Text())
		arg := func(i int) int { n, _ := strconv.Atoi(w[i]); return n }
		var err error
		out := ""
		switch w[0] {
		case "open": // open PATH FLAGS
			f, err = os.OpenFile(w[1], arg(2), 0)
		case "read": // read OFF N
			b := make([]byte, arg(2))
			var n int
			n, err = f.ReadAt(b, int64(arg(1)))
			if err == io.EOF {
				err = nil
			}
			out = string(b[:n])
		case "write": // write OFF DATA
			_, err = f.WriteAt([]byte(w[2]), int64(arg(1)))
		case "mmap": // mmap LEN
			mem, err = unix.Mmap(int(f.Fd()), 0, arg(1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		case "mset": // mset OFF DATA
			err = mset(mem[arg(1):], w[2])
		case "msync":
			err = unix.Msync(mem, unix.MS_SYNC)
		case "comm": // comm NAME: the process name, as prctl(PR_SET_NAME) sets it
			b := append([]byte(w[1]), 0)
			err = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0)
		case "cat": // cat PATH: open, read all, close
			var b []byte
			b, err = os.ReadFile(w[1])
			out = strings.TrimSpace(string(b))
		case "pid":
			out = strconv.Itoa(os.Getpid())
		case "rename2": // rename2 FROM TO FLAGS (renameat2)
			err = unix.Renameat2(unix.AT_FDCWD, w[1], unix.AT_FDCWD, w[2], uint(arg(3)))
		}
		if e, ok := err.(*os.PathError); ok {
			err = e.Err
		}
		if e, ok := err.(syscall.Errno); ok {
			fmt.Printf("err %s\n", unix.ErrnoName(e))
		} else if err != nil {
			fmt.Printf("err %v\n", err)
		} else {
			fmt.Printf("ok %s\n", out)
		}
	}
}

var helperBin struct {
	once sync.Once
	path string
	err  error
}

// helperPath copies the test binary where other users can run it.
func helperPath(t *testing.T) string {
	helperBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "cairn-acl-helper-")
		if err != nil {
			helperBin.err = err
			return
		}
		os.Chmod(dir, 0o755)
		b, err := os.ReadFile(os.Args[0])
		if err == nil {
			helperBin.path = filepath.Join(dir, "helper")
			err = os.WriteFile(helperBin.path, b, 0o755)
		}
		helperBin.err = err
	})
	if helperBin.err != nil {
		t.Fatal(helperBin.err)
	}
	return helperBin.path
}

// proc is a running helper.
type proc struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Reader
}

func startHelper(t *testing.T, u mounttest.User, dir string) *proc {
	cmd := u.Command(helperPath(t))
	// Not cmd.Dir: a chdir between fork and exec into a mount that this
	// very process serves can hang (the child holds a copy of the FUSE
	// descriptor and waits for its own parent). The helper chdirs itself.
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return &proc{t, in, bufio.NewReader(out)}
}

// do sends one command and returns the answer.
func (p *proc) do(cmd string) string {
	fmt.Fprintln(p.in, cmd)
	line, err := p.out.ReadString('\n')
	if err != nil {
		p.t.Fatalf("helper: %v", err)
	}
	return strings.TrimSpace(line)
}

// mset writes to a mapping; a page the file system refuses to read is a
// SIGBUS, reported as an error.
func mset(mem []byte, s string) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			err = errors.New("SIGBUS")
		}
	}()
	copy(mem, s)
	return nil
}
