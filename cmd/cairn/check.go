package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"cairnfs.dev/cairn/layer"
	"cairnfs.dev/cairn/spec"
)

func init() {
	register(&command{name: "check", args: "[flags] SPEC [MOUNTPOINT]",
		summary: "check a spec; report every mistake", run: func(a []string) int { return runCheck(a, os.Stdout, os.Stderr) }})
}

func runCheck(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("check", flag.ContinueOnError)
	fl.SetOutput(stderr)
	quiet := fl.Bool("q", false, "print nothing when the spec is good")
	nonempty := fl.Bool("nonempty", false, "with MOUNTPOINT: a directory that holds files will do (as mount -nonempty)")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn check [-q] SPEC [MOUNTPOINT]

Checks SPEC (a spec file or the inline form, such as 'null:/srv/data') as
'cairn mount' would before mounting: syntax, layer types and options, names,
lowers, cycles, directories. With MOUNTPOINT it also checks that the stack can
be mounted there now, as mount does: a directory, empty (unless -nonempty), with
nothing mounted on it (not even a dead mount). Every mistake is reported, each
with file:line:column.
Exits 0 if the spec is good, 3 if not, 2 on a bad command line.

Flags:
`)
		fl.PrintDefaults()
	}
	if code, ok := parseArgs(fl, args); !ok {
		return code
	}
	if fl.NArg() < 1 || fl.NArg() > 2 {
		fl.Usage()
		return exitUsage
	}
	s, err := loadSpec(fl.Arg(0))
	if err == nil && fl.NArg() == 2 {
		err = s.CheckMountpoint(fl.Arg(1))
		if err == nil {
			err = mountpointDir(fl.Arg(1)) // what cairn mount refuses, check refuses
		}
		if err == nil {
			err = checkMountpointFree(fl.Arg(1), *nonempty)
		}
	}
	if err != nil {
		return specFailed(stderr, fl.Arg(0), err)
	}
	if !*quiet {
		fmt.Fprintf(stdout, "%s: ok: %s, mounts %q\n", specName(s), plural(len(s.Layers), "layer"), s.Mount)
	}
	return exitOK
}

// specFailed prints a spec's errors with their lines and a count.
func specFailed(w io.Writer, arg string, err error) int {
	fmt.Fprintln(w, spec.Detail(err))
	if n := spec.Count(err); n > 1 {
		fmt.Fprintf(w, "%d errors\n", n)
	}
	if errors.Is(err, layer.ErrWrongSecret) {
		return exitSecret
	}
	return exitSpec
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func specName(s *spec.Spec) string {
	if s.Inline != "" {
		return "inline spec"
	}
	return s.File
}
