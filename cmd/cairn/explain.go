package main

import (
	"flag"
	"fmt"
	"io"
	"os"
)

func init() {
	register(&command{name: "explain", args: "[--toml] SPEC",
		summary: "show a stack as a tree: what each layer changes", run: func(a []string) int { return runExplain(a, os.Stdout, os.Stderr) }})
}

func runExplain(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("explain", flag.ContinueOnError)
	fl.SetOutput(stderr)
	asTOML := fl.Bool("toml", false, "print the spec as a spec file (turns the inline form into a file)")
	reveal := fl.Bool("reveal", false, "with --toml, print secret options instead of masking them")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn explain [--toml [--reveal]] SPEC

Prints the stack that SPEC (a spec file or the inline form) describes as a
tree, the mounted layer at the top: each layer's type, what it changes (names,
data, attributes, placement), whether files under it can get kernel
passthrough, its options (secrets masked, defaults marked) and its rules.
With --toml it prints the equivalent spec file instead.

Flags:
`)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() != 1 {
		fl.Usage()
		return exitUsage
	}
	s, err := loadSpec(fl.Arg(0))
	if err != nil {
		return specFailed(stderr, fl.Arg(0), err)
	}
	if *asTOML {
		fmt.Fprint(stdout, s.TOML(*reveal))
		return exitOK
	}
	s.Explain(stdout)
	return exitOK
}
