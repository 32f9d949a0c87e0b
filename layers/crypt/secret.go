package crypt

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"

	"golang.org/x/term"
)

// Secrets: a passphrase (or a master key) comes from a file, from a
// command's output, or from the terminal. Only the first line counts.

// ReadPassfile returns the first line of a file.
func ReadPassfile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the passphrase file: %w", err)
	}
	line := firstLine(b)
	if len(line) == 0 {
		return nil, fmt.Errorf("the passphrase file %s is empty", path)
	}
	return line, nil
}

// RunExtpass runs a command with sh -c and returns the first line of its
// output. Its standard error goes to ours; its output is never shown.
func RunExtpass(command string) ([]byte, error) {
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Stdin, cmd.Stderr = os.Stdin, os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("the passphrase command (extpass) failed: %v", err)
	}
	line := firstLine(out)
	if len(line) == 0 {
		return nil, errors.New("the passphrase command (extpass) printed nothing")
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
	case ask:
		return Prompt(what, confirm)
	}
	return nil, fmt.Errorf("no %s: set the option passfile or extpass, or mount with 'cairn mount' from a terminal", what)
}
