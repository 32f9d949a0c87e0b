package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"cairnfs.dev/cairn/layer"
)

func init() {
	register(&command{name: "resync", args: "[--full] SPEC",
		summary: "bring a stack's degraded replicas back in step",
		run:     func(a []string) int { return runResync(a, os.Stdout, os.Stderr) }})
}

func runResync(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("resync", flag.ContinueOnError)
	fl.SetOutput(stderr)
	full := fl.Bool("full", false, "compare every object of every replica (contents by hash), not only what the dirty log marks, with a progress bar; makes replicas that are not one set (different trees at a first mount) copies of the first")
	fl.Usage = func() {
		fmt.Fprintf(fl.Output(), `Usage: cairn resync [--full] SPEC

Brings the replicas of every replica layer of the stack SPEC back in step:
each degraded replica (one that failed, or missed changes while another
was mounted without it) gets from the first healthy replica what changed
while it was away, as the dirty log on the healthy replicas records it,
verified by size, modification time and a hash of the contents. Only what
changed is copied. A replica changed outside cairn since its last clean
unmount (found here first, or by a mount) is compared in full instead. A resync that stops (a crash, ^C) resumes where it
stopped when run again. It refuses a stack that is mounted: unmount it
first.

Exit codes:
  0  every replica is in step
  1  the resync failed (see the message)
  2  bad command line
  3  the spec is invalid
  5  the stack is in use (mounted)

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
	stack, err := s.Build()
	if err != nil {
		return specFailed(stderr, fl.Arg(0), err)
	}
	defer stack.Close()
	var rs []layer.Resyncer
	layer.Walk(stack.Top, func(l layer.FS) {
		if r, ok := l.(layer.Resyncer); ok {
			rs = append(rs, r)
		}
	})
	if len(rs) == 0 {
		fmt.Fprintf(stdout, "%s: no replica layer in this stack: nothing to resync\n", fl.Arg(0))
		return exitOK
	}
	ctx := context.Background()
	for _, r := range rs {
		var bar *progress
		sum, err := r.Resync(ctx, *full, func(done, total int64) {
			if total == 0 {
				return
			}
			if bar == nil {
				bar = newProgress(stderr, "resync", "objects", total, 0)
			}
			bar.update(done, 0, "")
		})
		if bar != nil {
			bar.done()
		}
		if err != nil {
			fmt.Fprintf(stderr, "cairn resync: %s: %v\n", fl.Arg(0), err)
			if errors.Is(err, layer.ErrInUse) {
				return exitBusy
			}
			return exitFailed
		}
		fmt.Fprintln(stdout, sum)
	}
	return exitOK
}
