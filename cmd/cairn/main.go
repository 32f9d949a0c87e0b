// Command cairn mounts stacks of file-system layers.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"cairnfs.dev/cairn/spec"
)

// Exit codes, documented in `cairn help`.
const (
	exitOK      = 0
	exitFailed  = 1 // the operation failed
	exitUsage   = 2 // bad command line
	exitSpec    = 3 // the spec is invalid
	exitMount   = 4 // the mount could not be made
	exitBusy    = 5 // the stack is in use (fsck or passwd of a mounted stack)
	exitSecret  = 7 // wrong passphrase or key
	exitUnknown = exitFailed
)

// Version is set at build time with -ldflags "-X main.Version=...".
var Version = "0.1.0-dev"

type command struct {
	name    string
	args    string
	summary string
	run     func(args []string) int
}

var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

// usageError is a command-line mistake: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(f string, a ...any) error { return usageError{fmt.Sprintf(f, a...)} }

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		printHelp(os.Stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return c.run([]string{"--help"})
			}
		}
		printHelp(os.Stdout)
		return exitOK
	case "-v", "--version":
		args[0] = "version"
	}
	c, ok := commands[args[0]]
	if !ok {
		var names []string
		for n := range commands {
			names = append(names, n)
		}
		fmt.Fprintf(os.Stderr, "cairn: unknown command %q%s; run 'cairn help' for the list\n", args[0], spec.DidYouMean(args[0], names))
		return exitUsage
	}
	return c.run(args[1:])
}

func printHelp(w *os.File) {
	fmt.Fprintf(w, `cairn: stackable file systems (null, snoop, acl, crypt, codecs, union, ...) over any directory.

Usage: cairn COMMAND [flags] [args]

Commands:
`)
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c := commands[n]
		fmt.Fprintf(w, "  %-8s %-28s %s\n", c.name, c.args, c.summary)
	}
	fmt.Fprintf(w, `
Run 'cairn COMMAND --help' for a command's flags.

A SPEC is a TOML file that says which layers stack over what:

    mount = "top"

    [layer.base]
    type = "local"
    path = "/srv/data"

    [layer.top]
    type = "null"
    over = "base"

or, for a chain of layers over one directory, inline: 'null:/srv/data'.
'cairn check SPEC' finds its mistakes; docs/spec.md is the reference.

Exit codes:
  0  success
  1  the operation failed (see the message)
  2  bad command line
  3  the spec is invalid
  4  the mount could not be made
  5  the stack is in use (fsck or passwd of a mounted stack)
  6  fsck --repair --force dropped data (kept in lost+found; see cairn fsck -h)
  7  wrong passphrase or key (mount, fsck, passwd alike)
`)
}

// fail prints err and returns the exit code that fits it.
func fail(err error, code int) int {
	var u usageError
	if errors.As(err, &u) {
		code = exitUsage
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "cairn") {
		msg = "cairn: " + msg
	}
	fmt.Fprintln(os.Stderr, msg)
	return code
}

func init() {
	register(&command{name: "version", summary: "print the version", run: func([]string) int {
		fmt.Println("cairn", Version)
		return exitOK
	}})
}

// parseArgs parses the flags (see parseFlags); after --help or a bad
// command line it returns the exit code and false.
func parseArgs(fl *flag.FlagSet, args []string) (int, bool) {
	if err := parseFlags(fl, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK, false
		}
		return exitUsage, false
	}
	return exitOK, true
}

// parseFlags parses flags wherever they appear among the arguments
// (`cairn explain SPEC --toml` as well as `cairn explain --toml SPEC`);
// after "--" everything is positional. The positional arguments are left in
// fl.Args().
func parseFlags(fl *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fl.Parse(args); err != nil {
			return err
		}
		rest := fl.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return fl.Parse(append([]string{"--"}, pos...))
}
