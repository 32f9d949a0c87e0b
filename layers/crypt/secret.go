package crypt

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"

	"golang.org/x/sys/unix"
	"golang.org/x/term"
)

// Secrets: a passphrase (or a master key) comes from a file, from a
// command's output, or from the terminal. Only the first line counts.

// MaxSecret is the most bytes read from a passphrase file or command: a
// first line longer than that is refused (so that /dev/zero or a runaway
// command cannot exhaust memory).
const MaxSecret = 4 << 10

// readLine reads the first line of r, at most MaxSecret bytes of it; more
// says that r was not read to its end.
func readLine(r io.Reader) (line []byte, ok, more bool, err error) {
	b := make([]byte, MaxSecret+1)
	n, err := io.ReadFull(r, b)
	more = err == nil
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		err = nil
	}
	b = b[:n]
	defer clear(b)
	if err != nil {
		return nil, false, more, err
	}
	if i := bytes.IndexByte(b, '\n'); i < 0 && n > MaxSecret {
		return nil, false, more, nil
	}
	return bytes.Clone(firstLine(b)), true, more, nil
}

// ReadPassfile returns the first line of a file: a regular file, a pipe or
// a terminal (anything else, /dev/zero say, is refused).
func ReadPassfile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the passphrase file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("cannot read the passphrase file: %w", err)
	}
	switch m := fi.Mode(); {
	case m.IsRegular(), m&os.ModeNamedPipe != 0:
	case m&os.ModeCharDevice != 0 && term.IsTerminal(int(f.Fd())):
	default:
		return nil, fmt.Errorf("the passphrase file %s is not a regular file, a pipe or a terminal (it is a %s)", path, fileKind(m))
	}
	line, ok, _, err := readLine(f)
	if err != nil {
		return nil, fmt.Errorf("cannot read the passphrase file: %w", err)
	}
	if !ok {
		return nil, fmt.Errorf("the first line of the passphrase file %s is longer than %d bytes", path, MaxSecret)
	}
	if len(line) == 0 {
		return nil, fmt.Errorf("the passphrase file %s is empty", path)
	}
	return line, nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeDir != 0:
		return "directory"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	case m&os.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// RunExtpass runs a command with sh -c and returns the first line of its
// output (at most MaxSecret bytes). Its standard error goes to ours; its
// output is never shown.
func RunExtpass(command string) ([]byte, error) {
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("the passphrase command (extpass) failed: %v", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("the passphrase command (extpass) failed: %v", err)
	}
	line, ok, more, rerr := readLine(out)
	if more {
		// The rest is not read: the command is stopped, and its exit
		// status does not count.
		cmd.Process.Kill()
	}
	out.Close()
	err = cmd.Wait()
	if more {
		err = nil
	}
	switch {
	case rerr != nil:
		return nil, fmt.Errorf("the passphrase command (extpass) failed: %v", rerr)
	case !ok:
		return nil, fmt.Errorf("the passphrase command (extpass) printed a first line longer than %d bytes", MaxSecret)
	case err != nil:
		clear(line)
		return nil, fmt.Errorf("the passphrase command (extpass) failed: %v", err)
	case len(line) == 0:
		return nil, errors.New("the passphrase command (extpass) printed nothing")
	}
	return line, nil
}

// stdinIsData reports a standard input that is a pipe or a file (echo pass
// | cairn mount ...): the secret is read from it, once, instead of asking.
func stdinIsData() bool {
	fi, err := os.Stdin.Stat()
	return err == nil && (fi.Mode()&os.ModeNamedPipe != 0 || fi.Mode().IsRegular())
}

// readStdin reads the secret from the next line of standard input, a byte
// at a time so that the rest stays unread: cairn passwd reads the current
// passphrase from the first line and the new one from the second.
func readStdin(what string) ([]byte, error) {
	var line []byte
	b := make([]byte, 1)
	for {
		n, err := os.Stdin.Read(b)
		if n == 1 && b[0] == '\n' {
			break
		}
		if n == 1 {
			if len(line) == MaxSecret {
				clear(line)
				return nil, fmt.Errorf("a line of standard input is longer than %d bytes", MaxSecret)
			}
			line = append(line, b[0])
			continue
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			clear(line)
			return nil, fmt.Errorf("cannot read the %s from standard input: %w", what, err)
		}
	}
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		return nil, fmt.Errorf("no %s: standard input has no line for it (give it on a line of its own, or use a passphrase file)", what)
	}
	return line, nil
}

// Prompt asks on the terminal without echo; with confirm, twice.
func Prompt(what string, confirm bool) ([]byte, error) {
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("no %s: there is no terminal to ask on (give a passphrase file or command)", what)
	}
	defer tty.Close()
	ask := func(prompt string) ([]byte, error) {
		fmt.Fprintf(tty, "%s: ", prompt)
		b, err := term.ReadPassword(int(tty.Fd()))
		fmt.Fprintln(tty)
		if err != nil {
			return nil, fmt.Errorf("cannot read the %s from the terminal: %v", what, err)
		}
		return b, nil
	}
	b, err := ask(capitalize(what))
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("empty %s", what)
	}
	if confirm {
		again, err := ask("Repeat the " + what)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(b, again) {
			return nil, fmt.Errorf("the two %ss differ", what)
		}
	}
	return b, nil
}

func capitalize(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}

func firstLine(b []byte) []byte {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	return bytes.TrimSuffix(b, []byte("\r"))
}

// GetSecret obtains a secret from passfile, extpass, or (if ask) the
// terminal.
func GetSecret(passfile, extpass, what string, ask, confirm bool) ([]byte, error) {
	switch {
	case passfile != "" && extpass != "":
		return nil, errors.New("give either a passphrase file or a passphrase command, not both")
	case passfile != "":
		return ReadPassfile(passfile)
	case extpass != "":
		return RunExtpass(extpass)
	case ask && stdinIsData():
		return readStdin(what)
	case ask:
		return Prompt(what, confirm)
	}
	return nil, fmt.Errorf("no %s: set the option passfile or extpass, or mount with 'cairn mount' from a terminal", what)
}

// Keys in memory. The raw keys of a volume live in pages of their own,
// locked into memory (mlock, so they do not reach swap) when the process's
// RLIMIT_MEMLOCK allows, and excluded from core dumps (MADV_DONTDUMP); the
// process is also made non-dumpable (PR_SET_DUMPABLE 0: no core dump, no
// ptrace by other processes of the same user). The ciphers' expanded key
// schedules are on the Go heap, which these calls do not cover
// (docs/crypt.md).

var keyMem struct {
	sync.Mutex
	page   []byte // the current page; keys are carved from it
	used   int
	locked int // bytes locked so far
}

// maxLocked bounds the memory the layer locks (a few volumes' keys).
const maxLocked = 64 << 10

// keep moves a key into protected memory and clears the original.
func keep(k []byte) []byte {
	keyMem.Lock()
	defer keyMem.Unlock()
	if keyMem.used+len(k) > len(keyMem.page) {
		size := max(4096, (len(k)+4095)&^4095)
		b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			// No mapping: the key stays on the heap.
			return k
		}
		adviseNoDump(b)
		if keyMem.locked+size <= maxLocked && unix.Mlock(b) == nil {
			keyMem.locked += size
		}
		keyMem.page, keyMem.used = b, 0
	}
	d := keyMem.page[keyMem.used : keyMem.used+len(k) : keyMem.used+len(k)]
	keyMem.used += len(k)
	copy(d, k)
	clear(k)
	return d
}
